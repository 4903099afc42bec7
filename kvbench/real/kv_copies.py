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
        """Host swap space `[host blocks, L, bs, Hkv, D]` for K and V (pinned on CUDA), or None if
        the allocator has none. Block-major, so a run of host blocks is one contiguous span that a
        single DMA copy fills or reads: laid out as the arena (`[L, slots, ...]`), each swapped
        block was gathered and scattered by the CPU through pageable memory, and Figure 19's swap
        runs on the H200 moved about 2 GB/s, a harness cost rather than the link's. Made when the
        runner is built: made on first use, pinning landed inside the first swapping step, and
        each Figure 19 swap run on the H200 had one step of 2.3-3.0 s (its others: ms).
        """
        blocks = getattr(self.allocator, "num_host_blocks", 0)
        if not blocks:
            return None
        bs, pin = self.allocator.block_size, self.device.type == "cuda"
        return tuple(
            torch.empty((blocks, kv.shape[0], bs, *kv.shape[2:]), dtype=kv.dtype, pin_memory=pin)
            for kv in (self.arena.k, self.arena.v)
        )  # type: ignore[return-value]

    def _swap(self, batch: Batch) -> None:
        """Do the batch's device<->host block copies, in scheduled order, before the step.

        A run of swaps one way is gathered (out) or scattered (in) on the device through a
        block-major staging tensor `[N, L, bs, Hkv, D]`, and each span of consecutive host blocks
        crosses the link as one copy, asynchronous against pinned memory. Every copy is on the
        current stream, so the next run, step or swap that touches the same blocks comes after it.
        """
        if not batch.swaps:
            return
        for to_host, run in groupby(batch.swaps, key=lambda swap: swap[0]):
            pairs = [(src, dst) if to_host else (dst, src) for _, src, dst in run]  # (device, host)
            slots = self._slots([device for device, _ in pairs]).to(self.device)  # [N * bs]
            spans = host_spans([host for _, host in pairs])
            for host, arena in zip(self._host, (self.arena.k, self.arena.v), strict=True):
                # sizes spelled out, no -1: an MLA arena's V holds zero elements
                layers, blocked = arena.shape[0], host.shape[1:]  # blocked: [L, bs, Hkv, D]
                if to_host:
                    staged = (
                        arena[:, slots].view(layers, len(pairs), *blocked[1:]).transpose(0, 1).contiguous()
                    )
                    for first, start, count in spans:  # staged: [N, L, bs, Hkv, D]
                        host[start : start + count].copy_(staged[first : first + count], non_blocking=True)
                else:
                    staged = torch.empty((len(pairs), *blocked), dtype=host.dtype, device=self.device)
                    for first, start, count in spans:
                        staged[first : first + count].copy_(host[start : start + count], non_blocking=True)
                    arena[:, slots] = staged.transpose(0, 1).reshape(layers, len(slots), *arena.shape[2:])

    def _slots(self, blocks: list[int] | torch.Tensor) -> torch.Tensor:
        """Slot indices `[N * bs]` of these blocks, in order (on the CPU)."""
        bs = self.allocator.block_size
        return (torch.as_tensor(blocks).reshape(-1, 1) * bs + torch.arange(bs)).reshape(-1)

    def _block_slots(self, pairs: tuple[tuple[int, int], ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot indices `[N * bs]` of the first and second blocks of each pair (on the CPU)."""
        blocks = torch.tensor(pairs)  # [N, 2]
        return self._slots(blocks[:, 0]), self._slots(blocks[:, 1])

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


def host_spans(blocks: list[int]) -> list[tuple[int, int, int]]:
    """Runs of consecutive host blocks in a swap run's order: (index of the run's first swap,
    first host block, count), so each run crosses the link as one copy."""
    spans: list[tuple[int, int, int]] = []
    for i, block in enumerate(blocks):
        if spans and spans[-1][1] + spans[-1][2] == block and spans[-1][0] + spans[-1][2] == i:
            first, start, count = spans[-1]
            spans[-1] = (first, start, count + 1)
        else:
            spans.append((i, block, 1))
    return spans
