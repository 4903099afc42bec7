"""How many split-KV partitions a decode launch uses, and where their partials wait to be merged.

Triton-free: the runner sizes graphs and allocates the workspace with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

PROGRAMS_PER_SM = 8  # (batch, KV head, split) programs per SM that keep the loads flowing
MIN_SPLIT_TOKENS = 512  # below this, a split's fixed cost (and the merge) outweighs its parallelism
MAX_SPLITS = 16


@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(batch: int, kv_heads: int, max_context: int, device: torch.device) -> int:
    """A power of two of splits that gives every SM about 8 programs, none under 512 tokens.

    Large batches need none (batch x KV heads programs fill the GPU already); a small batch
    with long contexts is split until it does. Tuned on an H200 over the kernels issue's cells
    (`benchmarks/tune_decode.py`). On CPU (the interpreter) a few splits keep the merge path
    exercised.
    """
    longest = max(1, -(-max_context // MIN_SPLIT_TOKENS))
    if device.type != "cuda":
        return min(4, longest)
    wanted = -(-PROGRAMS_PER_SM * _sm_count(device) // max(batch * kv_heads, 1))
    splits = 1 << (min(wanted, longest, MAX_SPLITS).bit_length() - 1)  # round down to a power of two
    return max(1, splits)


@dataclass(frozen=True)
class DecodeWorkspace:
    """Split-KV scratch of decode attention, allocated once for the largest launch a caller makes.

    Split s of sequence b writes its partial output for query head h at `part[b, h, s]` and the
    log-sum-exp beside it at `lse[b, h, s]`; a merge weighs them into the output. For the fused
    merge, `tickets[b, kv_head]` counts the splits of (b, kv_head) that have finished: the one
    that finishes last merges, then sets it back to 0. So the tickets are zero between launches
    (allocated zeroed, never written otherwise), and one workspace serves every launch that fits
    it, of any batch or split count, eagerly or replayed in a CUDA graph, with no memset per call.

    Launches sharing a workspace must run one after another (one stream, as a model's layers
    do): two at once would mix their partials and tickets.
    """

    part: torch.Tensor  # [N, H, S, D] float32: each split's normalized partial output
    lse: torch.Tensor  # [N, H, S] float32: its log-sum-exp (-inf: the split saw no position)
    tickets: torch.Tensor  # [N, Hkv] int32: finished splits of (sequence, KV head); 0 between launches

    @classmethod
    def allocate(
        cls, max_batch: int, heads: int, kv_heads: int, head_dim: int, max_splits: int, device, *,
        tickets: bool = True,
    ) -> DecodeWorkspace:  # fmt: skip
        """Room for `max_batch` sequences of `heads` query heads in up to `max_splits` splits.

        `tickets=False` leaves out the fused merge's counters (a merge kernel does not use them),
        sparing their memset when a call allocates its own scratch.
        """
        part = torch.empty((max_batch, heads, max_splits, head_dim), dtype=torch.float32, device=device)
        lse = torch.empty((max_batch, heads, max_splits), dtype=torch.float32, device=device)
        counters = torch.zeros((max_batch if tickets else 0, kv_heads), dtype=torch.int32, device=device)
        return cls(part, lse, counters)

    @property
    def max_splits(self) -> int:
        return self.part.shape[2]

    def check(
        self, batch: int, heads: int, kv_heads: int, head_dim: int, splits: int, device, *, fused: bool
    ) -> None:
        """Raise ValueError unless a launch of this shape fits (the kernels index it unchecked)."""
        rows, room_heads, room_splits, room_dim = self.part.shape
        fits = (
            batch <= rows
            and (heads, kv_heads, head_dim) == (room_heads, self.tickets.shape[1], room_dim)
            and splits <= room_splits
            and (not fused or batch <= self.tickets.shape[0])
            and all(t.is_contiguous() for t in (self.part, self.lse, self.tickets))  # indexed by shape
            and self.part.device == torch.device(device)
        )
        if not fits:
            raise ValueError(
                f"decode workspace {tuple(self.part.shape)} (tickets {tuple(self.tickets.shape)}, "
                f"{self.part.device}) cannot hold batch {batch}, heads {heads}, kv heads {kv_heads}, "
                f"head dim {head_dim}, {splits} splits{', fused merge' if fused else ''} on {device}"
            )
