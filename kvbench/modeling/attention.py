"""Attention over the KV arena, with the batch's layout passed explicitly (no global state).

Prefill (varlen): the new tokens of each sequence, packed as `[T, ...]` with `cu_seqlens`,
attend causally among themselves (a fresh or recomputed sequence has nothing else in the
arena), and their K/V are stored at `slot_mapping`.

Decode: one query per sequence attends to its first `context_lens[b]` positions, whose slots
come from the engine's addressing: a block table (paged) or an extent start (contiguous). This
module is the PyTorch reference; the Triton kernels of `kernels/` replace it when present.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionMetadata:
    is_prefill: bool
    slot_mapping: torch.Tensor  # [T] int64: arena slot of each new token
    cu_seqlens: torch.Tensor  # [B + 1] int64 offsets of each sequence's new tokens in [T]
    seqlens: tuple[int, ...]  # [B] new tokens per sequence (host copy, for the varlen loop)
    context_lens: torch.Tensor | None = None  # [B] decode: positions attended, new token included
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int64: paged addressing
    block_size: int = 0
    starts: torch.Tensor | None = None  # [B] int64: contiguous addressing (extent starts)
    max_context: int = 0  # decode: max(context_lens)

    def context_slots(self) -> torch.Tensor:
        """[B, max_context] slot of every attended position.

        Padding past a sequence's context repeats its last position, so attention never reads
        a slot the sequence has not written (an unwritten slot may hold anything, even NaN,
        and a masked NaN still poisons the weighted sum).
        """
        positions = torch.arange(self.max_context, device=self.slot_mapping.device)  # [C]
        positions = torch.minimum(positions[None, :], self.context_lens[:, None] - 1)  # [B, C]
        if self.block_tables is not None:
            blocks = self.block_tables.gather(1, positions // self.block_size)  # [B, C]
            return blocks * self.block_size + positions % self.block_size
        assert self.starts is not None, "decode needs block tables or extent starts"
        return self.starts[:, None] + positions  # [B, C]


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta) -> None:
    """Write new tokens' K/V `[T, Hkv, D]` into one layer's arena `[S, Hkv, D]`."""
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, scale: float,
) -> torch.Tensor:  # fmt: skip
    """q `[T, H, D]`, new k/v `[T, Hkv, D]` -> output `[T, H, D]`; stores the new K/V first."""
    store_kv(k_cache, v_cache, k, v, meta)
    if meta.is_prefill:
        return _prefill(q, k, v, meta, scale)
    return _decode(q, k_cache, v_cache, meta, scale)


def _prefill(q, k, v, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    out = torch.empty_like(q)  # [T, H, D]
    group = q.shape[1] // k.shape[1]
    start = 0
    for length in meta.seqlens:
        end = start + length
        qs = q[start:end].transpose(0, 1)  # [H, L, D]
        ks = k[start:end].transpose(0, 1).repeat_interleave(group, dim=0)  # [H, L, D]
        vs = v[start:end].transpose(0, 1).repeat_interleave(group, dim=0)  # [H, L, D]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)  # [H, L, D]
        out[start:end] = o.transpose(0, 1)
        start = end
    return out


def _decode(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    slots = meta.context_slots()  # [B, C]
    group = q.shape[1] // k_cache.shape[1]
    keys = k_cache[slots].transpose(1, 2).repeat_interleave(group, dim=1)  # [B, H, C, D]
    values = v_cache[slots].transpose(1, 2).repeat_interleave(group, dim=1)  # [B, H, C, D]
    positions = torch.arange(meta.max_context, device=q.device)  # [C]
    mask = positions[None, :] < meta.context_lens[:, None]  # [B, C]
    o = F.scaled_dot_product_attention(
        q[:, :, None, :], keys, values, attn_mask=mask[:, None, None, :], scale=scale
    )  # [B, H, 1, D]
    return o[:, :, 0, :]
