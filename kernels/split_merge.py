"""The two ways split-KV decode attention merges its partials into the output.

Each split of a (sequence, KV head) leaves, per query head, its output normalized over its own
range and the log-sum-exp `lse` of its scores. The merged output is their average weighted by
each split's share of the softmax mass, `exp(lse_s - max lse)`.

- **kernel**: a second launch, one program per (sequence, query head), after every split is done.
- **fused**: no second launch. Every split program takes a ticket for its (sequence, KV head) once
  its partial is stored; the one that draws the last ticket merges them all and resets the ticket
  counter. That saves the merge kernel's launch and its tail (the last splits finishing before
  it may start), a fixed cost that weighs most on short steps.

Why the ticket is sound (all on the GPU, within one launch):

0. Nothing waits: no program spins on another, so no order of scheduling (or occupancy) can
   deadlock it; a program that is not last simply ends.
1. Publishing: every thread's partial stores, then a CTA barrier, then one thread's atomic add
   with release semantics at GPU scope; the release is cumulative, so it publishes the stores
   the barrier ordered before it, not only that thread's own. (Triton issues a scalar atomic
   from one thread and broadcasts its result through shared memory after a barrier, but puts
   no barrier before it: hence `tl.debug_barrier`.)
2. Electing: the counter of (b, kv head) is incremented exactly once by each of its NUM_SPLITS
   programs, so exactly one draws NUM_SPLITS - 1, and only after all others drew theirs.
3. Reading: its add also acquires, so after the barrier that broadcasts the ticket every thread of
   the merger sees every split's partial; they are read through L2 (`.cg`), never a stale L1 line.
4. Resetting: when the merger draws the last ticket no program of this launch touches that counter
   again, so storing 0 races with nothing; the next launch using it starts after this one ends
   (stream order, or a graph's edge), which makes the 0 visible to it. Hence the counters are
   zero between launches, whatever the batch or split count of the next one, in CUDA graphs too.

Triton's interpreter runs a grid's programs one after another, so there the last split always
merges; the same tests compiled on a GPU see the splits finish in any order.
"""

from __future__ import annotations

import triton
import triton.language as tl

# splits one merge step holds: the K/V kernels' most (all of them at once, unrolled); beyond, a loop
MERGE_SPLITS = tl.constexpr(16)
MERGE_COLUMNS = 256  # output columns of one merge-kernel program: every K/V head dim, half of MLA's latent


@triton.jit
def finish_split(
    acc, m, total,  # [G, D] weighted values, [G] running max and [G] softmax mass of one split
    out_ptr,  # the output tensor (its element type is what a final result is stored as)
    out_rows,  # [G] pointers: each query head's output row [D]
    part_ptr, lse_ptr, ticket_ptr,  # the DecodeWorkspace's partials, log-sum-exps, this group's ticket
    rows,  # [G] int64: each query head's row (b, h) in the workspace, times CAP
    split, d, g_mask, d_mask,  # this split, [D] columns, [G] and [D] masks
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, FUSED: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """A split program's end, the same in every decode kernel: normalize its online softmax, then
    store the final output (one split), or its partial and log-sum-exp and merge if it is last."""
    filled = total > 0.0  # an empty range (short context, or none at all) contributes nothing
    result = tl.where(filled[:, None], acc / tl.where(filled, total, 1.0)[:, None], 0.0)  # [G, D]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:  # the result is final: no partials, no merge, one launch in all
        tl.store(out_rows[:, None] + d[None, :], result.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(part_ptr + (rows[:, None] + split) * HEAD_DIM + d[None, :], result, mask=out_mask)
        lse = tl.where(filled, m + tl.log(tl.where(filled, total, 1.0)), float("-inf"))  # [G]
        tl.store(lse_ptr + rows + split, lse, mask=g_mask)
        if FUSED:
            merge_if_last(
                part_ptr, lse_ptr, ticket_ptr, rows, out_rows, d, g_mask, out_mask, HEAD_DIM, NUM_SPLITS,
                BLOCK_G, BLOCK_D,
            )  # fmt: skip


@triton.jit
def merge_if_last(
    part_ptr,  # [N, H, CAP, D] float32 partial outputs
    lse_ptr,  # [N, H, CAP] float32 their log-sum-exp
    ticket_ptr,  # int32 scalar: this (sequence, KV head)'s counter of finished splits
    rows,  # [G] int64: index of each query head's row (b, h) in the workspace, times CAP
    out_rows,  # [G] pointers: each query head's output row [D]
    d, g_mask, out_mask,  # [D], [G], [G, D]
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Called by every split program after storing its partial; the last to arrive merges.

    It unrolls `MERGE_SPLITS` splits at a time: the MLA kernel's 64 and 128 splits unrolled whole
    spilled 8 and 19 KB a thread (ptxas for sm_90), in chunks about 130 bytes; up to 16 splits
    the loop of one step folds away (the K/V kernels compile to the same instructions). The
    merger is one program reading every split's partials (2 MiB for MLA at 64 splits), where
    the merge kernel spreads them over a program per (sequence, head, column block).
    """
    tl.debug_barrier()  # every thread's partial stores precede the ticket (1.)
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")  # (1., 2.)
    if ticket == NUM_SPLITS - 1:
        CHUNK: tl.constexpr = NUM_SPLITS if NUM_SPLITS < MERGE_SPLITS else MERGE_SPLITS  # splits unrolled
        top = tl.full([BLOCK_G], float("-inf"), tl.float32)
        for first in range(0, NUM_SPLITS, CHUNK):  # one iteration up to MERGE_SPLITS (folded away)
            for i in tl.static_range(CHUNK):
                inside = first + i < NUM_SPLITS  # false only past a count that is no multiple of CHUNK
                lse = tl.load(
                    lse_ptr + rows + first + i, mask=g_mask & inside, other=float("-inf"),
                    cache_modifier=".cg",
                )  # fmt: skip  # [G]
                top = tl.maximum(top, lse)
        base = tl.where(top > float("-inf"), top, 0.0)  # all -inf (an empty context): every weight 0
        norm = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for first in range(0, NUM_SPLITS, CHUNK):
            for i in tl.static_range(CHUNK):
                inside = first + i < NUM_SPLITS
                lse = tl.load(
                    lse_ptr + rows + first + i, mask=g_mask & inside, other=float("-inf"),
                    cache_modifier=".cg",
                )  # fmt: skip
                weight = tl.exp(lse - base)  # [G] 0 for a split that saw nothing (its partial is 0)
                part = tl.load(
                    part_ptr + (rows[:, None] + first + i) * HEAD_DIM + d[None, :], mask=out_mask & inside,
                    other=0.0, cache_modifier=".cg",
                )  # fmt: skip  # [G, D]
                norm += weight
                acc += weight[:, None] * part
        result = acc / tl.where(norm > 0.0, norm, 1.0)[:, None]
        tl.store(out_rows[:, None] + d[None, :], result.to(out_rows.dtype.element_ty), mask=out_mask)
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")  # (4.)


@triton.jit
def merge_splits_kernel(
    part_ptr, lse_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_ALL: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program (b, head, column block): weight each split's partial output by its share of the
    softmax mass, `BLOCK_S` splits at a time (every split's log-sum-exp first, for the max)."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)  # [D] this program's columns
    d_mask = d < HEAD_DIM
    lse_row = lse_ptr + b * stride_lb + head * stride_lh
    every = tl.arange(0, BLOCK_ALL)
    top = tl.max(tl.load(lse_row + every, mask=every < NUM_SPLITS, other=float("-inf")), axis=0)
    any_mass = top > float("-inf")  # false only for an empty context: every split is -inf
    base = tl.where(any_mass, top, 0.0)
    norm = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    part_row = part_ptr + b * stride_pb + head * stride_ph
    for first in range(0, NUM_SPLITS, BLOCK_S):  # one iteration up to MERGE_SPLITS splits
        s = first + tl.arange(0, BLOCK_S)
        s_mask = s < NUM_SPLITS
        lse = tl.load(lse_row + s, mask=s_mask, other=float("-inf"))  # [S]
        weights = tl.exp(lse - base)  # [S] 0 for empty or masked splits
        parts = tl.load(
            part_row + s[:, None] * stride_ps + d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0
        )  # [S, D]
        norm += weights
        acc += tl.sum(parts * weights[:, None], axis=0)
    result = acc / tl.where(any_mass, tl.sum(norm, axis=0), 1.0)  # [D]
    tl.store(out_ptr + b * stride_ob + head * stride_oh + d, result.to(out_ptr.dtype.element_ty), mask=d_mask)


def launch_merge_kernel(part, lse, out, num_splits: int) -> None:
    """The merge as its own launch: part `[B, H, >=S, D]`, lse `[B, H, >=S]` -> out `[B, H, D]`.

    A program holds `MERGE_SPLITS` splits of `MERGE_COLUMNS` columns at most: every K/V layout
    (16 splits, head dims to 256) in one step as before; the MLA kernel's up to 128 splits of a
    512-wide latent in a loop over the splits and two programs per head, not a `[128, 512]` tile
    (254 registers, spills).
    """
    batch, heads, head_dim = out.shape
    block_all = triton.next_power_of_2(num_splits)
    block_d = min(triton.next_power_of_2(head_dim), MERGE_COLUMNS)
    merge_splits_kernel[(batch, heads, triton.cdiv(head_dim, block_d))](
        part, lse, out,
        *part.stride()[:3], *lse.stride()[:2], out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
        BLOCK_ALL=block_all, BLOCK_S=min(block_all, MERGE_SPLITS.value), BLOCK_D=block_d,
        num_warps=4,
    )  # fmt: skip
