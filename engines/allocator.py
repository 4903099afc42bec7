"""The allocator seam: how an engine carves the one KV arena among sequences.

Every engine owns exactly one `KVAllocator` over the same `num_slots` token slots (sized once
from the byte budget). Allocators are pure integer bookkeeping: no tensors, no device, so
they are tested on CPU with exact slot and block ids, and the same object drives a real GPU
run (through `addressing`) and a simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace
from typing import Protocol

from kvbench.metrics.occupancy import Footprint, Growth, KVSnapshot
from kvbench.requests import Request
from kvbench.sequence import Sequence


@dataclass(frozen=True, slots=True)
class Extent:
    """A contiguous reservation: slots `[start, start + granted)`; `slot = start + pos`."""

    start: int
    asked: int  # slots the policy reserved
    granted: int  # slots the arena handed out (>= asked)


@dataclass(frozen=True, slots=True)
class BlockTable:
    """A paged mapping: `slot = blocks[pos // block_size] * block_size + pos % block_size`."""

    blocks: tuple[int, ...]
    block_size: int


Addressing = Extent | BlockTable

SlotCopy = tuple[int, int, int]  # (first source slot, first target slot, slots): K/V to copy first


class KVAllocator(Protocol):
    """Contract every allocator keeps.

    - A sequence is *resident* from `allocate` to `free`; only resident sequences hold slots.
    - `allocate`/`append` are only called after the matching `can_*` returned True; a sequence
      is then able to hold `seq.num_tokens` tokens (the next step's writes); an allocator built
      for chunked prefill may hold fewer in a window group, never fewer than the step's budget
      past `seq.num_computed` (what a step can write).
    - `footprint()` totals cover resident sequences only; with `external_frag` they yield the
      six occupancy categories, which always sum to `num_slots`.
    - `grow` is the multi-step form of `append`: after `growth_horizon(seqs, k) >= n`,
      `grow(seqs, n)` makes the allocations that `n - 1` further decode steps need, in the
      order step-by-step appends would make them; `trim` gives back the tail of a segment
      that ended early.
    """

    num_slots: int

    def can_ever_hold(self, request: Request) -> bool:
        """Whether this request could run alone in an empty arena."""
        ...

    def can_allocate(self, seq: Sequence) -> bool:
        """Room to admit `seq` (a group's leader: what the engine reserves for the whole group)."""
        ...

    def can_allocate_all(self, seqs: Seq[Sequence]) -> bool:
        """Room to admit all of `seqs` together (a preempted beam group coming back)."""
        ...

    def allocate(self, seq: Sequence) -> None: ...

    def fork(self, parent: Sequence, child: Sequence) -> list[SlotCopy]:
        """Make non-resident `child` resident holding `parent`'s K/V (parallel samples, beams).

        Paged shares the blocks (copy-on-write later, no copies now); contiguous hands the
        child an extent reserved at admission and returns the copy that fills it.
        """
        ...

    def can_append(self, seq: Sequence) -> bool: ...

    def append(self, seq: Sequence) -> list[tuple[int, int]]:
        """Make room for `seq.num_tokens`; return `(src, dst)` block copies to perform first."""
        ...

    def append_all(self, seqs: Seq[Sequence]) -> list[tuple[int, int]] | None:
        """`append` for every sequence if all of them fit, else None and nothing changed.

        The decode step's fast path: when no one must be preempted, one pass replaces a
        `can_append`/`append` pair per sequence.
        """
        ...

    def free(self, seq: Sequence) -> None: ...

    def can_swap_out(self, seq: Sequence) -> bool:
        """Whether `swap_out` can park this sequence's K/V in host memory."""
        ...

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]: ...

    def can_swap_in(self, seq: Sequence) -> bool: ...

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]: ...

    def growth_horizon(self, seqs: Seq[Sequence], max_steps: int) -> int:
        """Most decode steps (<= max_steps) these sequences can run with no allocation failing."""
        ...

    def grow(self, seqs: Seq[Sequence], num_steps: int) -> Growth | None:
        """Allocate for decode steps 1..num_steps-1 (step 0 was `append`ed)."""
        ...

    def trim(self, num_steps: int) -> None:
        """Make the last `grow` final for its first `num_steps` steps; undo the rest.

        A segment that ended early leaves exactly the state `grow(seqs, num_steps)` would have
        left, block ids included. Called after every segment.
        """
        ...

    def footprint(self) -> Footprint:
        """Totals over resident sequences, external fragmentation left at 0."""
        ...

    def sharing_saved(self) -> int:
        """Slots the resident sequences map beyond the distinct slots held (0 without sharing).

        Without sharing every sequence would hold its own copy, so the slots held would be
        `footprint().granted + sharing_saved()` (the paper's Fig. 15 denominator).
        """
        ...

    def external_frag(self, head: Sequence | None) -> int:
        """Free slots unusable by `head`, the request waiting first (0 if none waits)."""
        ...

    def addressing(self, seq: Sequence) -> Addressing: ...

    def check_integrity(self) -> None:
        """Assert every internal invariant (no slot owned twice, counts consistent)."""
        ...


def address_slots(allocator: KVAllocator) -> int:
    """Slots the KV arena's addresses must span: the budget, except for a virtual-memory
    allocator, whose ranges span more addresses than the physical pages behind them."""
    return getattr(allocator, "virtual_slots", allocator.num_slots)


def measure(allocator: KVAllocator, head: Sequence | None) -> Footprint:
    """The allocator's footprint, with external fragmentation as `head` (first waiter) sees it."""
    return replace(allocator.footprint(), external=allocator.external_frag(head))


def snapshot(allocator: KVAllocator, head: Sequence | None = None) -> KVSnapshot:
    """Occupancy categories of the arena now, in slots (they sum to `num_slots`)."""
    return KVSnapshot.of(measure(allocator, head), allocator.num_slots)


def shared_holders(
    tables: Iterable[tuple[Sequence, Seq[int | None], int]], references: Callable[[int | None], int],
    block_size: int, below: int,
) -> list[tuple[int, tuple[Sequence, ...]]]:  # fmt: skip
    """The blocks several of `tables` hold, among those starting before position `below`: (the
    block's first position, its holders), each block once. `tables`: (sequence, block table,
    first entry to read: those before it are freed); `references(block)`: what hold it (0 for
    a freed entry, None). Sharing (forks, beams, prefix-cache hits) maps a block at the same
    position in every table holding it, but not only in a leading run of a table (a sequence
    swapped back in takes the blocks still cached and others anew), so every entry is read."""
    holders: dict[int, tuple[int, list[Sequence]]] = {}
    for seq, table, start in tables:
        for j, block in enumerate(table[start : -(-below // block_size)], start=start):
            if references(block) > 1:
                holders.setdefault(block, (j * block_size, []))[1].append(seq)
    return [(first, tuple(held)) for first, held in holders.values() if len(held) > 1]
