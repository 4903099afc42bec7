"""Decode attention over the KV arena: one query token per sequence, paged or contiguous.

Decode attention is memory-bound: every context token's K and V is read once per step, and
that read is the kernel's floor. The kernel is built around reading it once, fast:

- **GQA grouping**: one program serves all `G = H / Hkv` query heads of a KV head, so each K/V
  tile is loaded once for the group (`q` is a `[G, D]` tile padded to 16 rows for `tl.dot`).
- **Split-KV** (flash-decoding): a sequence's context is cut into `num_splits` ranges handled
  by separate programs, each writing a partial output and its log-sum-exp; a second kernel
  merges them, or the last split of each (sequence, KV head) to finish does (`merge="fused"`,
  `kernels/split_merge.py`). Small batches with long contexts then still fill every SM. One
  split writes the output directly: a single launch, nothing to merge.
- **Addressing** is one `constexpr` switch: a tile of positions `p` maps to arena slots through
  the block table (`table[p // bs] * bs + p % bs`, paged) or the extent start (`start + p`,
  contiguous). Everything else is the same code, so paged-vs-contiguous measures paging alone.
- Launch shapes depend only on the batch size and `num_splits`, never on context lengths (they
  are read on the device), so the kernels replay inside CUDA graphs.
- **Sliding window** (`window=W`, a `constexpr`: one compiled variant per window, and W = 0 is
  the full-attention kernel unchanged): the query at position `p` sees `[max(0, p - W + 1), p]`.
  The K loop starts at the tile holding the window's first position and the splits share only
  the tiles from there, so blocks wholly before the window are never read; positions before the
  bound inside that first tile are masked out of the loads.

- **Score soft-capping** (`softcap=c`, a `constexpr`: 0 compiles without it): each scaled score
  s becomes c x tanh(s / c) before the softmax, as Gemma 2's attention layers do; masked
  positions stay -inf.

fp16/bf16 inputs, fp32 accumulation; any head dim (tiles padded to a power of two >= 16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.split_merge import finish_split, launch_merge_kernel
from kernels.splits import DecodeWorkspace, choose_launch, choose_num_splits

MERGES = ("kernel", "fused")  # who merges split-KV partials: a second launch, or the last split
MERGE = "kernel"  # until benchmarks/merge_variants.py has timed both on the H200
# ptxas (CUDA 12.8), finding an atomic in a kernel of known block size, aims at full occupancy:
# 32 registers for 128 threads, and ~6 KB of spills per thread here. A register cap of 255 keeps
# the allocation the kernel gets without the ticket (255, a few hundred bytes of spills).
FUSED_MAXNREG = 255


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
def soft_cap(scores, CAP: tl.constexpr):
    """`CAP x tanh(scores / CAP)` in fp32 (CAP 0: the scores as they are). tanh from one exp of
    the magnitude, which never overflows: (1 - e^-2|x|) / (1 + e^-2|x|), signed; below |x| of
    1/16, where 1 - e^-2|x| would cancel (a cap far above the scores), its series
    x (1 - x^2/3 + 2 x^4/15), whose first left-out term is below float32's precision there."""
    if CAP > 0:
        x = scores / CAP
        t = tl.exp(-2.0 * tl.abs(x))
        magnitude = (1.0 - t) / (1.0 + t)
        x2 = x * x
        series = x * (1.0 - x2 * (1.0 / 3.0) + x2 * x2 * (2.0 / 15.0))
        scores = CAP * tl.where(tl.abs(x) < 0.0625, series, tl.where(x < 0, -magnitude, magnitude))
    return scores


@triton.jit
def load_kv_tile(
    k_ptr, v_ptr, table, start, first, low, hi, kv_head, stride_ks, stride_kh, stride_vs, stride_vh, d,
    d_mask, PAGED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, WINDOW: tl.constexpr,
):  # fmt: skip
    """K and V `[BLOCK_N, D]` of one KV head at positions `first, ...` (< hi), and their mask.

    Paged: slots through the block-table row `table`; contiguous: `start + position`. The one
    place where the two addressing modes differ, shared by decode and extend attention. With a
    sliding `WINDOW` (> 0) positions before `low` are masked too: a window's first tile may
    begin before the window, and a slot there may hold anything (a freed block, NaN).
    """
    pos = first + tl.arange(0, BLOCK_N)  # [N]
    n_mask = pos < hi
    if WINDOW > 0:
        n_mask = n_mask & (pos >= low)
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


# a mixed step's decode rows come with the step's own block-table width (its row stride):
# specialising on it (Triton does for 1 or a multiple of 16) would compile a variant mid-run
@triton.jit(do_not_specialize=["stride_tb"])
def _decode_split_kernel(
    q_ptr,  # [B, H, D]
    k_ptr, v_ptr,  # [S, Hkv, D]: the arena
    lens_ptr,  # [B] int32 context lengths
    table_ptr,  # [B, W] int32 block tables (paged; a placeholder when contiguous)
    starts_ptr,  # [B] extent starts (contiguous; a placeholder when paged)
    out_ptr,  # [B, H, D]: written by the only split, or by the fused merge
    part_ptr, lse_ptr, tickets_ptr,  # DecodeWorkspace [N, H, CAP, D], [N, H, CAP], [N, Hkv] (split-KV)
    scale, cap,
    stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_tb, stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    FUSED: tl.constexpr, DOT_PRECISION: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
):  # fmt: skip
    """Program (b, kv head, split): attention of the group's queries over one context range."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context = tl.load(lens_ptr + b).to(tl.int32)
    if WINDOW > 0:  # a constexpr branch: full attention (WINDOW 0) compiles to the kernel without it
        low = tl.maximum(context - WINDOW, 0)  # the window's first position
        base = low // BLOCK_N * BLOCK_N  # the first tile overlapping it: tiles stay aligned
    else:
        low = 0
        base = 0
    # balanced ranges of [base, context), rounded to whole tiles: split s covers [lo, hi)
    per_split = tl.cdiv(tl.cdiv(context - base, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = base + split * per_split
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
            k_ptr, v_ptr, table, start, first, low, hi, kv_head, stride_ks, stride_kh, stride_vs, stride_vh,
            d, d_mask, PAGED, BLOCK_N, BLOCK_SIZE, WINDOW,
        )  # fmt: skip  # [N, D] each
        scores = soft_cap(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), SOFTCAP)  # [G, N] fp32
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])  # [G, N]
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    out_rows = out_ptr + b * stride_ob + heads * stride_oh  # [G] pointers
    rows = (b.to(tl.int64) * tl.num_programs(1) * GROUP + heads) * cap  # [G] (b, head) rows, times CAP
    finish_split(
        acc, m, total, out_ptr, out_rows, part_ptr, lse_ptr, tickets_ptr + b * tl.num_programs(1) + kv_head,
        rows, split, d, g_mask, d_mask, HEAD_DIM, NUM_SPLITS, FUSED, BLOCK_G, BLOCK_D,
    )  # fmt: skip


def check_addressing(kernel: str, block_tables, starts, block_size: int, merge: str) -> bool:
    """Raise ValueError unless a decode kernel's call names its K/V (block tables with a
    power-of-two block size, or extent starts) and a known merge; True when it is paged."""
    paged = block_tables is not None
    if not paged and starts is None:
        raise ValueError(f"{kernel} needs block_tables (paged) or starts (contiguous)")
    if paged and (block_size < 1 or block_size & (block_size - 1)):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {', '.join(MERGES)}, got {merge!r}")
    return paged


def check_softcap(softcap: float) -> None:
    """A score cap is 0 (none) or a positive finite number that float32 holds as a normal number
    (a compiled variant each; one below float32's smallest normal would reach the kernel as 0)."""
    if not (softcap == 0 or torch.finfo(torch.float32).tiny <= softcap <= torch.finfo(torch.float32).max):
        raise ValueError(f"softcap must be 0 (none) or a positive float32 number, got {softcap}")


def block_width(size: int) -> int:
    """A kernel's tile along a dimension of `size`: a power of two, at least 16 (`tl.dot`'s minimum)."""
    return max(16, triton.next_power_of_2(size))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 runs (CPU tests, exactness checks) multiply in full precision, not TF32."""
    return "ieee" if dtype == torch.float32 else "tf32"


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context_lens: torch.Tensor, *,
    scale: float, block_tables: torch.Tensor | None = None, block_size: int = 0,
    starts: torch.Tensor | None = None, num_splits: int | None = None, out: torch.Tensor | None = None,
    launch: tuple[int, int, int] | None = None, merge: str = MERGE, workspace: DecodeWorkspace | None = None,
    window: int | None = 0, softcap: float = 0.0,
) -> torch.Tensor:  # fmt: skip
    """q `[B, H, D]` over each sequence's first `context_lens[b]` arena positions -> `[B, H, D]`.

    Arena `k_cache`/`v_cache` `[S, Hkv, D]` (one layer); addressing by `block_tables`
    `[B, max_blocks]` with `block_size` (paged) or `starts` `[B]` (contiguous). An empty
    context yields zeros. Pass `num_splits` explicitly when capturing a CUDA graph (the
    default depends on the context lengths, read on the host). `launch` (positions per tile,
    warps, stages) defaults to `kernels.splits.choose_launch`'s for the grid.

    With more than one split, `merge` picks who merges the partials: a second kernel
    (`"kernel"`) or the last split program of each (sequence, KV head) to finish (`"fused"`, one
    launch; `kernels/split_merge.py`). The partials (and the fused merge's tickets) live in
    `workspace`, allocated once by the caller; without one, the call allocates its own, and the
    fused merge's zeroed tickets then cost a memset launch of their own.

    A sliding `window` W (> 0) lets the query (at position `context_lens[b] - 1`) see only the
    last `min(W, context_lens[b])` positions, and the kernel reads only the tiles holding them;
    0 or None is full attention. A `softcap` c (> 0) caps every scaled score at c x tanh(s / c).
    """
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    paged = check_addressing("decode_attention", block_tables, starts, block_size, merge)
    window = window or 0
    if window < 0:
        raise ValueError(f"window must be 0 (full attention) or positive, got {window}")
    check_softcap(softcap)
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    if num_splits is None:
        longest = int(context_lens.max())
        num_splits = choose_num_splits(batch, kv_heads, min(longest, window) if window else longest, q.device)
    fused = merge == "fused" and num_splits > 1
    launch = launch or choose_launch(batch * kv_heads * num_splits, q.device)
    part, lse, tickets, cap = DecodeWorkspace.buffers(
        workspace, out, batch, heads, kv_heads, head_dim, num_splits, fused=fused
    )
    table = block_tables if paged else context_lens  # a placeholder pointer where unused
    grid = (batch, kv_heads, num_splits)
    _decode_split_kernel[grid](
        q, k_cache, v_cache, context_lens, table, starts if starts is not None else context_lens,
        out, part, lse, tickets,
        scale, cap,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        table.stride(0), out.stride(0), out.stride(1),
        GROUP=heads // kv_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
        PAGED=paged, BLOCK_SIZE=block_size if paged else 1,
        BLOCK_G=block_width(heads // kv_heads), BLOCK_D=block_width(head_dim), BLOCK_N=launch[0],
        FUSED=fused, DOT_PRECISION=dot_precision(q.dtype), WINDOW=window, SOFTCAP=float(softcap),
        num_warps=launch[1], num_stages=launch[2],
        **({"maxnreg": FUSED_MAXNREG} if fused else {}),
    )  # fmt: skip
    if num_splits > 1 and not fused:
        launch_merge_kernel(part, lse, out, num_splits)
    return out
