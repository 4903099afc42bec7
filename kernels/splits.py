"""How many split-KV partitions a decode launch uses (Triton-free: the runner sizes graphs with it)."""

from __future__ import annotations

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
