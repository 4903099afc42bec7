"""The hybrid allocators' page pools when freed blocks stay cached (`engines.hybrid_prefix`).

A cached block no sequence references any more is *parked*: it keeps its memory, so a later
request with the same prefix can take it back, but any allocation may evict it (paged-prefix's
rule: parked blocks count as free). What evicting one gives back depends on the layout:

- `CachingEqualPages` (vLLM): a block of group g is m_g whole pages, so evicting any parked block
  frees m_g pages for anyone. Room = free pages + the pages of every parked block; an
  allocation takes free pages first and evicts the least recently parked blocks until enough
  pages are free.
- `CachingLcmPages` (Jenga): a page holds blocks of one group only, and returns to the shared
  pool only once none of its blocks is referenced or parked. A page with a referenced block is
  *live*; one with parked blocks and none referenced is *idle*. A block of group g comes, in this
  order, from a spare index of a live page of g, a free page split, a parked block of a live page
  of g (the least recently parked: evicted, its index reused), or the idle page (of any group)
  holding the least recently parked block, all its parked blocks evicted and the page split. So
  cached K/V is dropped only when no free page is left, and then a live page's own parked block
  before a whole page of someone else's. Admission replays that order on counts (spare and
  parked indices of live pages per group, free and idle pages), group by group, after the hits
  have taken their parked blocks back (one in an idle page makes the page live): exact, since
  every step takes whole counts and all idle pages are worth the same.

    page 0 (live, group 0)   [ held | parked | spare ]   room for group 0 only; the spare is overhead
    page 1 (idle, group 1)   [ parked | spare | spare ]  a page for anyone, once its block is evicted
    page 2 (free)

Occupancy: a parked block and an idle page are `free` (any allocation may take them, as in
`paged-prefix`); the spare indices of live pages stay `allocator_overhead`.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence as Seq

from engines.hybrid import EqualPages, LcmPages

# one admission's step: (new blocks of each group, the parked (group, block)s its hits take back)
Phase = tuple[Seq[int], Seq[tuple[int, int]]]


class CachingEqualPages(EqualPages):
    """`EqualPages` whose blocks may be parked (cached, unreferenced): their pages count as room."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.parked_pages = 0  # pages of parked blocks

    def park(self, group: int, block: int) -> None:
        self.parked_pages += self.multiple[group]

    def revive(self, group: int, block: int) -> None:
        self.parked_pages -= self.multiple[group]

    def evict(self, group: int, block: int) -> None:
        self.parked_pages -= self.multiple[group]
        self.release(group, block)

    def fits(self, need: Seq[int], reserve: int) -> bool:
        return self.admits([(need, ())], reserve)

    def admits(self, phases: Seq[Phase], reserve: int) -> bool:
        """Room for each phase in turn: hits take back their parked blocks ((group, block)), whose
        pages stop being room, then `need[g]` new blocks of each group g."""
        pages = sum(
            self.pages_for(need) + sum(self.multiple[g] for g, _ in revive) for need, revive in phases
        )
        return pages <= len(self.free) + self.parked_pages - reserve

    def victims(self, group: int, oldest: Iterator[int]) -> list[int]:
        """Parked blocks to evict, oldest first, so that a block of `group` finds its pages free."""
        short, out = self.multiple[group] - len(self.free), []
        for block in oldest:
            if short <= 0:
                break
            out.append(block)
            short -= len(self._pages[block])
        return out

    def check_parked(self, parked: dict[int, int]) -> None:
        """`parked`: block -> group of every parked block."""
        assert self.parked_pages == sum(self.multiple[g] for g in parked.values()), "parked pages"


class CachingLcmPages(LcmPages):
    """`LcmPages` with parked blocks, live and idle pages; see the module docstring."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[int, int] = {}  # page in use -> its referenced blocks
        self._parked: dict[int, set[int]] = {}  # page in use -> indices of its parked blocks
        self.idle: set[int] = set()  # pages with parked blocks and none referenced
        self._live_spare = [0] * len(self.shapes)  # spare indices in live pages, per group
        self._live_parked = [0] * len(self.shapes)  # parked indices in live pages, per group

    # --- bookkeeping: a live page's indices count in its group's totals ---------------------------
    def _count(self, page: int, sign: int) -> None:
        if self._held.get(page, 0):
            group = self._owner[page]
            self._live_spare[group] += sign * len(self._spare[group].get(page, ()))
            self._live_parked[group] += sign * len(self._parked.get(page, ()))

    def _settle(self, page: int) -> None:
        """After a change: idle if it holds only parked blocks (an empty page went back in `release`)."""
        if self._held.get(page, 0) or page not in self._owner:
            self.idle.discard(page)
        elif self._parked.get(page):
            self.idle.add(page)

    def take(self, group: int) -> int:
        """A spare index of a live page of `group` (lowest page), else a free page split."""
        live = [page for page in self._spare[group] if self._held.get(page, 0)]
        if live:
            page = min(live)
            self._count(page, -1)
            index = self._spare[group][page].pop(0)
            if not self._spare[group][page]:
                del self._spare[group][page]
            self._spare_count[group] -= 1
        else:
            assert self.free, "no room: evict first (`victims`)"
            page = self.free.popleft()
            self._owner[page] = group
            self._spare[group][page] = list(range(1, self.per_page[group]))
            self._spare_count[group] += self.per_page[group] - 1
            index = 0
            if not self._spare[group][page]:
                del self._spare[group][page]
        self._held[page] = self._held.get(page, 0) + 1
        self._count(page, +1)
        self._settle(page)
        return page * self.stride + index

    def release(self, group: int, block: int) -> None:
        """A referenced block freed (not cached): its index is spare."""
        page = block // self.stride
        self._count(page, -1)
        self._held[page] -= 1
        self._unheld(page)
        super().release(group, block)
        self._count(page, +1)
        self._settle(page)

    def park(self, group: int, block: int) -> None:
        page, index = divmod(block, self.stride)
        self._count(page, -1)
        self._held[page] -= 1
        self._unheld(page)
        self._parked.setdefault(page, set()).add(index)
        self._count(page, +1)
        self._settle(page)

    def revive(self, group: int, block: int) -> None:
        page, index = divmod(block, self.stride)
        self._count(page, -1)
        self._drop_parked(page, index)
        self._held[page] = self._held.get(page, 0) + 1
        self._count(page, +1)
        self._settle(page)

    def evict(self, group: int, block: int) -> None:
        page, index = divmod(block, self.stride)
        self._count(page, -1)
        self._drop_parked(page, index)
        super().release(group, block)  # an emptied page goes back to the pool
        self._count(page, +1)
        self._settle(page)

    def _unheld(self, page: int) -> None:
        if not self._held[page]:
            del self._held[page]

    def _drop_parked(self, page: int, index: int) -> None:
        self._parked[page].remove(index)
        if not self._parked[page]:
            del self._parked[page]

    # --- room ------------------------------------------------------------------------------------
    def spare_bytes(self) -> int:
        """Spare indices of live pages only: an idle page is room for anyone (`free`)."""
        return sum(n * self.block_bytes(g) for g, n in enumerate(self._live_spare))

    def fits(self, need: Seq[int], reserve: int) -> bool:
        return self.admits([(need, ())], reserve)

    def admits(self, phases: Seq[Phase], reserve: int) -> bool:
        """Room for each phase in turn, `reserve` pages (free or idle) left over: hits take back
        their parked blocks ((group, block)), then `need[g]` new blocks of each group g come as
        the module docstring's order takes them, replayed on counts."""
        spare, parked = list(self._live_spare), list(self._live_parked)
        free, idle = len(self.free), len(self.idle)
        woken: set[int] = set()
        for need, revive in phases:
            for group, block in revive:
                page = block // self.stride
                if page in self.idle and page not in woken:  # live now: its other indices are g's room
                    woken.add(page)
                    idle -= 1
                    spare[group] += len(self._spare[group].get(page, ()))
                    parked[group] += len(self._parked[page]) - 1
                else:
                    parked[group] -= 1
            for g, n in enumerate(need):
                k = self.per_page[g]
                used = min(n, spare[g])  # spare indices of live pages
                spare[g] -= used
                n -= used
                pages = min(-(-n // k), free)  # free pages split
                free -= pages
                spare[g] += pages * k - min(n, pages * k)
                n -= min(n, pages * k)
                used = min(n, parked[g])  # live pages' parked blocks evicted, their indices reused
                parked[g] -= used
                n -= used
                pages = -(-n // k)  # idle pages emptied and split
                if pages > idle:
                    return False
                idle -= pages
                spare[g] += pages * k - n
        return free + idle >= reserve

    def victims(self, group: int, oldest: Iterator[int]) -> list[int]:
        """Parked blocks to evict so that `take(group)` finds room, in the order of the docstring."""
        if self._live_spare[group] or self.free:
            return []
        for block in oldest:
            page = block // self.stride
            if self._live_parked[group]:  # the oldest parked block of a live page of the group
                if self._owner[page] == group and page not in self.idle:
                    return [block]
            elif page in self.idle:  # the idle page holding the oldest parked block: all of it
                return [page * self.stride + index for index in sorted(self._parked[page])]
        raise AssertionError(f"no room for a block of group {group}: admission let too much in")

    def check_parked(self, parked: dict[int, int]) -> None:
        """`parked`: block -> group of every parked block; the live and idle totals agree."""
        by_page: dict[int, set[int]] = {}
        for block in parked:
            page, index = divmod(block, self.stride)
            by_page.setdefault(page, set()).add(index)
        assert by_page == self._parked, "parked indices differ from the cache"
        held: dict[int, int] = {}
        for page, group in self._owner.items():
            count = self.per_page[group] - len(self._spare[group].get(page, ())) - len(by_page.get(page, ()))
            if count:
                held[page] = count
        assert held == self._held, "referenced blocks per page wrong"
        assert self.idle == {p for p in self._owner if p not in held}, "idle pages wrong"
        for g in range(len(self.shapes)):
            live = [p for p, owner in self._owner.items() if owner == g and p in held]
            assert self._live_spare[g] == sum(len(self._spare[g].get(p, ())) for p in live), "live spare"
            assert self._live_parked[g] == sum(len(by_page.get(p, ())) for p in live), "live parked"
