"""Rank 0's model and runner: the single-process ones, driving the workers as they go.

`ParallelModel` is what `ModelRunner` and `DecodeLoop` call as their model: each call sends
the forward's inputs to the workers, then runs rank 0's shard, whose row-parallel layers
meet the workers' in all-reduces. Rank 0 holds the whole (replicated) LM head, so its logits
are the full vocabulary's and sampling is the single-process code, untouched.

`ParallelRunner` is `ModelRunner` with two additions: the arena operations it does outside
the model (swaps, copy-on-write copies) are first sent to the workers, which call the same
methods on their arenas; and decode steps run eagerly (no CUDA graphs: a worker learns each
step's inputs from rank 0's host, which a replayed graph would bypass). Everything else, the
engines included, cannot tell it from a single process.
"""

from __future__ import annotations

import torch

from engines.scheduler import Batch
from kvbench.errors import KvbenchError
from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.causal_lm import CausalLM
from kvbench.parallel.channel import Command, Mirror, encode_forward, encode_mirror
from kvbench.real.model_runner import ModelRunner
from kvbench.runner import StepResult


class ParallelModel:
    """Rank 0's shard behind `CausalLM`'s call: `model(input_ids, positions, meta, arena)`."""

    def __init__(self, shard: CausalLM, session) -> None:
        self.shard = shard
        self.session = session  # a launcher.ParallelSession

    @property
    def spec(self):
        return self.shard.spec  # the whole model's architecture

    def parameters(self):
        return self.shard.parameters()  # rank 0's

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, arena: KVArena
    ) -> torch.Tensor:
        """input_ids, positions `[T]` -> float32 logits `[B, vocab]`, computed by every rank."""
        if arena is not self.session.current:
            raise ValueError("a tensor-parallel forward must use the session's current arena")
        ints, tensors = encode_forward(input_ids, positions, meta)
        self.session.send(Command.FORWARD, ints, tensors)
        return self.shard(input_ids, positions, meta, arena)


class ParallelRunner(ModelRunner):
    """`ModelRunner` on rank 0 of a tensor-parallel group (the engines' `Runner`).

    Every method that moves K/V outside a forward is overridden to have the workers call the
    same method on their own arenas first (`_mirror`); a batch asking for a move this class
    does not mirror yet stops the run instead of decoding from stale K/V on the workers.
    """

    def __init__(self, session, arena: KVArena, allocator, **options) -> None:
        options["cuda_graphs"] = False  # eager decode: see the module docstring
        options["prefill_graphs"] = False  # and eager prefill, as the workers run it
        super().__init__(session.model, arena, allocator, **options)
        self.session = session

    def run(self, batch: Batch, max_steps: int, start_s: float, until_s: float) -> StepResult:
        if getattr(batch, "slot_copies", ()):  # contiguous forks (sampling, beams): not mirrored yet
            raise KvbenchError("--tensor-parallel: contiguous engines cannot fork K/V across ranks yet")
        return super().run(batch, max_steps, start_s, until_s)

    def _swap(self, batch: Batch) -> None:
        if batch.swaps:
            self._mirror(Mirror.SWAP, tuple((int(to_host), src, dst) for to_host, src, dst in batch.swaps))
        super()._swap(batch)

    def _copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        if copies:
            self._mirror(Mirror.COPY_BLOCKS, copies)
        super()._copy_blocks(copies)

    def _mirror(self, op: Mirror, rows: tuple[tuple[int, ...], ...]) -> None:
        """Have every worker do `op` on its mirror `ModelRunner` (its arena) with these block rows."""
        geometry = getattr(self.allocator, "block_size", 1), getattr(self.allocator, "num_host_blocks", 0)
        ints, tensors = encode_mirror(op, *geometry, rows)
        self.session.send(Command.MIRROR, ints, tensors)
