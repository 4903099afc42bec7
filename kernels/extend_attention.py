"""Prefix-aware prefill ("extend") attention: new tokens over everything their sequence has stored.

A prefill step feeds each sequence's *new* tokens, packed `[T, H, D]` with `cu_seqlens`; they
are the last `n` of the sequence's `context_lens[b]` positions. Their K/V are stored first, so
the keys all come from the arena, through the same paged or contiguous addressing as decode.
One kernel therefore covers a fresh prompt (no prefix), a recomputed sequence after
preemption, a prompt extending a shared prefix and a new turn of a conversation.

Program (b, query tile, head): a `[BLOCK_M, D]` tile of one head's queries runs an online
softmax over key tiles up to the tile's last position (causal), in fp32. With a sliding window
W (a `constexpr`; 0 is full attention, compiled without it) the query at position `p` sees
`[max(0, p - W + 1), p]`: the key loop starts at the tile holding the tile's first query's left
bound, and each row masks its own. A score soft-cap c (a `constexpr`, Gemma 2's; 0 compiles
without it) turns each scaled score s into c x tanh(s / c) before the causal mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.decode_attention import check_softcap, dot_precision, load_kv_tile, soft_cap

BLOCK_M = 32
BLOCK_N = 32


# the block-table width (its row stride) differs from one prefill to the next: specialising on it
# (Triton does for a value of 1 or a multiple of 16) would compile a new variant mid-run. Nor on
# the alignment of the per-sequence pointers (Triton specialises a pointer on 16-byte alignment):
# a mixed step's prompt chunks pass `context_lens[rows:]` and their block tables' rows after
# `rows` decode rows, aligned only when `rows` is a multiple of 4, and the first such step at
# each new alignment compiled mid-run (Gemma 3 12B's first mixed steps with 1 and 2 decode rows:
# 1.45 and 1.52 s, results/reference/hybrid-long-chunked-warm-real). They are read one scalar
# per program, so alignment buys nothing there.
@triton.jit(
    do_not_specialize=["stride_tb"], do_not_specialize_on_alignment=["lens_ptr", "table_ptr", "starts_ptr"]
)
def _extend_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, cu_ptr, lens_ptr, table_ptr, starts_ptr,
    scale,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_tb,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    tile = tl.program_id(1)
    head = tl.program_id(2)
    first_token = tl.load(cu_ptr + b).to(tl.int32)
    num_new = tl.load(cu_ptr + b + 1).to(tl.int32) - first_token
    if tile * BLOCK_M < num_new:
        context = tl.load(lens_ptr + b).to(tl.int32)
        kv_head = head // GROUP
        m_idx = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [M] index among the new tokens
        m_mask = m_idx < num_new
        q_pos = context - num_new + m_idx  # [M] positions of the queries
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        tokens = (first_token + m_idx).to(tl.int64)
        q = tl.load(
            q_ptr + tokens[:, None] * stride_qt + head * stride_qh + d[None, :],
            mask=m_mask[:, None] & d_mask[None, :],
            other=0.0,
        )  # [M, D]
        q = (q.to(tl.float32) * scale).to(q.dtype)
        table = table_ptr + b.to(tl.int64) * stride_tb  # paged: this sequence's block-table row
        start = tl.load(starts_ptr + b).to(tl.int64)  # contiguous: its extent (a placeholder when paged)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        last = tl.minimum(context - num_new + (tile + 1) * BLOCK_M, context)  # keys the tile can see
        if WINDOW > 0:  # a constexpr branch
            low = tl.maximum(context - num_new + tile * BLOCK_M - WINDOW + 1, 0)  # first query's bound
            base = low // BLOCK_N * BLOCK_N  # the first key tile overlapping the tile's windows
        else:
            low = 0
            base = 0
        for key_first in range(base, last, BLOCK_N):
            pos = key_first + tl.arange(0, BLOCK_N)  # [N]
            k, v, n_mask = load_kv_tile(
                k_ptr, v_ptr, table, start, key_first, low, last, kv_head, stride_ks, stride_kh, stride_vs,
                stride_vh, d, d_mask, PAGED, BLOCK_N, BLOCK_SIZE, WINDOW,
            )  # fmt: skip  # [N, D] each
            scores = soft_cap(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), SOFTCAP)  # [M, N]
            visible = (pos[None, :] <= q_pos[:, None]) & n_mask[None, :]
            if WINDOW > 0:
                visible = visible & (pos[None, :] > q_pos[:, None] - WINDOW)  # each row's own bound
            scores = tl.where(visible, scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows with nothing visible yet
            alpha = tl.exp(m - m_safe)
            p = tl.exp(scores - m_safe[:, None])
            total = total * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m = m_new
        result = acc / tl.where(total > 0.0, total, 1.0)[:, None]
        tl.store(
            out_ptr + tokens[:, None] * stride_ot + head * stride_oh + d[None, :],
            result.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :],
        )  # fmt: skip


def extend_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens: torch.Tensor,
    context_lens: torch.Tensor, *, scale: float, max_new: int, block_tables: torch.Tensor | None = None,
    block_size: int = 0, starts: torch.Tensor | None = None, out: torch.Tensor | None = None,
    window: int | None = 0, softcap: float = 0.0,
) -> torch.Tensor:  # fmt: skip
    """q `[T, H, D]` (new tokens, `cu_seqlens` `[B + 1]`) over arena positions `[0, context_lens[b])`.

    `max_new` is the longest sequence's new-token count (sizes the grid). A sliding `window` W
    (> 0) limits the query at position `p` to `[max(0, p - W + 1), p]`; 0 or None: causal over
    everything. A `softcap` c (> 0) caps every scaled score at c x tanh(s / c). Returns `[T, H, D]`.
    """
    tokens, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    paged = block_tables is not None
    if not paged and starts is None:
        raise ValueError("extend_attention needs block_tables (paged) or starts (contiguous)")
    window = window or 0
    if window < 0:
        raise ValueError(f"window must be 0 (full attention) or positive, got {window}")
    check_softcap(softcap)
    if out is None:
        out = torch.empty_like(q)
    batch = cu_seqlens.shape[0] - 1
    if tokens == 0 or batch == 0:
        return out
    table = block_tables if paged else context_lens  # placeholder pointers where unused
    start = starts if starts is not None else context_lens
    grid = (batch, triton.cdiv(max_new, BLOCK_M), heads)
    _extend_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens, context_lens, table, start,
        scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1), table.stride(0),
        GROUP=heads // kv_heads, HEAD_DIM=head_dim, PAGED=paged, BLOCK_SIZE=block_size if paged else 1,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=dot_precision(q.dtype), WINDOW=window, SOFTCAP=float(softcap),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    return out
