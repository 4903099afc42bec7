"""K/V moved outside the model, before a step: swaps to and from host memory, and copies.

Three kinds, in the order a step needs them: swaps (whole blocks between the device arena and
pinned host memory, in scheduled order), copy-on-write (paged: a shared block duplicated
before a step writes into it) and fork copies (contiguous: a parent's K/V, prompt and outputs
so far, copied into a parallel sample's or a beam's own extent).
"""

from __future__ import annotations

from itertools import groupby

import numpy as np
import torch

from engines.allocator import KVAllocator
from engines.scheduler import Batch
from kvbench.modeling.arena import KVArena


class ArenaCopies:
    """The real runner's arena copies (a mixin: it needs `arena`, `allocator`, `device`, and `_host`,
    which the runner sets from `_swap_space`)."""

    arena: KVArena
    allocator: KVAllocator  # a tensor-parallel worker's stands in with the block geometry only
    device: torch.device
    _host: tuple[torch.Tensor, torch.Tensor] | None

    def _swap_space(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Host swap space `[L, host slots, Hkv, D]` for K and V (pinned on CUDA), or None if the
        allocator has none. Made when the runner is built: made on first use, pinning landed
        inside the first swapping step, and each Figure 19 swap run on the H200 had one step of
        2.3-3.0 s (its others: ms).
        """
        blocks = getattr(self.allocator, "num_host_blocks", 0)
        if not blocks:
            return None
        shape = (self.arena.k.shape[0], blocks * self.allocator.block_size, *self.arena.k.shape[2:])
        pin = self.device.type == "cuda"
        return (
            torch.empty(shape, dtype=self.arena.k.dtype, pin_memory=pin),
            torch.empty(shape, dtype=self.arena.v.dtype, pin_memory=pin),
        )

    def _swap(self, batch: Batch) -> None:
        """Do the batch's device<->host block copies, in scheduled order, before the step."""
        if not batch.swaps:
            return
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
        if hasattr(self.arena, "copy_bytes"):  # a grouped arena: a block is its group's bytes in one buffer
            for old, new in copies:
                self.arena.copy_bytes(self.allocator.block_bytes(old), self.allocator.block_bytes(new))
            return
        src, dst = (slots.to(self.device) for slots in self._block_slots(copies))  # [N * bs] each
        self.arena.k[:, dst] = self.arena.k[:, src]
        self.arena.v[:, dst] = self.arena.v[:, src]

    def _copy_slots(self, copies: tuple[tuple[int, int, int], ...]) -> None:
        """Contiguous forks: copy each parent's K/V `[src, src + n)` to `[dst, dst + n)` (all layers)."""
        if not copies:
            return
        src = np.concatenate([np.arange(s, s + n) for s, _, n in copies])  # [N]
        dst = np.concatenate([np.arange(d, d + n) for _, d, n in copies])  # [N]
        src_t, dst_t = (torch.from_numpy(slots).to(self.device) for slots in (src, dst))
        self.arena.k[:, dst_t] = self.arena.k[:, src_t]
        self.arena.v[:, dst_t] = self.arena.v[:, src_t]
