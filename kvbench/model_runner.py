"""The real runner: one step of a scheduled batch through the model, on the device, timed.

Every engine uses this same runner; only the addressing differs (a block table or an extent,
straight from the engine's allocator). The step time it reports is wall time from the start
of input preparation to the sampled tokens being on the host, so host-side overhead counts.
"""

from __future__ import annotations

import time
from itertools import groupby

import numpy as np
import torch

from engines.allocator import BlockTable, Extent, KVAllocator
from engines.scheduler import Batch
from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.causal_lm import CausalLM
from kvbench.modeling.sampling import sample
from kvbench.runner import StepResult
from kvbench.sequence import Sequence


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        arena: KVArena,
        allocator: KVAllocator,
        *,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.arena = arena
        self.allocator = allocator
        self.temperature = temperature
        self.seed = seed
        self.device = arena.k.device
        self._prompts: dict[int, np.ndarray] = {}  # request id -> prompt token ids
        self._host: tuple[torch.Tensor, torch.Tensor] | None = None  # swap space, made on first use

    def run(self, batch: Batch, max_steps: int, start_s: float, until_s: float) -> StepResult:
        start = time.perf_counter()
        self._swap(batch)
        meta, input_ids, positions = self._inputs(batch)
        self._copy_blocks(batch.block_copies)
        with torch.inference_mode():
            logits = self.model(input_ids, positions, meta, self.arena)  # [B, V]
            last = positions[meta.cu_seqlens[1:] - 1]  # [B] position of each sampled token's input
            ids = torch.tensor([seq.seq_id for seq in batch.seqs], device=self.device)
            tokens = sample(logits, self.temperature, self.seed, ids, last).tolist()
        return StepResult(np.array([time.perf_counter() - start]), [[t] for t in tokens])

    def prompt_ids(self, seq: Sequence) -> np.ndarray:
        """The trace's prompt ids, or seeded random ids when the trace has only lengths."""
        request = seq.request
        cached = self._prompts.get(request.request_id)
        if cached is None:
            if request.prompt_ids is not None:
                cached = np.asarray(request.prompt_ids, dtype=np.int64)
            else:
                rng = np.random.default_rng([self.seed, request.request_id])
                cached = rng.integers(0, self.model.spec.vocab, request.prompt_len)
            self._prompts[request.request_id] = cached
        return cached

    def _token_ids(self, seq: Sequence, lo: int, hi: int) -> np.ndarray:
        """Ids of positions [lo, hi): prompt first, then the sampled outputs."""
        prompt = self.prompt_ids(seq)
        if hi <= len(prompt):
            return prompt[lo:hi]
        outputs = np.asarray(seq.output_ids[max(lo - len(prompt), 0) : hi - len(prompt)], dtype=np.int64)
        return np.concatenate([prompt[lo:], outputs]) if lo < len(prompt) else outputs

    def _inputs(self, batch: Batch) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor]:
        ids, positions, slots, seqlens = [], [], [], []
        addressing = [self.allocator.addressing(seq) for seq in batch.seqs]
        for seq, where in zip(batch.seqs, addressing, strict=True):
            lo, hi = seq.num_computed, seq.num_tokens
            pos = np.arange(lo, hi)  # [n] positions computed in this step
            ids.append(self._token_ids(seq, lo, hi))
            positions.append(pos)
            slots.append(_slots(where, pos))
            seqlens.append(hi - lo)
        dev = self.device
        cu = torch.tensor(np.concatenate([[0], np.cumsum(seqlens)]), device=dev)  # [B + 1]
        slot_mapping = torch.from_numpy(np.concatenate(slots)).to(dev)  # [T]
        input_ids = torch.from_numpy(np.concatenate(ids)).to(dev)  # [T]
        pos = torch.from_numpy(np.concatenate(positions)).to(dev)  # [T]
        if batch.is_prefill:
            return AttentionMetadata(True, slot_mapping, cu, tuple(seqlens)), input_ids, pos
        context = [seq.num_tokens for seq in batch.seqs]
        tables = starts = None
        block_size = 0
        if isinstance(addressing[0], BlockTable):
            block_size = addressing[0].block_size
            width = max(len(a.blocks) for a in addressing)
            padded = [list(a.blocks) + [a.blocks[0]] * (width - len(a.blocks)) for a in addressing]
            tables = torch.tensor(padded, device=dev)  # [B, max_blocks]
        else:
            starts = torch.tensor([a.start for a in addressing], device=dev)  # [B]
        meta = AttentionMetadata(
            False, slot_mapping, cu, tuple(seqlens), context_lens=torch.tensor(context, device=dev),
            block_tables=tables, block_size=block_size, starts=starts, max_context=max(context),
        )  # fmt: skip
        return meta, input_ids, pos

    def _swap(self, batch: Batch) -> None:
        """Do the batch's device<->host block copies, in scheduled order, before the step."""
        if not batch.swaps:
            return
        if self._host is None:
            alloc = self.allocator
            shape = (self.arena.k.shape[0], alloc.num_host_blocks * alloc.block_size, *self.arena.k.shape[2:])
            pin = self.device.type == "cuda"
            self._host = (
                torch.empty(shape, dtype=self.arena.k.dtype, pin_memory=pin),  # [L, host slots, Hkv, D]
                torch.empty(shape, dtype=self.arena.v.dtype, pin_memory=pin),
            )
        for to_host, run in groupby(batch.swaps, key=lambda swap: swap[0]):
            source, target = self._block_slots(tuple((src, dst) for _, src, dst in run))
            for host, arena in zip(self._host, (self.arena.k, self.arena.v), strict=True):
                if to_host:
                    host[:, target] = arena[:, source.to(self.device)].cpu()
                else:
                    arena[:, target.to(self.device)] = host[:, source].to(self.device)

    def _block_slots(self, pairs: tuple[tuple[int, int], ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot indices `[N * bs]` of the first and second blocks of each pair (on the CPU)."""
        bs = self.allocator.block_size
        blocks = torch.tensor(pairs)  # [N, 2]
        offsets = torch.arange(bs)  # [bs]
        return (blocks[:, :1] * bs + offsets).reshape(-1), (blocks[:, 1:] * bs + offsets).reshape(-1)

    def _copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        """Copy-on-write: duplicate shared blocks (all layers) before the step writes into them."""
        if not copies:
            return
        src, dst = (slots.to(self.device) for slots in self._block_slots(copies))  # [N * bs] each
        self.arena.k[:, dst] = self.arena.k[:, src]
        self.arena.v[:, dst] = self.arena.v[:, src]


def _slots(addressing: Extent | BlockTable, positions: np.ndarray) -> np.ndarray:
    """Arena slots of `positions` `[n]` under an extent or a block table."""
    if isinstance(addressing, Extent):
        return addressing.start + positions
    blocks = np.asarray(addressing.blocks, dtype=np.int64)
    return (
        blocks[positions // addressing.block_size] * addressing.block_size + positions % addressing.block_size
    )
