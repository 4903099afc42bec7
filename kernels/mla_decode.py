"""Decode attention of multi-head latent attention (MLA, DeepSeek-V2), absorbed form, paged or contiguous.

MLA caches ONE vector per token and layer, `[latent | rope]` (kv_lora_rank + qk_rope_head_dim:
512 + 64 on DeepSeek-V2-Lite), shared by every query head. Decode folds the key and value
up-projections into the query and the output, so attention is a multi-query attention of head
size latent + rope whose values are the latent part (`kvbench/modeling/mla.py`):

    score(h, j) = q[h, :latent] . c_j + q[h, latent:] . k_pe_j        out[h] = sum_j p(h, j) c_j

The bytes a step must read are therefore one latent + rope vector per context token, not K and V
per head; the kernel is built to read them once for many heads:

- **Head groups**: one program serves `HEADS_PER_PROGRAM` query heads (all 16 of V2-Lite), so
  each cached tile `[BLOCK_N, latent + rope]` is loaded once for the group and both products are
  `tl.dot`s of the group's `[G, latent]` and `[G, rope]` queries against it. The latent and the
  rope part are separate tiles (each padded to a power of two), so 512 + 64 is not padded to 1024.
- **Split-KV, merges, addressing** are `kernels/decode_attention.py`'s: the same balanced
  ranges of whole tiles per split, the same block-table tile addressing (`tile_slots`) or extent
  start, the same `DecodeWorkspace` and the same merges (`kernels/split_merge.py`, a second
  launch or the fused last-split merge), with a head group where that kernel has a KV head.
- **More splits**: a head group's grid is batch x splits alone (no KV heads to multiply it), so
  `choose_mla_splits` allows up to `MLA_MAX_SPLITS` (128) where the K/V kernels stop at 16, and a
  small batch fills the GPU as theirs does.
- Launch shapes depend only on the batch, the heads and `num_splits`, never on context lengths
  (read on the device), so the kernel replays inside CUDA graphs when `num_splits` is given.

fp16/bf16/fp32 inputs, fp32 accumulation, online softmax; a context of 0 yields zeros.
The tile of context positions defaults to 32 at V2-Lite's size (a `[32, 576]` bf16 tile per
pipeline stage in shared memory) and to `choose_launch`'s for small latents; not yet tuned on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.decode_attention import (
    FUSED_MAXNREG,
    MERGE,
    block_width,
    check_addressing,
    dot_precision,
    tile_slots,
)
from kernels.split_merge import finish_split, launch_merge_kernel
from kernels.splits import HEADS_PER_PROGRAM, DecodeWorkspace, choose_launch, choose_mla_splits, head_groups

LARGE_LATENT = 256  # from this latent tile on, a context tile of 32 positions (shared memory)


@triton.jit
def _mla_decode_kernel(
    q_ptr,  # [B, H, latent + rope] absorbed queries
    cache_ptr,  # [S, 1, latent + rope]: the arena (one vector per token)
    lens_ptr,  # [B] int32 context lengths
    table_ptr,  # [B, W] int32 block tables (paged; a placeholder when contiguous)
    starts_ptr,  # [B] extent starts (contiguous; a placeholder when paged)
    out_ptr,  # [B, H, latent]: written by the only split, or by the fused merge
    part_ptr, lse_ptr, tickets_ptr,  # DecodeWorkspace [N, H, CAP, latent], [N, H, CAP], [N, groups]
    scale, cap,
    stride_qb, stride_qh, stride_cs, stride_tb, stride_ob, stride_oh,
    HEADS: tl.constexpr, GROUP: tl.constexpr, LATENT: tl.constexpr, ROPE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    FUSED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Program (b, head group, split): the group's queries over one range of the context."""
    b = tl.program_id(0)
    group = tl.program_id(1)
    split = tl.program_id(2)
    context = tl.load(lens_ptr + b).to(tl.int32)
    per_split = tl.cdiv(tl.cdiv(context, NUM_SPLITS), BLOCK_N) * BLOCK_N  # whole tiles per split
    lo = split * per_split
    hi = tl.minimum(lo + per_split, context)

    g = tl.arange(0, BLOCK_G)
    heads = group * GROUP + g  # [G]
    g_mask = (g < GROUP) & (heads < HEADS)
    dl = tl.arange(0, BLOCK_L)  # [L] latent columns
    dr = tl.arange(0, BLOCK_R)  # [R] rope columns
    l_mask = dl < LATENT
    r_mask = dr < ROPE
    q_rows = q_ptr + b * stride_qb + heads[:, None] * stride_qh  # [G, 1]
    q_lat = tl.load(q_rows + dl[None, :], mask=g_mask[:, None] & l_mask[None, :], other=0.0)  # [G, L]
    q_rope = tl.load(q_rows + LATENT + dr[None, :], mask=g_mask[:, None] & r_mask[None, :], other=0.0)
    q_lat = (q_lat.to(tl.float32) * scale).to(q_lat.dtype)
    q_rope = (q_rope.to(tl.float32) * scale).to(q_rope.dtype)  # [G, R]

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max
    total = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp
    acc = tl.zeros([BLOCK_G, BLOCK_L], tl.float32)
    table = table_ptr + b.to(tl.int64) * stride_tb  # paged: this sequence's block-table row
    start = tl.load(starts_ptr + b).to(tl.int64)  # contiguous: its extent (a placeholder when paged)
    for first in range(lo, hi, BLOCK_N):
        pos = first + tl.arange(0, BLOCK_N)  # [N]
        n_mask = pos < hi
        if PAGED:  # noqa: SIM108 (a constexpr branch, compiled away)
            slots = tile_slots(table, first, hi, BLOCK_N, BLOCK_SIZE)  # [N]
        else:
            slots = start + pos
        entries = cache_ptr + slots[:, None] * stride_cs  # [N, 1]: each token's one vector, read once
        c = tl.load(entries + dl[None, :], mask=n_mask[:, None] & l_mask[None, :], other=0.0)  # [N, L]
        k_pe = tl.load(entries + LATENT + dr[None, :], mask=n_mask[:, None] & r_mask[None, :], other=0.0)
        scores = tl.dot(q_lat, tl.trans(c), input_precision=DOT_PRECISION)  # [G, N] fp32
        scores += tl.dot(q_rope, tl.trans(k_pe), input_precision=DOT_PRECISION)
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])  # [G, N]
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=DOT_PRECISION)  # values: c
        m = m_new

    out_rows = out_ptr + b * stride_ob + heads * stride_oh  # [G] pointers
    rows = (b.to(tl.int64) * HEADS + heads) * cap  # [G] (b, head) rows of the workspace, times CAP
    finish_split(
        acc, m, total, out_ptr, out_rows, part_ptr, lse_ptr, tickets_ptr + b * tl.num_programs(1) + group,
        rows, split, dl, g_mask, l_mask, LATENT, NUM_SPLITS, FUSED, BLOCK_G, BLOCK_L,
    )  # fmt: skip


def mla_launch(programs: int, latent: int, device: torch.device) -> tuple[int, int, int]:
    """`choose_launch`'s (positions per tile, warps, stages), with 32-position tiles from a latent
    of 256 on: a `[128, 576]` bf16 tile is 144 KiB a pipeline stage, more than shared memory holds."""
    tile, warps, stages = choose_launch(programs, device)
    return (min(tile, 32), warps, stages) if block_width(latent) >= LARGE_LATENT else (tile, warps, stages)


def mla_decode_attention(
    q: torch.Tensor, cache: torch.Tensor, context_lens: torch.Tensor, *, scale: float, latent: int,
    block_tables: torch.Tensor | None = None, block_size: int = 0, starts: torch.Tensor | None = None,
    num_splits: int | None = None, out: torch.Tensor | None = None,
    launch: tuple[int, int, int] | None = None, merge: str = MERGE, workspace: DecodeWorkspace | None = None,
) -> torch.Tensor:  # fmt: skip
    """q `[B, H, latent + rope]` over each sequence's first `context_lens[b]` cached vectors ->
    `[B, H, latent]`.

    `cache` `[S, 1, latent + rope]` (one layer of the MLA arena; a 2-d `[S, latent + rope]` view
    is taken as is); addressing, `num_splits`, `launch`, `merge` and `workspace` as in
    `kernels.decode_attention.decode_attention`, with `head_groups(H)` in place of its KV heads
    and `latent` as the workspace's head dim. An empty context yields zeros.
    """
    batch, heads, width = q.shape
    rope = width - latent
    if not 0 < latent <= width:
        raise ValueError(f"latent must be in 1..{width} (the query's last dim), got {latent}")
    if q.stride(-1) != 1 or cache.stride(-1) != 1:
        raise ValueError("mla_decode_attention needs q and cache contiguous in their last dim")
    if cache.shape[-1] != width or (cache.dim() == 3 and cache.shape[1] != 1):
        raise ValueError(f"MLA cache must be [S, 1, {width}], got {tuple(cache.shape)}")
    paged = check_addressing("mla_decode_attention", block_tables, starts, block_size, merge)
    if out is None:
        out = torch.empty((batch, heads, latent), dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    groups = head_groups(heads)
    if num_splits is None:
        num_splits = choose_mla_splits(batch, heads, int(context_lens.max()), q.device)
    fused = merge == "fused" and num_splits > 1
    launch = launch or mla_launch(batch * groups * num_splits, latent, q.device)
    part, lse, tickets, cap = DecodeWorkspace.buffers(
        workspace, out, batch, heads, groups, latent, num_splits, fused=fused
    )
    table = block_tables if paged else context_lens  # a placeholder pointer where unused
    group = min(heads, HEADS_PER_PROGRAM)
    _mla_decode_kernel[(batch, groups, num_splits)](
        q, cache, context_lens, table, starts if starts is not None else context_lens,
        out, part, lse, tickets,
        scale, cap,
        q.stride(0), q.stride(1), cache.stride(0), table.stride(0), out.stride(0), out.stride(1),
        HEADS=heads, GROUP=group, LATENT=latent, ROPE=rope, NUM_SPLITS=num_splits,
        PAGED=paged, BLOCK_SIZE=block_size if paged else 1,
        BLOCK_G=block_width(group), BLOCK_L=block_width(latent), BLOCK_R=block_width(max(rope, 1)),
        BLOCK_N=launch[0],
        FUSED=fused, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=launch[1], num_stages=launch[2],
        **({"maxnreg": FUSED_MAXNREG} if fused else {}),
    )  # fmt: skip
    if num_splits > 1 and not fused:
        launch_merge_kernel(part, lse, out, num_splits)
    return out
