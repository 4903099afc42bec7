"""Next-token choice: greedy, or seeded sampling that no batch composition can change.

A token's randomness is a hash of (seed, request id, position, vocabulary index), turned into
Gumbel noise: `argmax(logits / temperature + gumbel)` samples from the softmax, and a request
draws the same tokens whichever engine batches it with whatever else. Preempted and recomputed
requests draw them again identically.
"""

from __future__ import annotations

import torch

_MASK = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (int64 arithmetic kept below 2**63, so it is exact everywhere)."""
    x = x & _MASK
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK
    return (x >> 16) ^ x


def sample(
    logits: torch.Tensor, temperature: float, seed: int, request_ids: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """logits `[B, V]` (float32), request_ids and positions `[B]` int64 -> token ids `[B]`."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    vocab = torch.arange(logits.shape[1], device=logits.device)  # [V]
    key = _hash32(_hash32(_hash32(request_ids + seed * 7919) + positions) * 31 + 17)  # [B]
    bits = _hash32(key[:, None] ^ (vocab[None, :] * 0x27D4EB2D))  # [B, V] in [0, 2**32)
    uniform = (bits.double() + 0.5) / 2**32  # (0, 1)
    gumbel = -torch.log(-torch.log(uniform)).float()  # [B, V]
    return (logits / temperature + gumbel).argmax(dim=-1)
