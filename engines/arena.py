"""Contiguous slot arenas: where a contiguous engine finds an extent for a reservation.

Both arenas manage the same range `[0, num_slots)` of token slots and differ in how they
pick and round extents:

- `BuddyArena` (the paper's Orca): every grant is a power-of-two block aligned to its size,
  so a 1100-slot reservation costs 2048 slots (the 948 extra are *allocator overhead*), and
  freed blocks merge only with their buddy.
- `FirstFitArena`: grants exactly what is asked, from the lowest-addressed free run that is
  long enough, and merges neighbouring free runs.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Protocol


class SlotArena(Protocol):
    """Hands out contiguous extents of token slots."""

    num_slots: int

    @property
    def num_free(self) -> int: ...

    def grant_size(self, num: int) -> int:
        """Slots a request for `num` slots actually takes (>= num)."""
        ...

    def can_fit(self, num: int) -> bool:
        """Whether a free extent for `num` slots exists right now."""
        ...

    def can_fit_many(self, num: int, count: int) -> bool:
        """Whether `count` extents of `num` slots could be granted together right now."""
        ...

    def can_ever_fit(self, num: int) -> bool:
        """Whether an empty arena could grant `num` slots."""
        ...

    def alloc(self, num: int) -> int:
        """Grant an extent for `num` slots and return its first slot (caller checked can_fit)."""
        ...

    def release(self, start: int) -> None: ...

    def free_slots_unusable_for(self, num: int) -> int:
        """Free slots lying in free extents too small to grant `num` slots."""
        ...

    def check_integrity(self, allocated: dict[int, int]) -> None:
        """Assert consistency with the caller's view `{start: granted}`."""
        ...


def _order_of(num: int) -> int:
    """Smallest order o with 2**o >= num."""
    return max(num - 1, 0).bit_length()


class BuddyArena:
    """Binary buddy allocator over a possibly non-power-of-two arena.

    A `num_slots` that is not a power of two is split into its binary decomposition
    (15,728 = 8192 + 4096 + 2048 + 1024 + 256 + 64 + 32 + 16), largest first from slot 0;
    each part is a top-level block aligned to its size. A top-level block never finds its
    buddy free (the address `start ^ size` begins a smaller region), so the usual XOR test
    alone keeps merges inside the arena.

    Free blocks live in one min-heap per order (a request takes the smallest order that
    fits, lowest address first, so grants are deterministic and tests can assert exact slots)
    with `_free` as the source of truth: heap entries of merged-away blocks are dropped when
    they surface, or in bulk once they outnumber the live ones.
    """

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._max_order = num_slots.bit_length()
        self._heaps: list[list[int]] = [[] for _ in range(self._max_order + 1)]
        self._free: dict[int, int] = {}  # start -> order of every free block
        self._count = [0] * (self._max_order + 1)  # free blocks per order
        self._granted: dict[int, int] = {}  # start -> order of every granted block
        start = 0
        for order in range(self._max_order, -1, -1):
            if num_slots >> order & 1:
                self._push(start, order)
                start += 1 << order
        self._num_free = num_slots

    @property
    def num_free(self) -> int:
        return self._num_free

    def grant_size(self, num: int) -> int:
        return 1 << _order_of(num)

    def can_fit(self, num: int) -> bool:
        count = self._count
        for order in range(_order_of(num), self._max_order + 1):
            if count[order]:
                return True
        return False

    def can_fit_many(self, num: int, count: int) -> bool:
        # a free block of order o splits into 2 ** (o - want) grants of order want
        want = _order_of(num)
        fits = 0
        for order in range(want, self._max_order + 1):
            fits += self._count[order] << (order - want)
            if fits >= count:
                return True
        return False

    def can_ever_fit(self, num: int) -> bool:
        return 1 << _order_of(num) <= 1 << (self.num_slots.bit_length() - 1)

    def alloc(self, num: int) -> int:
        want = _order_of(num)
        order = next(o for o in range(want, self._max_order + 1) if self._count[o])
        start = self._pop(order)
        while order > want:  # split, keeping the lower half
            order -= 1
            self._push(start + (1 << order), order)
        self._granted[start] = want
        self._num_free -= 1 << want
        return start

    def release(self, start: int) -> None:
        order = self._granted.pop(start)
        self._num_free += 1 << order
        while True:
            buddy = start ^ (1 << order)
            if self._free.get(buddy) != order:
                break
            del self._free[buddy]  # its heap entry goes stale
            self._count[order] -= 1
            self._compact(order)
            start = min(start, buddy)
            order += 1
        self._push(start, order)

    def free_slots_unusable_for(self, num: int) -> int:
        count = self._count
        return sum([count[o] << o for o in range(min(_order_of(num), self._max_order + 1))])

    def free_blocks(self) -> list[tuple[int, int]]:
        """Sorted `(start, size)` of free blocks (for tests and memory maps)."""
        return sorted((s, 1 << o) for s, o in self._free.items())

    def check_integrity(self, allocated: dict[int, int]) -> None:
        assert {s: 1 << o for s, o in self._granted.items()} == allocated, "grants differ"
        spans = sorted([(s, 1 << o) for s, o in self._free.items()] + list(allocated.items()))
        pos = 0
        for start, size in spans:
            assert start == pos, f"gap or overlap at slot {pos} (next extent at {start})"
            assert start % size == 0 or size == 0, f"block at {start} of {size} misaligned"
            pos += size
        assert pos == self.num_slots, "blocks do not cover the arena"
        assert self._num_free == sum(1 << o for o in self._free.values())
        for order, count in enumerate(self._count):
            assert count == sum(1 for o in self._free.values() if o == order)

    def _push(self, start: int, order: int) -> None:
        self._free[start] = order
        self._count[order] += 1
        heapq.heappush(self._heaps[order], start)

    def _compact(self, order: int) -> None:
        """Drop stale entries once they outnumber the live ones, so heaps stay O(free blocks)."""
        heap = self._heaps[order]
        if len(heap) > 2 * self._count[order] + 8:
            heap[:] = [start for start in heap if self._free.get(start) == order]
            heapq.heapify(heap)

    def _pop(self, order: int) -> int:
        heap = self._heaps[order]
        while True:
            start = heapq.heappop(heap)
            if self._free.get(start) == order:
                del self._free[start]
                self._count[order] -= 1
                return start


class FirstFitArena:
    """Exact-size extents from the lowest-addressed free run long enough; runs coalesce."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._starts: list[int] = [0]  # sorted starts of free runs
        self._lengths: dict[int, int] = {0: num_slots}
        self._granted: dict[int, int] = {}
        self._num_free = num_slots

    @property
    def num_free(self) -> int:
        return self._num_free

    def grant_size(self, num: int) -> int:
        return num

    def can_fit(self, num: int) -> bool:
        return any(length >= num for length in self._lengths.values())

    def can_fit_many(self, num: int, count: int) -> bool:
        # first fit carves equal extents from the front of a run: a run of L slots yields L // num
        return sum(length // num for length in self._lengths.values()) >= count

    def can_ever_fit(self, num: int) -> bool:
        return num <= self.num_slots

    def alloc(self, num: int) -> int:
        start = next(s for s in self._starts if self._lengths[s] >= num)
        length = self._lengths.pop(start)
        index = bisect.bisect_left(self._starts, start)
        if length > num:
            self._starts[index] = start + num
            self._lengths[start + num] = length - num
        else:
            del self._starts[index]
        self._granted[start] = num
        self._num_free -= num
        return start

    def release(self, start: int) -> None:
        length = self._granted.pop(start)
        self._num_free += length
        index = bisect.bisect_left(self._starts, start)
        if index < len(self._starts) and self._starts[index] == start + length:
            length += self._lengths.pop(self._starts.pop(index))
        if index > 0:
            prev = self._starts[index - 1]
            if prev + self._lengths[prev] == start:
                self._lengths[prev] += length
                return
        self._starts.insert(index, start)
        self._lengths[start] = length

    def free_slots_unusable_for(self, num: int) -> int:
        return sum(length for length in self._lengths.values() if length < num)

    def free_runs(self) -> list[tuple[int, int]]:
        """Sorted `(start, length)` of free runs (for tests and memory maps)."""
        return [(s, self._lengths[s]) for s in self._starts]

    def check_integrity(self, allocated: dict[int, int]) -> None:
        assert self._granted == allocated, "grants differ"
        assert self._starts == sorted(self._lengths), "free-run index out of order"
        spans = sorted(list(self._lengths.items()) + list(allocated.items()))
        pos = 0
        for start, size in spans:
            assert start == pos, f"gap or overlap at slot {pos} (next extent at {start})"
            pos += size
        assert pos == self.num_slots, "extents do not cover the arena"
        for a, b in zip(self._starts, self._starts[1:], strict=False):
            assert a + self._lengths[a] < b, f"free runs at {a} and {b} not merged"
        assert self._num_free == sum(self._lengths.values())
