"""Attention with a sliding window and score soft-capping, in PyTorch: the torch backend's path
for such layers, and the oracle of the Triton kernels' window bound and cap.

A window layer (Mistral; Qwen2 past max_window_layers; Gemma's local layers) lets the query at
position `p` see positions `p - W < j <= p` only, as transformers masks them. Only those
positions are read: each sequence's gathered context starts at its window's left bound
(`context_slots(first=...)`), so blocks or extent slots wholly before it are never touched,
and a decode step gathers a fixed `W` positions (no host sync on the context length).
Gemma 2 caps every score at `cap * tanh(score / cap)` before masking. Same contracts as
`kernels/reference.py`; float32 softmax.
"""

from __future__ import annotations

import torch

from kernels.reference import context_slots


def _cap(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    return torch.tanh(scores / softcap) * softcap if softcap else scores


def decode_window_attention(
    q, k_cache, v_cache, context_lens, *, scale: float, window: int = 0, softcap: float = 0.0,
    block_tables=None, block_size: int = 0, starts=None,
) -> torch.Tensor:  # fmt: skip
    """q `[B, H, D]` attends its sequence's last `min(context_lens[b], window)` positions (all of
    them where `window` is 0) -> `[B, H, D]`; an empty context gives zeros."""
    batch, heads, _ = q.shape
    group = heads // k_cache.shape[1]
    lens = context_lens.long()
    if window:
        width, first = window, (lens - window).clamp(min=0)  # [B] left bound of each window
    else:
        width, first = (max(int(lens.max()), 1) if batch else 1), torch.zeros_like(lens)
    slots = context_slots(
        context_lens, width, block_tables=block_tables, block_size=block_size, starts=starts, first=first
    )  # [B, C]
    keys = k_cache[slots].float().repeat_interleave(group, dim=2)  # [B, C, H, D]
    values = v_cache[slots].float().repeat_interleave(group, dim=2)  # [B, C, H, D]
    scores = _cap(torch.einsum("bhd,bchd->bhc", q.float(), keys) * scale, softcap)  # [B, H, C]
    valid = torch.arange(width, device=q.device)[None, :] < (lens - first)[:, None]  # [B, C]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # empty context: all -inf -> zeros
    values = values.masked_fill(~valid[:, :, None, None], 0.0)
    return torch.einsum("bhc,bchd->bhd", weights, values).to(q.dtype)


def extend_window_attention(
    q, k_cache, v_cache, cu_seqlens, context_lens, *, scale: float, window: int = 0, softcap: float = 0.0,
    block_tables=None, block_size: int = 0, starts=None,
) -> torch.Tensor:  # fmt: skip
    """New tokens `[T, H, D]` (the last of their sequence's `context_lens[b]` positions) attend
    causally within their window to what the arena holds -> `[T, H, D]`."""
    out = torch.empty_like(q)
    cu = cu_seqlens.tolist()
    group = q.shape[1] // k_cache.shape[1]
    for b in range(len(cu) - 1):
        lo, hi, ctx = cu[b], cu[b + 1], int(context_lens[b])
        if hi == lo:
            continue
        first = max(ctx - (hi - lo) - window + 1, 0) if window else 0  # the first query's left bound
        one = slice(b, b + 1)
        slots = context_slots(
            context_lens[one], ctx - first,
            block_tables=None if block_tables is None else block_tables[one], block_size=block_size,
            starts=None if starts is None else starts[one], first=torch.tensor([first], device=q.device),
        )[0]  # fmt: skip  # [C]
        keys = k_cache[slots].float().repeat_interleave(group, dim=1)  # [C, H, D]
        values = v_cache[slots].float().repeat_interleave(group, dim=1)  # [C, H, D]
        q_pos = torch.arange(ctx - (hi - lo), ctx, device=q.device)[:, None]  # [n, 1]
        k_pos = torch.arange(first, ctx, device=q.device)[None, :]  # [1, C]
        seen = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window else True)  # [n, C]
        scores = _cap(torch.einsum("nhd,chd->hnc", q[lo:hi].float(), keys) * scale, softcap)  # [H, n, C]
        weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
        out[lo:hi] = torch.einsum("hnc,chd->nhd", weights, values).to(q.dtype)
    return out
