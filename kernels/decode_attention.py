"""Decode attention over the KV arena: one query token per sequence, paged or contiguous.

Decode attention is memory-bound: every context token's K and V is read once per step, and
that read is the kernel's floor. The kernel is built around reading it once, fast:

- **GQA grouping**: one program serves all `G = H / Hkv` query heads of a KV head, so each K/V
  tile is loaded once for the group (`q` is a `[G, D]` tile padded to 16 rows for `tl.dot`).
- **Split-KV** (flash-decoding): a sequence's context is cut into `num_splits` ranges handled
  by separate programs, each writing a partial output and its log-sum-exp; a second kernel
  merges them. Small batches with long contexts then still fill every SM.
- **Addressing** is one `constexpr` switch: a tile of positions `p` maps to arena slots through
  the block table (`table[p // bs] * bs + p % bs`, paged) or the extent start (`start + p`,
  contiguous). Everything else is the same code, so paged-vs-contiguous measures paging alone.
- Launch shapes depend only on the batch size and `num_splits`, never on context lengths (they
  are read on the device), so the kernels replay inside CUDA graphs.

fp16/bf16 inputs, fp32 accumulation; any head dim (tiles padded to a power of two >= 16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.splits import choose_num_splits

# (context positions per loop iteration, warps, pipeline stages): tuned on an H200
LAUNCH = (128, 4, 2)  # benchmarks/tune_decode.py; results/reference/kernel-tuning


@triton.jit
def tile_slots(table, first, hi, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Arena slots `[BLOCK_N]` of positions `first, first + 1, ...` through a block-table row.

    `first` is a multiple of BLOCK_N, so a tile spans whole blocks (or lies inside one): one
    table entry is loaded per block, not per position, and positions at or past `hi` read
    block 0 (their loads are masked by the caller).
    """
    if BLOCK_SIZE >= BLOCK_N:
        block = tl.load(table + first // BLOCK_SIZE).to(tl.int64)
        slots = block * BLOCK_SIZE + first % BLOCK_SIZE + tl.arange(0, BLOCK_N)
    else:
        index = first // BLOCK_SIZE + tl.arange(0, BLOCK_N // BLOCK_SIZE)  # [N / bs]
        blocks = tl.load(table + index, mask=index * BLOCK_SIZE < hi, other=0).to(tl.int64)
        grid = blocks[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :]  # [N / bs, bs]
        slots = tl.reshape(grid, (BLOCK_N,))
    return slots


@triton.jit
def load_kv_tile(
    k_ptr, v_ptr, table, start, first, hi, kv_head, stride_ks, stride_kh, stride_vs, stride_vh, d, d_mask,
    PAGED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """K and V `[BLOCK_N, D]` of one KV head at positions `first, ...` (< hi), and their mask.

    Paged: slots through the block-table row `table`; contiguous: `start + position`. The one
    place where the two addressing modes differ, shared by decode and extend attention.
    """
    pos = first + tl.arange(0, BLOCK_N)  # [N]
    n_mask = pos < hi
    if PAGED:  # noqa: SIM108 (a constexpr branch, compiled away)
        slots = tile_slots(table, first, hi, BLOCK_N, BLOCK_SIZE)  # [N]
    else:
        slots = start + pos
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(
        k_ptr + slots[:, None] * stride_ks + kv_head * stride_kh + d[None, :], mask=kv_mask, other=0.0
    )
    v = tl.load(
        v_ptr + slots[:, None] * stride_vs + kv_head * stride_vh + d[None, :], mask=kv_mask, other=0.0
    )
    return k, v, n_mask


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, lens_ptr, table_ptr, starts_ptr, out_ptr, lse_ptr,
    scale,
    stride_qb, stride_qh,
    stride_ks, stride_kh, stride_vs, stride_vh,
    stride_tb,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Program (b, kv head, split): attention of the group's queries over one context range."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context = tl.load(lens_ptr + b).to(tl.int32)
    # balanced ranges, rounded to whole tiles: split s covers [lo, hi)
    per_split = tl.cdiv(tl.cdiv(context, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, context)

    g = tl.arange(0, BLOCK_G)  # [G] query heads of this KV head
    d = tl.arange(0, BLOCK_D)  # [D]
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [G, D]
    q = (q.to(tl.float32) * scale).to(q.dtype)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max
    total = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table = table_ptr + b.to(tl.int64) * stride_tb  # paged: this sequence's block-table row
    start = tl.load(starts_ptr + b).to(tl.int64)  # contiguous: its extent (a placeholder when paged)
    for first in range(lo, hi, BLOCK_N):
        k, v, n_mask = load_kv_tile(
            k_ptr, v_ptr, table, start, first, hi, kv_head, stride_ks, stride_kh, stride_vs, stride_vh, d,
            d_mask, PAGED, BLOCK_N, BLOCK_SIZE,
        )  # fmt: skip  # [N, D] each
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [G, N] fp32
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])  # [G, N]
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    filled = total > 0.0  # an empty range (short context, or none at all) contributes nothing
    result = tl.where(filled[:, None], acc / tl.where(filled, total, 1.0)[:, None], 0.0)
    out_mask = g_mask[:, None] & d_mask[None, :]
    if DIRECT:  # one split: the result is final
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
            result.to(out_ptr.dtype.element_ty), mask=out_mask,
        )  # fmt: skip
    else:
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :],
            result, mask=out_mask,
        )  # fmt: skip
        lse = tl.where(filled, m + tl.log(tl.where(filled, total, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_mask)


@triton.jit
def _merge_splits_kernel(
    part_ptr, lse_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program (b, head): weight each split's partial output by its share of the softmax mass."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < NUM_SPLITS
    lse = tl.load(lse_ptr + b * stride_lb + head * stride_lh + s, mask=s_mask, other=float("-inf"))  # [S]
    top = tl.max(lse, axis=0)
    any_mass = top > float("-inf")  # false only for an empty context: every split is -inf
    weights = tl.exp(lse - tl.where(any_mass, top, 0.0))  # [S] 0 for empty or masked splits
    parts = tl.load(
        part_ptr + b * stride_pb + head * stride_ph + s[:, None] * stride_ps + d[None, :],
        mask=s_mask[:, None] & (d[None, :] < HEAD_DIM),
        other=0.0,
    )  # [S, D]
    norm = tl.where(any_mass, tl.sum(weights, axis=0), 1.0)
    result = tl.sum(parts * weights[:, None], axis=0) / norm  # [D]
    tl.store(
        out_ptr + b * stride_ob + head * stride_oh + d, result.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM
    )


def _tile(size: int) -> int:
    return max(16, triton.next_power_of_2(size))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 runs (CPU tests, exactness checks) multiply in full precision, not TF32."""
    return "ieee" if dtype == torch.float32 else "tf32"


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context_lens: torch.Tensor, *,
    scale: float, block_tables: torch.Tensor | None = None, block_size: int = 0,
    starts: torch.Tensor | None = None, num_splits: int | None = None, out: torch.Tensor | None = None,
    launch: tuple[int, int, int] = LAUNCH,
) -> torch.Tensor:  # fmt: skip
    """q `[B, H, D]` over each sequence's first `context_lens[b]` arena positions -> `[B, H, D]`.

    Arena `k_cache`/`v_cache` `[S, Hkv, D]` (one layer); addressing by `block_tables`
    `[B, max_blocks]` with `block_size` (paged) or `starts` `[B]` (contiguous). An empty
    context yields zeros. Pass `num_splits` explicitly when capturing a CUDA graph (the
    default depends on the context lengths, read on the host).
    """
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    paged = block_tables is not None
    if not paged and starts is None:
        raise ValueError("decode_attention needs block_tables (paged) or starts (contiguous)")
    if paged and (block_size < 1 or block_size & (block_size - 1)):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    if num_splits is None:
        num_splits = choose_num_splits(batch, kv_heads, int(context_lens.max()), q.device)
    direct = num_splits == 1
    if direct:
        part, lse = out, out  # unused
        part_strides = (out.stride(0), out.stride(1), 0)
        lse_strides = (0, 0)
    else:
        part = torch.empty((batch, heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((batch, heads, num_splits), dtype=torch.float32, device=q.device)
        part_strides = part.stride()[:3]
        lse_strides = lse.stride()[:2]
    table = block_tables if paged else context_lens  # a placeholder pointer where unused
    grid = (batch, kv_heads, num_splits)
    _decode_split_kernel[grid](
        q, k_cache, v_cache, context_lens, table, starts if starts is not None else context_lens, part, lse,
        scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        table.stride(0),
        *part_strides, *lse_strides,
        GROUP=heads // kv_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
        PAGED=paged, BLOCK_SIZE=block_size if paged else 1,
        BLOCK_G=_tile(heads // kv_heads), BLOCK_D=_tile(head_dim), BLOCK_N=launch[0],
        DIRECT=direct, DOT_PRECISION=dot_precision(q.dtype), num_warps=launch[1], num_stages=launch[2],
    )  # fmt: skip
    if not direct:
        _merge_splits_kernel[(batch, heads)](
            part, lse, out,
            *part.stride()[:3], *lse.stride()[:2], out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=triton.next_power_of_2(head_dim),
            num_warps=4,
        )  # fmt: skip
    return out
