"""The KV arena of a real `vmm` run: virtual tensors whose physical pages come and go.

Same indexing as `KVArena` (`k[layer]`, `v[layer]`: `[S, Hkv, D]`, a token per slot, a request's
range of `range_slots` slots starting at `range * range_slots`), so the runner, the contiguous
kernels and the decode graphs address it as they address any contiguous arena; but only the
pages the allocator holds are backed by memory. Why one layout for all: a slot's address never
moves, so a CUDA graph captured once replays over pages mapped after its capture.

Layouts (`kvbench.vmm.pages`), both one reservation carved by strides:

- `per-layer` (vAttention's): a virtual K and a virtual V tensor per layer, `[S, Hkv, D]` each,
  one after the other (`[L, 2, S, Hkv, D]`); an allocator page is a driver page at the same
  offset in each of the 2 x L tensors.
- `per-request`: a token's K and V of every layer together (`[S, L, 2, Hkv, D]`), so a range
  holds all of a request's K/V; an allocator page is one driver page.

A range's pages are always its first ones, so the arena keeps one count per range and
`sync` maps or unmaps at the ends to match the allocator's counts (`mapped_counts`): deferred
reclamation (pages kept under a finished request's range) is the allocator's choice and simply
stays mapped. `prefetch` maps pages beyond them early (`--vmm-map ahead`), never more pages in
all than the budget's; `sync` unmaps such pages first when the allocator needs the memory.
Such a page was mapped for nothing: `ahead_lost` counts the early pages unmapped before the
allocator counted them under their range (an early page it counts is what a step writes).
Once deferred reclamation has mapped every physical page (idle ranges keep theirs), mapping
ahead needs a page unmapped first: `prefetch` asks the allocator which idle pages its next
reclaims would take (`VirtualAllocator.reclaim_order`) and unmaps those early, so the reclaim
and the map both happen while the device runs, as vAttention's background mapping does. A
prediction the allocator does not follow (a request finished, another was admitted) costs
calls, not correctness: `sync` maps back every page the allocator still counts.

Range 0's first page (the pages under slot 0) stays mapped from construction to `close`, held by
the allocator or not: every virtual tensor starts there, and both torch (viewing the span) and
Triton's launcher (at each eager launch) ask the driver about a tensor's base address, which
an unmapped address cannot answer. It costs at most one page beyond the budget.

On CUDA the memory is reserved and mapped through the driver (`kvbench.vmm.driver`); elsewhere
a plain tensor stands in, and a page is filled with NaN when it is mapped or unmapped, so a
read of memory that a GPU would not have backed poisons the logits instead of faulting.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Protocol

import numpy as np
import torch

from kvbench.errors import KvbenchError
from kvbench.models import ModelSpec
from kvbench.vmm.pages import LAYOUTS


class Reclaimer(Protocol):
    """What mapping ahead asks the allocator (`engines.vmm.VirtualAllocator`): which ranges its
    next reclaims take, the pages it counts under each, and the most each held range's holder
    may ever need (0: a free range)."""

    def reclaim_order(self, count: int) -> list[int]: ...

    def mapped_counts(self) -> np.ndarray: ...

    def range_limits(self) -> np.ndarray: ...


class _HostPages:
    """CPU stand-in for a virtual span: a tensor, and the set of pages a GPU would have mapped."""

    def __init__(self, numel: int, page_elems: int, dtype: torch.dtype, pinned: list[int]) -> None:
        self.flat = torch.zeros(numel, dtype=dtype)  # [numel]
        self.page_elems = page_elems
        self.mapped: set[int] = set()
        self.maps = self.unmaps = 0
        for page in pinned:
            self.map_page(page)

    def map_page(self, index: int) -> None:
        if index in self.mapped:
            raise RuntimeError(f"page {index} is mapped already")
        self.mapped.add(index)
        self._poison(index)  # a fresh page's content is undefined
        self.maps += 1

    def unmap_page(self, index: int) -> None:
        if index not in self.mapped:
            raise RuntimeError(f"page {index} is not mapped")
        self.mapped.remove(index)
        self._poison(index)
        self.unmaps += 1

    def _poison(self, index: int) -> None:
        self.flat[index * self.page_elems : (index + 1) * self.page_elems].fill_(float("nan"))

    def close(self) -> None:
        self.mapped.clear()


class _DevicePages:
    """A virtual span on the device (`VirtualBuffer`) viewed as one flat tensor."""

    def __init__(
        self, numel: int, page_elems: int, dtype: torch.dtype, device: torch.device, pinned: list[int]
    ) -> None:
        from kvbench.vmm.driver import Driver, DriverError, VirtualBuffer, view

        element = torch.empty((), dtype=dtype).element_size()
        torch.cuda.init()
        with torch.cuda.device(device):
            driver = Driver(device.index or 0)
            granularity = driver.granularity()
            if page_elems * element % granularity:
                raise KvbenchError(
                    f"--vmm-page-kib {page_elems * element // 1024}: a real vmm arena's page must be a "
                    f"multiple of the driver's granularity, {granularity // 1024} KiB"
                )
            try:
                self.buffer = VirtualBuffer(driver, numel * element, page_elems * element)
            except DriverError as error:
                raise KvbenchError(f"the vmm arena's virtual reservation failed: {error}") from None
            for page in pinned:  # before the view: torch asks the driver where its address lives
                self.buffer.map_page(page)
            self.flat = view(self.buffer.address, (numel,), dtype)  # [numel]
        self.page_elems = page_elems

    @property
    def mapped(self) -> frozenset[int]:
        return self.buffer.mapped_pages

    def map_page(self, index: int) -> None:
        self.buffer.map_page(index)

    def unmap_page(self, index: int) -> None:
        self.buffer.unmap_page(index)

    def close(self) -> None:
        self.buffer.close()


class VirtualKVArena:
    """`ranges` virtual ranges of `range_slots` slots; pages of `page_tokens` slots (maybe a
    fraction), at most `num_pages` of them mapped at once. See the module docstring."""

    def __init__(
        self, spec: ModelSpec, *, ranges: int, range_slots: int, page_tokens: Fraction | int, num_pages: int,
        layout: str, dtype: torch.dtype, device: torch.device,
        reclaimer: Reclaimer | None = None,
    ) -> None:  # fmt: skip
        if layout not in LAYOUTS:
            raise KvbenchError(f"--vmm-layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        layers, heads, dim = spec.num_layers, spec.num_kv_heads, spec.head_dim
        per_layer = layout == "per-layer"
        row = heads * dim * (1 if per_layer else 2 * layers)  # elements of a token in one virtual tensor
        self.tensors = 2 * layers if per_layer else 1
        page_elems = Fraction(page_tokens) * row
        range_pages = Fraction(range_slots * row) / page_elems if page_elems.denominator == 1 else None
        if range_pages is None or range_pages.denominator != 1:  # a caller's bug: the allocator's geometry
            raise ValueError(f"{range_slots} slots of {row} elements are not whole pages of {page_tokens}")
        self.layout, self.ranges, self.range_slots = layout, ranges, range_slots
        self.page_tokens, self.num_pages = Fraction(page_tokens), num_pages
        self.range_pages = int(range_pages)
        self.num_slots = ranges * range_slots
        self._tensor_pages = ranges * self.range_pages  # pages of one virtual tensor
        # range 0's pages under slot 0, always mapped (see the module docstring)
        self.pinned = -(-self.page_tokens.denominator // self.page_tokens.numerator)
        self._floor = np.zeros(ranges, dtype=np.int64)  # [ranges] pages kept mapped whatever the need
        self._floor[0] = self.pinned
        pinned = [page for j in range(self.pinned) for page in self.group(0, j)]
        numel = self.tensors * self.num_slots * row
        self._pages: _HostPages | _DevicePages = (
            _DevicePages(numel, int(page_elems), dtype, device, pinned) if device.type == "cuda"
            else _HostPages(numel, int(page_elems), dtype, pinned)
        )  # fmt: skip
        flat, slots = self._pages.flat, self.num_slots
        if per_layer:
            both = flat.view(layers, 2, slots, heads, dim)
            self.k, self.v = both[:, 0], both[:, 1]  # [L, S, Hkv, D] each
        else:
            both = flat.view(slots, layers, 2, heads, dim)
            self.k, self.v = both[:, :, 0].transpose(0, 1), both[:, :, 1].transpose(0, 1)  # [L, S, Hkv, D]
        self._page_bytes = int(page_elems) * flat.element_size()
        self.mapped = self._floor.copy()  # [ranges] pages mapped under each range
        self.maps = self.unmaps = self.ahead_maps = 0  # allocator pages (each a driver page per tensor)
        self.ahead_unmaps = 0  # of `unmaps`, idle pages `prefetch` reclaimed early
        # pages `prefetch` mapped that the allocator has not counted yet, at the top of each range
        self._early = np.zeros(ranges, dtype=np.int64)  # [ranges]
        self.ahead_lost = 0  # of `unmaps`, early pages unmapped before the allocator counted them
        self._reclaimer = reclaimer  # the allocator, asked by `prefetch` (None: no early reclaim)
        self.map_s = 0.0  # seconds in driver calls (map, unmap) of `sync` and `prefetch`
        self.ahead_s = 0.0  # of `map_s`, `prefetch`'s: spent while the device runs steps

    @classmethod
    def for_allocator(
        cls, spec: ModelSpec, allocator, layout: str, dtype: torch.dtype, device: torch.device
    ) -> VirtualKVArena:
        """The arena a `VirtualAllocator`'s ranges and pages address."""
        return cls(
            spec, ranges=allocator.max_requests, range_slots=allocator.range_slots,
            page_tokens=allocator.page_tokens, num_pages=allocator.num_pages, layout=layout, dtype=dtype,
            device=device, reclaimer=allocator if hasattr(allocator, "reclaim_order") else None,
        )  # fmt: skip

    @property
    def nbytes(self) -> int:
        """Physical bytes the budget's pages hold (what may be mapped at once)."""
        return self.num_pages * self.tensors * self._page_bytes

    @property
    def mapped_bytes(self) -> int:
        return int(self.mapped.sum()) * self.tensors * self._page_bytes

    @property
    def driver_pages(self) -> frozenset[int]:
        """Driver pages (of `_page_bytes` each, across the whole span) mapped now."""
        return frozenset(self._pages.mapped)

    def group(self, r: int, j: int) -> list[int]:
        """Driver pages of page `j` of range `r`: one per virtual tensor."""
        return [t * self._tensor_pages + r * self.range_pages + j for t in range(self.tensors)]

    def _grow(self, r: int, count: int) -> None:
        for j in range(int(self.mapped[r]), count):
            for page in self.group(r, j):
                self._pages.map_page(page)
            self.mapped[r] = j + 1

    def _shrink(self, r: int, count: int) -> None:
        for j in range(int(self.mapped[r]) - 1, count - 1, -1):
            for page in self.group(r, j):
                self._pages.unmap_page(page)
            self.mapped[r] = j
            if self._early[r]:  # the top pages are the early ones: this one was mapped for nothing
                self._early[r] -= 1
                self.ahead_lost += 1

    def backed(self, need: np.ndarray) -> np.ndarray:
        """`[ranges]` pages mapped under each range once `sync(need)` is done (without `keep`):
        the allocator's counts `need`, and range 0's pinned pages."""
        return np.maximum(np.asarray(need, dtype=np.int64), self._floor)

    def sync(self, need: np.ndarray, keep: Iterable[int] = ()) -> None:
        """Map exactly `need[r]` pages under each range `r` (the allocator's counts; range 0
        keeps its pinned ones), unmapping first; ranges in `keep` keep pages mapped ahead beyond
        theirs while the budget allows, those furthest ahead given up first when it does not.
        With a reclaimer (mapping ahead), every held range keeps them, not only `keep`'s (a
        prefill batch must not undo what decoding sequences mapped ahead), up to what its
        holder may ever need (a range given to a shorter request gives back the rest)."""
        start = time.perf_counter()
        need = self.backed(need)  # [ranges]
        # early pages the allocator counts now are its own: a step writes them, none was wasted
        self._early = np.minimum(self._early, np.maximum(self.mapped - need, 0))
        target = need.copy()
        kept = np.fromiter(keep, dtype=np.int64)
        if len(kept) and self._reclaimer is not None:
            limits = self._reclaimer.range_limits()  # [ranges] 0 where free
            ahead = np.minimum(self.mapped, limits)
            target = np.maximum(need, np.where(limits > 0, ahead, 0))
            self._fit_budget(target, need)
        elif len(kept):
            target[kept] = np.maximum(need[kept], self.mapped[kept])
            self._fit_budget(target, need)
        shrink = np.flatnonzero(self.mapped > target)
        grow = np.flatnonzero(self.mapped < target)
        for r in shrink.tolist():
            self.unmaps += int(self.mapped[r] - target[r])
            self._shrink(r, int(target[r]))
        for r in grow.tolist():
            self.maps += int(target[r] - self.mapped[r])
            self._grow(r, int(target[r]))
        if len(shrink) or len(grow):
            self.map_s += time.perf_counter() - start

    def _fit_budget(self, target: np.ndarray, need: np.ndarray) -> None:
        """Lower `target` (in place) toward `need` until it fits the budget, one page at a time
        from the range furthest ahead of its need."""
        for _ in range(int(target.sum()) - max(self.num_pages, int(need.sum()))):  # pinned: beyond
            target[int(np.argmax(target - need))] -= 1

    def prefetch(self, wants: dict[int, int]) -> None:
        """Map pages early: up to `wants[r]` under each range `r` (capped at the range), while
        the pages mapped in all stay within the budget. With a reclaimer (the allocator), idle
        pages it would reclaim next are unmapped first when the unmapped ones do not cover the
        wants."""
        start = time.perf_counter()
        want = {r: min(w, self.range_pages) - int(self.mapped[r]) for r, w in wants.items()}
        short = sum(max(add, 0) for add in want.values()) - (self.num_pages - int(self.mapped.sum()))
        freed = self._reclaim_early(short, set(want)) if short > 0 else 0
        room = self.num_pages - int(self.mapped.sum())
        mapped = 0
        for r, add in want.items():
            add = min(add, room)
            if add > 0:
                self._grow(r, int(self.mapped[r]) + add)
                self._early[r] += add
                room -= add
                mapped += add
        if mapped or freed:
            self.maps += mapped
            self.ahead_maps += mapped
            elapsed = time.perf_counter() - start
            self.map_s += elapsed
            self.ahead_s += elapsed

    def _reclaim_early(self, short: int, growing: set[int]) -> int:
        """Unmap up to `short` pages the allocator's next reclaims take (from the top of each
        idle range, as it takes them); pages it counts that are unmapped here already were
        reclaimed early before, and stand for their turn. Returns the pages unmapped."""
        if self._reclaimer is None:
            return 0
        counts = self._reclaimer.mapped_counts()  # [ranges]
        early = np.maximum(counts - self.mapped, 0)  # [ranges] counted there, unmapped here already
        freed = 0
        for r in self._reclaimer.reclaim_order(short + int(early.sum())):
            if freed == short:
                break
            if r in growing:  # a caller's bug: the allocator never reclaims a held range
                raise ValueError(f"range {r} is both growing and idle")
            if early[r]:
                early[r] -= 1
                continue
            if self.mapped[r] > self._floor[r]:
                self._shrink(r, int(self.mapped[r]) - 1)
                freed += 1
        self.unmaps += freed
        self.ahead_unmaps += freed
        return freed

    @contextmanager
    def scratch(self, tokens: int) -> Iterator[None]:
        """Back range 0's first `tokens` slots for the duration (a warm-up that reads them before
        any allocation); pages mapped for it are unmapped after."""
        before = int(self.mapped[0])
        pages = -(-tokens * self.page_tokens.denominator // self.page_tokens.numerator)
        self._grow(0, max(before, min(self.range_pages, pages)))
        try:
            yield
        finally:
            if self._pages.flat.is_cuda:
                torch.cuda.synchronize(self._pages.flat.device)  # no unmap under a running kernel
            self._shrink(0, before)

    def fill(self, value: float) -> None:
        """Fill every mapped page (tests poison them; an unmapped page cannot be written)."""
        size = self._pages.page_elems
        for page in self._pages.mapped:
            self._pages.flat[page * size : (page + 1) * size].fill_(value)

    def stats(self) -> dict:
        """The run's mapping work, for summaries and benchmarks."""
        return {
            "vmm_layout": self.layout, "vmm_maps": self.maps, "vmm_unmaps": self.unmaps,
            "vmm_ahead_maps": self.ahead_maps, "vmm_ahead_unmaps": self.ahead_unmaps,
            "vmm_ahead_lost": self.ahead_lost,
            "vmm_map_s": self.map_s, "vmm_ahead_map_s": self.ahead_s,
        }  # fmt: skip

    def close(self) -> None:
        """Unmap and release every page and the reservation (the device memory returns)."""
        self.mapped[:] = 0
        self._early[:] = 0
        self._pages.close()
