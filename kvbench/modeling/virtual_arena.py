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
stays mapped. Mapping ahead (`--vmm-map ahead`) is the allocator's choice too: once a decode
segment is launched, the allocator reserves each batch sequence's next pages
(`VirtualAllocator.look_ahead`: held, so no other request is granted them), taking idle pages
where none is unmapped, and `prefetch` makes its counts real while the device runs: the maps,
and the unmaps of the idle pages reclaimed for them. The next call's `sync` then finds them
mapped. An earlier design mapped ahead into memory the allocator still counted as free; it
granted those pages to new requests and `sync` unmapped them before any step wrote them.

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
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Protocol

import numpy as np
import torch

from kvbench.errors import KvbenchError
from kvbench.models import ModelSpec
from kvbench.vmm.pages import LAYOUTS


class Lookahead(Protocol):
    """What the arena reports of the allocator's mapping ahead (`engines.vmm.VirtualAllocator`):
    the pages it reserved ahead and then gave to another sequence's growth before their holder
    reached them (the arena unmaps each: a map and an unmap for nothing)."""

    ahead_lost: int


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
        allocator: Lookahead | None = None,
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
        self.scratch_maps = 0  # pages mapped for a warm-up (`scratch`), each unmapped after it
        self.ahead_unmaps = 0  # of `unmaps`, `prefetch`'s (idle pages reclaimed for the lookahead)
        self._allocator = allocator  # asked for its lost lookahead (None: none reported)
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
            device=device, allocator=allocator if hasattr(allocator, "ahead_lost") else None,
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

    def backed(self, need: np.ndarray) -> np.ndarray:
        """`[ranges]` pages mapped under each range once `sync(need)` is done: the allocator's
        counts `need`, and range 0's pinned pages."""
        return np.maximum(np.asarray(need, dtype=np.int64), self._floor)

    def _match(self, need: np.ndarray) -> tuple[int, int]:
        """Map exactly `need[r]` pages under each range `r` (range 0 keeps its pinned ones),
        unmapping first so the pages in use never exceed the budget; the pages (mapped, unmapped)."""
        target = self.backed(need)  # [ranges]
        shrink = np.flatnonzero(self.mapped > target)
        grow = np.flatnonzero(self.mapped < target)
        unmapped = int((self.mapped[shrink] - target[shrink]).sum())
        mapped = int((target[grow] - self.mapped[grow]).sum())
        for r in shrink.tolist():
            self._shrink(r, int(target[r]))
        for r in grow.tolist():
            self._grow(r, int(target[r]))
        return mapped, unmapped

    def sync(self, need: np.ndarray) -> None:
        """Before a call's steps: back exactly the allocator's counts `need` (`[ranges]`); the
        calls it makes are inside the step's measured time."""
        start = time.perf_counter()
        mapped, unmapped = self._match(need)
        self.maps += mapped
        self.unmaps += unmapped
        if mapped or unmapped:
            self.map_s += time.perf_counter() - start

    def prefetch(self, need: np.ndarray) -> None:
        """While a decode segment runs: back the allocator's counts `need` after it reserved the
        batch's next pages (`VirtualAllocator.look_ahead`). It unmaps only pages no launched
        step touches: idle ranges' (reclaimed for the reservations) and, where the segment was
        cut short, the batch's pages past what its steps write."""
        start = time.perf_counter()
        mapped, unmapped = self._match(need)
        if mapped or unmapped:
            self.maps += mapped
            self.unmaps += unmapped
            self.ahead_maps += mapped
            self.ahead_unmaps += unmapped
            elapsed = time.perf_counter() - start
            self.map_s += elapsed
            self.ahead_s += elapsed

    @contextmanager
    def scratch(self, tokens: int) -> Iterator[None]:
        """Back range 0's first `tokens` slots for the duration (a warm-up that reads them before
        any allocation); pages mapped for it are unmapped after. More than the range's slots is
        a caller's bug, refused: the slots past it are another range's, unbacked, and a kernel
        reading them faults on a GPU (a CPU stand-in would read NaN into dropped logits)."""
        if tokens > self.range_slots:
            raise ValueError(f"scratch of {tokens} slots: range 0 holds {self.range_slots}")
        before = int(self.mapped[0])
        pages = -(-tokens * self.page_tokens.denominator // self.page_tokens.numerator)
        self._grow(0, max(before, pages))
        self.scratch_maps += max(before, pages) - before
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

    @property
    def ahead_lost(self) -> int:
        """Pages mapped ahead that another sequence's growth took before their holder reached
        them, each unmapped again by `sync` (the allocator's count: it decides the lookahead)."""
        return 0 if self._allocator is None else self._allocator.ahead_lost

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
        self._pages.close()
