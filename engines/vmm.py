"""Virtual-memory allocation (vAttention): a contiguous virtual range per request, physical
pages mapped under it as it grows.

Each request is handed one of `max_requests` virtual ranges, each long enough for the model's
maximum length (virtual addresses are plentiful; physical memory is the budget). Physical
memory comes in pages of `page_tokens` slots, mapped at the end of a range when the sequence
needs the next one, so the K/V of a sequence stays contiguous in virtual memory and attention
kernels read it with no block table. A page is all the physical memory that holds those
tokens: with vAttention's layout (a virtual tensor per layer for K and one for V) one "page"
here is a driver page in each of the 2 x layers tensors (one latent tensor a layer for an MLA
model: `kvbench.vmm.pages`), so `page_tokens` is what one driver page holds of one layer.

Reclamation is deferred, as in vAttention: a finished request's range keeps its pages mapped,
and the next request given that range reuses them with no driver call. Pages mapped under
ranges nobody holds are *mapped idle*, their own occupancy category. When a sequence needs a
page and none is unmapped, an idle page is reclaimed (unmapped from its range and mapped
under the one that needs it). With `deferred=False` a finished request's pages are unmapped
at once.

Admission gives the free range that needs the fewest driver calls: the smallest that already
holds enough pages, else the largest (topped up); pages a range holds beyond what the request
needs now go back to the unmapped pool, so a sequence holds exactly the pages its tokens need,
as under paging. Page rounding (a last page beyond the final length) is internal
fragmentation. Physical memory not divisible into whole pages is unusable by anyone:
external fragmentation, as the tail past paged's last block is.

A page need not hold a whole number of tokens (OPT-13B's 10 KiB per token and layer: a 2 MiB
page holds 204.8), since a token may straddle two pages of the same range: `page_tokens` is a
fraction, n pages hold `floor(n x page_tokens)` whole tokens, and the fraction past the last
whole token is allocator overhead.

Mapping ahead (`--vmm-map ahead`) is an allocation: once a decode segment's length is known,
`look_ahead` gives each sequence of the batch the pages it reaches within another segment as
long (never past its final length) before the runner maps them while the device runs, so they
are held: reserved slots of that request, which no admission takes. Why: mapped ahead out of
memory the allocator still counted as its unmapped pool, they went to new requests and were
unmapped again before any step wrote them (OPT-13B on the H200,
results/reference/vmm-occupancy-real). The rule under pressure: a decoding sequence needing a
page takes its own reserved pages, then unmapped and idle ones, then another sequence's pages
reserved ahead and not yet reached (the range furthest ahead first): the lookahead gives way
to decode steps and never causes a preemption. Admission counts reserved pages as held (a
request waits for them as it waits for any running sequence's pages): they are at most one
segment's growth per sequence, memory its steps take soon anyway. A reservation takes only
pages above the watermark.

Nothing is shared: a request with several outputs holds a range per output from admission
(a fork copies the parent's K/V into the child's range), and preemption is by recompute
(`can_swap_out` is False).

Pages and ranges (page_tokens 4, 3 ranges of 2 pages, 5 physical pages)::

    range 0: virtual slots 0-7    maps pages [3, 0]   held by a sequence
    range 1: virtual slots 8-15   maps pages [4]      mapped idle (its request finished)
    range 2: virtual slots 16-23  maps pages []       free
    unmapped pool: [1, 2]
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Sequence as Seq
from fractions import Fraction

import numpy as np

from engines.allocator import Extent, SlotCopy
from kvbench.metrics.occupancy import Footprint, Growth
from kvbench.requests import Request
from kvbench.sequence import SeqGroup, Sequence, group_width, width_at_admission


class VirtualAllocator:
    """Virtual ranges with physical pages mapped on demand. See `KVAllocator`.

    `num_pages` pages of `page_tokens` slots (a fraction where a page does not hold whole
    tokens) fit in the `num_slots` budget; the caller computes both from bytes
    (`kvbench.vmm.pages`). `maps` and `unmaps` count the driver calls made so far (per page);
    `reused` counts pages a request found already mapped under its range.
    """

    def __init__(
        self, num_slots: int, page_tokens: int | Fraction, num_pages: int, max_len: int, max_requests: int,
        watermark: float = 0.01, deferred: bool = True, driver_pages: int = 1,
    ) -> None:  # fmt: skip
        page_tokens = Fraction(page_tokens)
        assert page_tokens > 0 and 0 <= num_pages * page_tokens <= num_slots, "pages exceed the budget"
        self.num_slots = num_slots
        self.page_tokens = page_tokens
        self._num, self._den = page_tokens.numerator, page_tokens.denominator
        self.num_pages = num_pages
        # a range starts on a page and on a token boundary: a multiple of `den` pages
        self.range_pages = -(-self.pages_for(max_len) // self._den) * self._den
        self.range_slots = self.capacity(self.range_pages)  # virtual slots per range
        self.max_requests = max_requests
        self.watermark_pages = int(watermark * num_pages)
        self.deferred = deferred
        self.maps = self.unmaps = self.reused = 0
        self.driver_pages = driver_pages  # driver pages per page (per-layer: 2 x layers; layers for MLA)
        self._grown_maps = 0  # of `maps`, those `grow` made (a segment's later steps: `map_plan` prices them)
        self._unmapped: deque[int] = deque(range(num_pages))
        self._mapped: list[list[int]] = [[] for _ in range(max_requests)]  # physical pages per range
        self._free_ranges: set[int] = set(range(max_requests))  # held by no sequence and no group
        self._idle = 0  # pages mapped under free ranges
        # (pages, range) of free ranges holding pages, for reclaiming from the fewest first; an
        # entry is stale once its range is held or its count changed (checked when popped)
        self._victims: list[tuple[int, int]] = []
        self._held = 0  # pages mapped under held ranges
        self._asked = 0  # whole slots the held ranges' pages hold
        self._target = 0  # sum over held ranges of min(final length, whole slots held)
        self._owner: dict[Sequence, int] = {}  # resident sequence -> its range
        self._pools: dict[SeqGroup, list[int]] = {}  # a group's ranges no member holds now
        self._resident: dict[SeqGroup, int] = {}  # members holding a range, per group
        self._grown: list[tuple[int, Sequence]] = []  # last grow's (step, sequence), in order
        # [max_requests] pages `look_ahead` reserved under each held range, at its top, that the
        # holder's tokens have not reached yet (bounded by what it holds past them when read)
        self._reserved = np.zeros(max_requests, dtype=np.int64)
        self.ahead_maps = self.ahead_unmaps = 0  # `look_ahead`'s: made while a segment runs
        self.ahead_lost = 0  # reserved pages another sequence's growth took before their holder used them

    @property
    def driver_calls(self) -> tuple[int, int]:
        """Driver pages mapped and unmapped so far when batches were made (a segment's growth
        left out: `map_plan` prices it step by step): what a batch's `mapped_pages` counts."""
        return (self.maps - self._grown_maps) * self.driver_pages, self.unmaps * self.driver_pages

    @property
    def driver_totals(self) -> tuple[int, int]:
        """Driver pages mapped and unmapped so far, growth included (steps.csv counts them)."""
        return self.maps * self.driver_pages, self.unmaps * self.driver_pages

    def map_plan(self, seqs: Seq[Sequence], num_steps: int) -> np.ndarray:
        """Driver pages each of a decode segment's `num_steps` steps maps as its sequences grow
        (`[num_steps]`; step 0's were mapped with the batch: 0), as `grow` takes them: after the
        run, or before it for a runner that allocates ahead (pages it grew are not held before)."""
        grown = Counter(seq for _, seq in self._grown)  # this segment's, when grown ahead
        computed = np.array([seq.num_computed for seq in seqs], dtype=np.int64)  # [B]
        held = [len(self._mapped[self._owner[seq]]) - grown[seq] for seq in seqs]  # [B] before this growth
        steps = np.arange(1, num_steps + 1)[:, None]  # [K, 1] steps run
        need = np.maximum(-(-(computed + steps) * self._den // self._num) - held, 0).sum(axis=1)  # [K]
        return np.diff(need, prepend=0) * self.driver_pages

    @property
    def virtual_slots(self) -> int:
        """Slots the ranges span together: what an arena emulating them must address."""
        return self.max_requests * self.range_slots

    # ------------------------------------------------------------------ capacity
    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens * self._den // self._num)

    def capacity(self, num_pages: int) -> int:
        """Whole tokens `num_pages` pages hold."""
        return num_pages * self._num // self._den

    @property
    def available_pages(self) -> int:
        """Pages an allocation can get now: unmapped ones, and idle ones it may reclaim."""
        return len(self._unmapped) + self._idle

    def can_ever_hold(self, request: Request) -> bool:
        width = group_width(request)
        pages = self.pages_for(request.kv_len) * width
        return (
            request.kv_len <= self.range_slots
            and width <= self.max_requests
            and pages <= self.num_pages - self.watermark_pages
        )

    def can_allocate(self, seq: Sequence) -> bool:
        width = width_at_admission(seq)
        ranges = 0 if self._pooled(seq) else width
        need = self.pages_for(seq.num_tokens) * width
        return len(self._free_ranges) >= ranges and self.available_pages - need >= self.watermark_pages

    def can_allocate_all(self, seqs: Seq[Sequence]) -> bool:
        need = sum([self.pages_for(seq.num_tokens) for seq in seqs])
        return len(self._free_ranges) >= len(seqs) and self.available_pages - need >= self.watermark_pages

    def _pooled(self, seq: Sequence) -> bool:
        """Whether `seq` comes back to a range its group kept (a preempted parallel sample)."""
        group = seq.group
        return group is not None and group.forked and bool(self._pools.get(group))

    # ------------------------------------------------------------------ admission and release
    def allocate(self, seq: Sequence) -> None:
        """A range for `seq` mapped up to its tokens; for a group's leader at admission, one for
        every member, each mapped for the prompt (the forks' copies land there)."""
        assert seq not in self._owner, f"seq {seq.seq_id} is already resident"
        need = self.pages_for(seq.num_tokens)
        if self._pooled(seq):
            r = self._pools[seq.group].pop()
            self._resize(r, need, seq.request)
            ranges = [r]
        else:
            ranges = [self._hold_range(need, seq.request) for _ in range(width_at_admission(seq))]
        self._owner[seq] = ranges[0]
        if seq.group is not None:
            self._pools.setdefault(seq.group, []).extend(reversed(ranges[1:]))  # popped in order
            self._resident[seq.group] = self._resident.get(seq.group, 0) + 1

    def _hold_range(self, need: int, request: Request) -> int:
        """Take the free range needing the fewest driver calls and map exactly `need` pages."""
        enough = [r for r in self._free_ranges if len(self._mapped[r]) >= need]
        if enough:
            r = min(enough, key=lambda r: (len(self._mapped[r]), r))
        else:
            r = max(self._free_ranges, key=lambda r: (len(self._mapped[r]), -r))
        self._free_ranges.remove(r)
        kept = len(self._mapped[r])
        self._idle -= kept
        self.reused += min(kept, need)
        self._held += kept  # held from now on; `_resize` adds or unmaps the difference
        self._asked += self.capacity(kept)
        self._target += self._target_of(request, kept)
        self._resize(r, need, request)
        return r

    def _resize(self, r: int, need: int, request: Request) -> None:
        """Map exactly `need` pages under held range `r`: more are unmapped (the last first),
        fewer are topped up."""
        pages = self._mapped[r]
        before = len(pages)
        self._reserved[r] = 0  # a range (re)assigned or emptied: nothing of it is ahead any more
        while len(pages) > need:
            self._unmapped.append(pages.pop())
            self.unmaps += 1
        while len(pages) < need:
            pages.append(self._take_page())
        self._held += need - before
        self._asked += self.capacity(need) - self.capacity(before)
        self._target += self._target_of(request, need) - self._target_of(request, before)

    def fork(self, parent: Sequence, child: Sequence) -> list[SlotCopy]:
        """Give `child` a range of the group's pool, mapped for the parent's K/V, which is copied
        into it (the prompt's pages were mapped at admission; a beam re-forked from another maps
        the pages a pruned beam just gave back)."""
        assert child not in self._owner, f"seq {child.seq_id} is already resident"
        r = self._pools[child.group].pop()
        need = self.pages_for(parent.num_computed)
        assert need - len(self._mapped[r]) <= self.available_pages + self._spare(), (
            "no page for a fork's copy"
        )
        self._resize(r, max(need, len(self._mapped[r])), child.request)
        self._owner[child] = r
        self._resident[child.group] += 1
        return [(self._owner[parent] * self.range_slots, r * self.range_slots, parent.num_computed)]

    def free(self, seq: Sequence) -> None:
        r = self._owner.pop(seq)
        group = seq.group
        if group is None:
            self._release_range(r, seq.request)
            return
        self._resident[group] -= 1
        if self._resident[group]:  # the group keeps the range for a re-fork or a comeback, not its pages
            self._resize(r, 0, seq.request)
            self._pools[group].append(r)
            return
        del self._resident[group]  # the group's last member: every range goes
        for pooled in [r, *self._pools.pop(group)]:
            self._release_range(pooled, seq.request)

    def _release_range(self, r: int, request: Request) -> None:
        pages = self._mapped[r]
        self._reserved[r] = 0
        self._held -= len(pages)
        self._asked -= self.capacity(len(pages))
        self._target -= self._target_of(request, len(pages))
        self._free_ranges.add(r)
        if self.deferred:
            self._idle += len(pages)
            if pages:
                heapq.heappush(self._victims, (len(pages), r))
            return
        while pages:
            self._unmapped.append(pages.pop())
            self.unmaps += 1

    # ------------------------------------------------------------------ growth
    def can_append(self, seq: Sequence) -> bool:
        short = self.pages_for(seq.num_tokens) - len(self._mapped[self._owner[seq]])
        # others' reserved pages counted only when needed: `_spare` walks the running sequences
        return short <= self.available_pages or short <= self.available_pages + self._spare()

    def append(self, seq: Sequence) -> list[tuple[int, int]]:
        pages = self._mapped[self._owner[seq]]
        need = self.pages_for(seq.num_tokens)
        if len(pages) < need:
            self._target += self._target_of(seq.request, need) - self._target_of(seq.request, len(pages))
            self._asked += self.capacity(need) - self.capacity(len(pages))
            self._held += need - len(pages)
            while len(pages) < need:
                pages.append(self._take_page())
        return []

    def append_all(self, seqs: Seq[Sequence]) -> list[tuple[int, int]] | None:
        mapped, owner = self._mapped, self._owner
        short = sum([max(self.pages_for(seq.num_tokens) - len(mapped[owner[seq]]), 0) for seq in seqs])
        if short > self.available_pages and short > self.available_pages + self._spare():
            return None
        for seq in seqs:
            self.append(seq)
        return []

    def _take_page(self) -> int:
        """An unmapped page, else one reclaimed from the idle range holding the fewest, else
        one another sequence reserved ahead and has not reached (see the module docstring)."""
        self.maps += 1
        if self._unmapped:
            return self._unmapped.popleft()
        if not self._idle:
            return self._take_reserved()
        self.unmaps += 1
        return self._reclaim()

    def _reclaim(self) -> int:
        """Unmap the top page of the idle range holding the fewest (then the lowest id)."""
        while True:  # the idle range holding the fewest pages (then the lowest id)
            count, r = self._victims[0]
            if r in self._free_ranges and count == len(self._mapped[r]):
                break
            heapq.heappop(self._victims)  # stale
        pages = self._mapped[r]
        if count > 1:
            heapq.heapreplace(self._victims, (count - 1, r))  # still the fewest
        else:
            heapq.heappop(self._victims)
        self._idle -= 1
        return pages.pop()

    def _unreached(self, seq: Sequence) -> int:
        """Pages `seq` holds past its tokens out of those reserved ahead (updated as it grows)."""
        r = self._owner[seq]
        past = len(self._mapped[r]) - self.pages_for(seq.num_tokens)
        self._reserved[r] = max(min(int(self._reserved[r]), past), 0)
        return int(self._reserved[r])

    def _spare(self) -> int:
        """Reserved pages no holder has reached: what a decoding sequence may take beyond the
        unmapped and idle ones (0 unless mapping ahead)."""
        if not self._reserved.any():
            return 0
        return sum([self._unreached(seq) for seq in self._owner])

    def _take_reserved(self) -> int:
        """Unmap the top page of the range furthest ahead (then the lowest id) for another
        sequence's growth: the lookahead gives way."""
        seq = max(self._owner, key=lambda s: (self._unreached(s), -self._owner[s]))
        r = self._owner[seq]
        assert self._reserved[r] > 0, "no page for growth: the caller checked too little"
        pages = self._mapped[r]
        n = len(pages)
        self._reserved[r] -= 1
        self._held -= 1
        self._asked -= self.capacity(n) - self.capacity(n - 1)
        self._target -= self._page_target(seq.request, n - 1)
        self.unmaps += 1
        self.ahead_lost += 1
        return pages.pop()

    def look_ahead(self, seqs: Seq[Sequence], num_steps: int) -> None:
        """Mapping ahead: a decode segment of `num_steps` steps (final: trimmed to them first) is
        running; give each sequence, in batch order, the pages it reaches within another
        `num_steps` steps after these, never past its final length, out of unmapped then idle
        pages above the watermark. The runner maps them while the device runs: `ahead_maps`
        counts the pages a range holds beyond what it held before the trim (a page trimmed and
        reserved again stayed mapped), `ahead_unmaps` the idle pages reclaimed. A beam step maps
        nothing ahead (its sequences are re-forked after every step)."""
        held = [len(self._mapped[self._owner[seq]]) for seq in seqs]  # [B] mapped for the segment
        self.trim(num_steps)
        if any(seq.group is not None and seq.group.beam for seq in seqs):
            return
        for seq, before in zip(seqs, held, strict=True):
            r = self._owner[seq]
            pages = self._mapped[r]
            want = self.pages_for(min(seq.num_tokens + 2 * num_steps, seq.request.kv_len)) - len(pages)
            for _ in range(min(want, self.available_pages - self.watermark_pages)):
                n = len(pages)
                if self._unmapped:
                    pages.append(self._unmapped.popleft())
                else:
                    pages.append(self._reclaim())
                    self.ahead_unmaps += 1
                self.ahead_maps += int(n >= before)
                self._reserved[r] += 1
                self._held += 1
                self._asked += self.capacity(n + 1) - self.capacity(n)
                self._target += self._page_target(seq.request, n)

    def range_limits(self) -> np.ndarray:
        """`[max_requests]` the pages each held range's holder may ever need (its request's
        final length; a group's pooled ranges, the group's); 0 for a free range."""
        limits = np.zeros(self.max_requests, dtype=np.int64)
        for seq, r in self._owner.items():
            limits[r] = self.pages_for(seq.request.kv_len)
        for group, pool in self._pools.items():
            limits[pool] = self.pages_for(group.members[0].request.kv_len)
        return limits

    def reclaim_order(self, count: int) -> list[int]:
        """The ranges the next `count` pages taken beyond the unmapped pool would be reclaimed
        from, in order, one entry per page (fewer when the idle pages run out), as `_take_page`
        would choose them now (and `look_ahead`, which reclaims the same way); nothing changes.
        """
        idle = [(len(self._mapped[r]), r) for r in self._free_ranges if self._mapped[r]]
        heapq.heapify(idle)
        order: list[int] = []
        while idle and len(order) < count:
            pages, r = idle[0]  # the fewest first, then the lowest id: `_take_page`'s choice
            order.append(r)
            if pages > 1:
                heapq.heapreplace(idle, (pages - 1, r))
            else:
                heapq.heappop(idle)
        return order

    def growth_horizon(self, seqs: Seq[Sequence], max_steps: int) -> int:
        """Steps before a sequence needs a page the unmapped pool cannot give: reclaiming an idle
        page changes the idle total, which a segment's occupancy integral holds constant, so a
        segment stops where one would be needed and the next step's `append` reclaims it.

        Running k steps (step 0 already appended) needs `pages_for(computed + k) - held` new
        pages per sequence, monotone in k: the horizon is the largest k whose total fits."""
        computed = np.array([seq.num_computed for seq in seqs], dtype=np.int64)  # [B]
        held = np.array([len(self._mapped[self._owner[seq]]) for seq in seqs], dtype=np.int64)  # [B]
        free = len(self._unmapped)

        def need(k: int) -> int:
            pages = -(-(computed + k) * self._den // self._num)  # [B]
            return int(np.maximum(pages - held, 0).sum())

        low, high = 1, max_steps  # need(1) == 0: step 0's pages are mapped
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if need(mid) <= free else (low, mid - 1)
        return low

    def grow(self, seqs: Seq[Sequence], num_steps: int) -> Growth | None:
        """The pages steps 1..num_steps-1 need, taken in step order and, within a step, in
        batch order (as step-by-step appends take them): a sequence holding n pages needs page
        n + 1 at the step that writes its token `capacity(n)`."""
        self._grown = []
        crossings = []  # (step, batch index, pages held then)
        for index, seq in enumerate(seqs):
            n = len(self._mapped[self._owner[seq]])
            step = self.capacity(n) - seq.num_computed
            if step < num_steps:
                crossings.append((step, index, n))
        if not crossings:
            return None
        heapq.heapify(crossings)
        asked = np.zeros(num_steps, dtype=np.int64)
        target = np.zeros(num_steps, dtype=np.int64)
        granted = np.zeros(num_steps, dtype=np.float64)
        page = float(self.page_tokens)
        while crossings:
            step, index, n = heapq.heappop(crossings)
            seq = seqs[index]
            self._mapped[self._owner[seq]].append(self._unmapped.popleft())
            self.maps += 1
            self._grown_maps += 1
            self._held += 1
            added = self.capacity(n + 1) - self.capacity(n)
            self._asked += added
            gained = self._page_target(seq.request, n)
            self._target += gained
            self._grown.append((step, seq))
            asked[step] += added
            target[step] += gained
            granted[step] += page
            following = self.capacity(n + 1) - seq.num_computed
            if following < num_steps:
                heapq.heappush(crossings, (following, index, n + 1))
        return Growth(asked=asked, target=target, granted=granted)

    def trim(self, num_steps: int) -> None:
        # grow took pages from the front of the pool in step order: handing the late ones back
        # to the front in reverse order restores the pool exactly
        while self._grown and self._grown[-1][0] >= num_steps:
            _, seq = self._grown.pop()
            pages = self._mapped[self._owner[seq]]
            n = len(pages) - 1
            self._target -= self._page_target(seq.request, n)
            self._asked -= self.capacity(n + 1) - self.capacity(n)
            self._unmapped.appendleft(pages.pop())
            self.maps -= 1
            self._grown_maps -= 1
            self._held -= 1
        self._grown = []

    # ------------------------------------------------------------------ swapping: never
    def can_swap_out(self, seq: Sequence) -> bool:
        return False  # preemption is by recompute

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        raise NotImplementedError("virtual ranges are never swapped")

    def can_swap_in(self, seq: Sequence) -> bool:
        return False

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        raise NotImplementedError("virtual ranges are never swapped")

    # ------------------------------------------------------------------ accounting
    def footprint(self) -> Footprint:
        tokens = sum([seq.num_computed for seq in self._owner])
        granted = float(self._held * self.page_tokens)  # the fraction past whole tokens: overhead
        idle = float(self._idle * self.page_tokens)
        return Footprint(tokens, self._target, self._asked, granted, idle=idle)

    def sharing_saved(self) -> int:
        return 0  # every output holds its own copy

    def external_frag(self, head: Sequence | None) -> float:
        return float(self.num_slots - self.num_pages * self.page_tokens)  # memory short of a whole page

    def addressing(self, seq: Sequence) -> Extent:
        r = self._owner[seq]
        held = self.capacity(len(self._mapped[r]))
        return Extent(r * self.range_slots, held, held)

    def page_table(self, seq: Sequence) -> tuple[int, ...]:
        """Physical pages under `seq`'s range, in virtual order (what the real arena maps)."""
        return tuple(self._mapped[self._owner[seq]])

    def mapped_counts(self) -> np.ndarray:
        """`[max_requests]` pages mapped under each range, idle ones included: what a real
        arena must back. A range's pages are always its first ones (mapped at its end as it
        grows, unmapped from its end), so a count says which."""
        return np.fromiter(map(len, self._mapped), dtype=np.int64, count=self.max_requests)

    def _target_of(self, request: Request, num_pages: int) -> int:
        return min(request.kv_len, self.capacity(num_pages))

    def _page_target(self, request: Request, index: int) -> int:
        """Slots of page `index` (0-based) below the request's final length."""
        return self._target_of(request, index + 1) - self._target_of(request, index)

    def check_integrity(self) -> None:
        everywhere = [p for pages in self._mapped for p in pages] + list(self._unmapped)
        assert sorted(everywhere) == list(range(self.num_pages)), "a page is lost or mapped twice"
        held_ranges = list(self._owner.values()) + [r for pool in self._pools.values() for r in pool]
        assert len(set(held_ranges)) == len(held_ranges), "a range is held twice"
        assert set(held_ranges).isdisjoint(self._free_ranges), "a held range is also free"
        assert len(held_ranges) + len(self._free_ranges) == self.max_requests, "a range is lost"
        assert self._idle == sum(len(self._mapped[r]) for r in self._free_ranges), "idle count wrong"
        assert self._held == sum(len(self._mapped[r]) for r in held_ranges), "held count wrong"
        assert self._asked == sum(self.capacity(len(self._mapped[r])) for r in held_ranges), "asked wrong"
        if not self.deferred:
            assert self._idle == 0, "pages idle without deferred reclamation"
        reserved = self._reserved.copy()
        reserved[held_ranges] = 0
        assert not reserved.any(), "a range nobody holds keeps pages reserved ahead"
        counts = self.mapped_counts()
        assert (self._reserved >= 0).all() and (self._reserved <= counts).all(), "reserved count wrong"
        want = 0
        for seq, r in self._owner.items():
            n = len(self._mapped[r])
            assert self.pages_for(seq.num_computed) <= n, f"seq {seq.seq_id} lost pages under its tokens"
            want += self._target_of(seq.request, n)
        for group, pool in self._pools.items():
            resident = sum(member in self._owner for member in group.members)
            assert resident == self._resident[group] > 0, "a group's resident count is wrong"
            # finished members hold none; a preempted sample's range waits in the pool unless
            # every other member left meanwhile (the group's ranges went with the last of them)
            assert resident + len(pool) <= group.width, "a group holds a range too many"
            want += sum(self._target_of(group.members[0].request, len(self._mapped[r])) for r in pool)
        assert self._target == want, "target total out of date"
