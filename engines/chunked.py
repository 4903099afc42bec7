"""Chunked prefill (Sarathi-Serve, OSDI 2024): one token budget per step, decodes never stall.

`IterationScheduler` runs a step of new prompts alone, so every running request waits for a
whole prefill (vLLM 2023). Here each step spends `max_num_batched_tokens` tokens: every running
decode first (one token each: a prefill never holds one up), then the rest on prompt chunks in
arrival order (the oldest partially prefilled request first, then admissions from the head of
the queue). A prompt longer than what is left is split across consecutive steps; a step with
chunks is a *mixed* step, priced and run as a prefill (`Batch.chunks`). A request's first
token comes with its last chunk; earlier chunks sample nothing.

Memory is admitted as every engine admits it unchunked: the allocator's `allocate` takes the
prompt's slots (paged: its blocks; contiguous: its reservation) when the request is admitted,
at its first chunk. The one exception is a window group of the mixed-layer engines, which takes
its blocks chunk by chunk (`HybridAllocator.target_blocks`: the allocator is built knowing the
step budget, and `append_all` before each step gives a partial prompt its next chunk's blocks).
A partially prefilled request is running: it holds a seat and its memory, and is preempted
(newest first) like any other.

Why budget >= `max_num_seqs` (`config.check_chunked`): every running decode must fit in a
step, and while a request is partially prefilled at most `max_num_seqs - 1` others run, so its
chunk always gets a token; prefills can then slow decodes down but never starve, nor be starved.
Requests with several outputs are refused: a group forks after its prompt's single prefill step.
"""

from __future__ import annotations

from dataclasses import replace

from engines.allocator import KVAllocator
from engines.batch import Batch, SchedulerConfig
from engines.scheduler import IterationScheduler
from kvbench.errors import KvbenchError
from kvbench.sequence import SeqStatus, Sequence


class ChunkedScheduler(IterationScheduler):
    """Continuous batching with a per-step token budget shared by decodes and prompt chunks."""

    def __init__(self, allocator: KVAllocator, config: SchedulerConfig) -> None:
        super().__init__(allocator, config)
        if not self.token_cap >= self.max_num_seqs:  # config.check_chunked says so to the user
            raise ValueError(f"token budget {self.token_cap} below max_num_seqs {self.max_num_seqs}")

    def add(self, seq: Sequence) -> None:
        if seq.group is not None:
            raise KvbenchError(
                f"--chunked-prefill: request {seq.seq_id} asks for several outputs (--n or --beam-width), "
                "which fork after a single prefill step; run it without --chunked-prefill"
            )
        super().add(seq)

    def schedule(self) -> Batch | None:
        """Slots for every running sequence's next token, then chunks up to the budget."""
        self._unsettled = False
        if self.swapped:
            self._bring_back()
            self._unsettled |= not self.swapped  # all back: the next step may admit again
        copies: list[tuple[int, int]] = []
        if self.running:  # a partial prompt already holds its slots: append gives it none
            placed = self.allocator.append_all(self.running)
            copies = placed if placed is not None else self._place_with_preemption()
        decodes = [seq for seq in self.running if seq.num_tokens - seq.num_computed == 1]
        left = self.token_cap - len(decodes)  # >= 1 whenever a prompt waits (see the module docstring)
        chunk_of: dict[Sequence, int] = {}
        for seq in self.running:  # partially prefilled requests, oldest first
            todo = seq.num_tokens - seq.num_computed
            if todo > 1 and left > 0:
                chunk_of[seq] = min(todo, left)
                left -= chunk_of[seq]
        if not self.swapped:  # FCFS: nothing overtakes a swapped-out request
            self._admit_chunks(left, chunk_of)
        if not chunk_of:
            return self._decode_batch(copies) if self.running else None
        chunk_of.update(dict.fromkeys(decodes, 1))
        seqs = tuple(seq for seq in self.running if seq in chunk_of)  # arrival order
        assert len(seqs) == len(chunk_of), "a chunk for a sequence that is not running"
        chunks = tuple(chunk_of[seq] for seq in seqs)
        context = sum([seq.num_computed + chunk for seq, chunk in zip(seqs, chunks, strict=True)])
        return replace(self._batch(seqs, True, sum(chunks), context, 1, tuple(copies)), chunks=chunks)

    def _admit_chunks(self, left: int, chunk_of: dict[Sequence, int]) -> None:
        """Admit from the head of the queue while budget, seats and memory allow; each admitted
        request's first chunk goes into `chunk_of`."""
        while left > 0 and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.allocator.can_allocate(seq):
                break
            self.waiting.popleft()
            self.num_preempted -= seq.status is SeqStatus.PREEMPTED
            self.allocator.allocate(seq)  # the whole prompt's slots, as at an unchunked admission
            seq.status = SeqStatus.RUNNING
            self._run(seq)
            chunk_of[seq] = min(seq.num_tokens - seq.num_computed, left)  # a prefix cache hit is not fed
            left -= chunk_of[seq]

    def _decode_batch(self, copies: list[tuple[int, int]]) -> Batch:
        """Every running sequence decodes (no prompt waits for a chunk): the ordinary decode batch."""
        running = self.running
        context = sum([seq.num_tokens for seq in running])
        shortest = min([seq.request.output_len - seq.num_generated for seq in running])
        return self._batch(tuple(running), False, len(running), context, shortest, tuple(copies))
