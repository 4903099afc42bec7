"""KV store: write the K/V of the step's new tokens into their arena slots.

One program per new token copies its `[Hkv, D]` keys and values to `slot_mapping[t]`, which
the runner derived from the engine's addressing (block table or extent), so the kernel is the
same for paged and contiguous engines. A slot of -1 marks a padding row (a CUDA-graph batch
padded up to its bucket) and is skipped: padding never touches the arena.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ks, stride_kch, stride_vs, stride_vch,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, BLOCK_H)[:, None]  # [Hkv, 1]
        d = tl.arange(0, BLOCK_D)[None, :]  # [1, D]
        mask = (h < KV_HEADS) & (d < HEAD_DIM)
        k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
        tl.store(k_cache_ptr + slot * stride_ks + h * stride_kch + d, k, mask=mask)
        tl.store(v_cache_ptr + slot * stride_vs + h * stride_vch + d, v, mask=mask)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """New K/V `[T, Hkv, D]` -> arena `[S, Hkv, D]` at `slot_mapping` `[T]` (slot -1: skipped)."""
    tokens, kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        KV_HEADS=kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )  # fmt: skip
