"""What a scheduler hands the runner each step, and the scheduler's configuration."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engines.allocator import SlotCopy
from kvbench.sequence import Sequence

DEFAULT_MAX_NUM_SEQS = 256  # continuous batching's cap on running sequences (vLLM's default)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int | None = None  # cap on running sequences (B); None: engine default
    max_num_batched_tokens: int | None = None  # cap on prompt tokens per prefill step
    preemption: str = "recompute"  # or "swap": park a victim's blocks in host memory
    # Sarathi-Serve's chunked prefill (`engines.chunked`): `max_num_batched_tokens` is then every
    # step's token budget, decodes first, prompts split into chunks to fill the rest
    chunked_prefill: bool = False


@dataclass(frozen=True, slots=True)
class Batch:
    """One step's work: the sequences whose uncomputed tokens go through the model."""

    seqs: tuple[Sequence, ...]
    is_prefill: bool
    num_tokens: int  # tokens fed through the model: prompts (less cached prefixes), or one per sequence
    num_context: int  # K/V tokens attended (each sequence's length after the step)
    steps_to_finish: int = 1  # decode steps until the first sequence finishes
    block_copies: tuple[tuple[int, int], ...] = ()  # (src, dst) copy-on-write before the step
    # block copies between device and host, in the order they were scheduled (which matters:
    # a block freed by one swap may be taken by the next): (to_host, source block, target block)
    swaps: tuple[tuple[bool, int, int], ...] = ()
    slot_copies: tuple[SlotCopy, ...] = ()  # contiguous forks: K/V ranges to copy before the step
    copied_slots: int = 0  # slots the block and slot copies move
    has_groups: bool = False  # some sequence belongs to a group: branch it after the step
    # vmm: driver pages mapped and unmapped for this batch (admissions, step 0's growth,
    # reclaimed and freed pages since the last batch), and, for a decode segment, the pages
    # each of its k steps maps as it grows (`VirtualAllocator.map_plan`: `[k]`)
    mapped_pages: int = 0
    unmapped_pages: int = 0
    map_plan: Callable[[int], np.ndarray] | None = None
    # chunked prefill: the tokens each sequence computes in this step (`[len(seqs)]`: 1 for a
    # decode row, a prompt's chunk otherwise, from `num_computed`); None: every sequence computes
    # `[num_computed, num_tokens)`. A row whose chunk ends at `num_tokens` samples a token; the
    # others (non-final chunks) sample none
    chunks: tuple[int, ...] | None = None

    @property
    def kind(self) -> str:
        """steps.csv's `kind`: "prefill", "decode", or "mixed" (a chunked-prefill step with
        prompt chunks, beside the running decodes if any)."""
        if self.chunks is not None:
            return "mixed"
        return "prefill" if self.is_prefill else "decode"

    def computed_to(self) -> list[int]:
        """Each sequence's computed length after the step (`[len(seqs)]`): the context its
        attention reads, `num_tokens` unless a chunk stops short of it."""
        if self.chunks is None:
            return [seq.num_tokens for seq in self.seqs]
        return [seq.num_computed + chunk for seq, chunk in zip(self.seqs, self.chunks, strict=True)]

    def samples(self) -> list[bool]:
        """Whether each sequence samples a token in this step (all but non-final chunks)."""
        if self.chunks is None:
            return [True] * len(self.seqs)
        return [end == seq.num_tokens for seq, end in zip(self.seqs, self.computed_to(), strict=True)]
