"""PyTorch references for every kernel: the oracle the tests hold the kernels to.

Same contracts as the kernels, written for clarity rather than speed: attention gathers each
sequence's context slots out of the arena through its addressing and runs plain softmax
attention in float32. Addressing, for position `p` of sequence `b`:

    paged:       slot = block_tables[b, p // block_size] * block_size + p % block_size
    contiguous:  slot = starts[b] + p
"""

from __future__ import annotations

import torch


def context_slots(
    context_lens: torch.Tensor, max_context: int, *, block_tables=None, block_size: int = 0, starts=None,
    first=None,
) -> torch.Tensor:  # fmt: skip
    """`[B, max_context]` arena slot of every position each sequence attends.

    Padding past a sequence's context repeats its last position (or position 0 for an empty
    context), so nothing reads a slot the sequence has not written: an unwritten slot may hold
    anything, even NaN, and a masked NaN still poisons a weighted sum. `first` `[B]` (a sliding
    window's left bound) starts each row at that position, so nothing before it is read.
    """
    device = context_lens.device
    positions = torch.arange(max_context, device=device)[None, :]  # [1, C]
    if first is not None:
        positions = positions + first.long()[:, None]  # [B, C]
    last = (context_lens.long() - 1).clamp(min=0)  # [B]
    positions = torch.minimum(positions, last[:, None])  # [B, C]
    if block_tables is not None:
        blocks = block_tables.long().gather(1, positions // block_size)  # [B, C]
        return blocks * block_size + positions % block_size
    if starts is None:
        raise ValueError("attention needs block_tables (paged) or starts (contiguous)")
    return starts.long()[:, None] + positions  # [B, C]


def store_kv_ref(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write new K/V `[T, Hkv, D]` into the arena `[S, Hkv, D]` at `slot_mapping` `[T]`; skip slot < 0."""
    keep = slot_mapping >= 0  # [T] padding rows carry slot -1
    k_cache[slot_mapping[keep]] = k[keep]
    v_cache[slot_mapping[keep]] = v[keep]


def decode_attention_ref(
    q, k_cache, v_cache, context_lens, *, scale: float, block_tables=None, block_size: int = 0, starts=None
) -> torch.Tensor:
    """q `[B, H, D]` attends its sequence's first `context_lens[b]` arena positions -> `[B, H, D]`.

    A sequence with an empty context gets zeros.
    """
    batch, heads, _ = q.shape
    group = heads // k_cache.shape[1]
    width = max(int(context_lens.max()), 1) if batch else 1
    slots = context_slots(
        context_lens, width, block_tables=block_tables, block_size=block_size, starts=starts
    )
    keys = k_cache[slots].float().repeat_interleave(group, dim=2)  # [B, C, H, D]
    values = v_cache[slots].float().repeat_interleave(group, dim=2)  # [B, C, H, D]
    scores = torch.einsum("bhd,bchd->bhc", q.float(), keys) * scale  # [B, H, C]
    valid = torch.arange(width, device=q.device)[None, :] < context_lens[:, None]  # [B, C]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # empty context: all -inf -> zeros
    values = values.masked_fill(~valid[:, :, None, None], 0.0)  # an empty context read a poisoned slot
    return torch.einsum("bhc,bchd->bhd", weights, values).to(q.dtype)


def extend_attention_ref(
    q, k_cache, v_cache, cu_seqlens, context_lens, *, scale: float, block_tables=None, block_size: int = 0,
    starts=None,
) -> torch.Tensor:  # fmt: skip
    """New tokens attend causally to everything their sequence has in the arena.

    q `[T, H, D]` packs each sequence's new tokens (offsets `cu_seqlens` `[B + 1]`); they are
    the last of its `context_lens[b]` positions, whose K/V are already stored. Query at position
    `p` sees positions `<= p`, whether computed in this step or earlier (a shared prefix, a
    recomputed sequence's head, an earlier turn). Returns `[T, H, D]`.
    """
    out = torch.empty_like(q)
    cu = cu_seqlens.tolist()
    for b in range(len(cu) - 1):
        lo, hi, ctx = cu[b], cu[b + 1], int(context_lens[b])
        if hi == lo:
            continue
        one = slice(b, b + 1)
        slots = context_slots(
            context_lens[one], ctx,
            block_tables=None if block_tables is None else block_tables[one], block_size=block_size,
            starts=None if starts is None else starts[one],
        )[0]  # fmt: skip  # [C]
        group = q.shape[1] // k_cache.shape[1]
        keys = k_cache[slots].float().repeat_interleave(group, dim=1)  # [C, H, D]
        values = v_cache[slots].float().repeat_interleave(group, dim=1)  # [C, H, D]
        q_pos = torch.arange(ctx - (hi - lo), ctx, device=q.device)  # [n]
        causal = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]  # [n, C]
        scores = torch.einsum("nhd,chd->hnc", q[lo:hi].float(), keys) * scale  # [H, n, C]
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        out[lo:hi] = torch.einsum("hnc,chd->nhd", weights, values).to(q.dtype)
    return out


def mla_decode_attention_ref(
    q, cache, context_lens, *, scale: float, latent: int, block_tables=None, block_size: int = 0, starts=None
) -> torch.Tensor:  # fmt: skip
    """Absorbed MLA decode: q `[B, H, latent + rope]` attends its sequence's first
    `context_lens[b]` cached vectors (`cache` `[S, 1, latent + rope]`, one per token, shared by
    every head) -> `[B, H, latent]`; the values are the vectors' latent part.

    `decode_attention_ref` with the one shared entry, gathered once rather than repeated for
    every head (its grouped-query expansion would hold H copies of every latent of the batch:
    16 x 576 values a token on DeepSeek-V2-Lite). An empty context yields zeros.
    """
    width = max(int(context_lens.max()), 1) if q.shape[0] else 1
    addressing = {"block_tables": block_tables, "block_size": block_size, "starts": starts}
    slots = context_slots(context_lens, width, **addressing)  # [B, C]
    entries = cache[slots, 0].float()  # [B, C, latent + rope]
    scores = torch.einsum("bhd,bcd->bhc", q.float(), entries) * scale  # [B, H, C]
    valid = torch.arange(width, device=q.device)[None, :] < context_lens[:, None]  # [B, C]
    weights = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1).nan_to_num(0.0)
    values = entries[..., :latent].masked_fill(~valid[:, :, None], 0.0)  # padding may read NaN
    return torch.einsum("bhc,bcl->bhl", weights, values).to(q.dtype)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * normalize(x)`; normalised in fp32 and rounded before the weight, as HF Llama does."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotary_ref(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0
) -> torch.Tensor:
    """Rotary embedding of x `[T, heads, D]` at `positions` `[T]`: the halves are rotated (not pairs).
    cos and sin are multiplied by `scale` (YaRN's attention factor) before rounding to x's dtype,
    as transformers does."""
    dim = x.shape[-1]
    angles = positions[:, None].float() * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((angles, angles), dim=-1)[:, None, :]  # [T, 1, D]
    cos, sin = (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up
