"""Slots sliding-window layers hold for tokens no step reads again: the `outside_window` category.

The query at position p of a window-W layer reads keys p - W + 1 .. p, so once a sequence has
computed c tokens, positions below c - W + 1 are never read again. An allocator that treats the
layer as full (`paged`, the contiguous engines, `vmm`) keeps them all; `hybrid` and `jenga` free a
window group's blocks once they lie wholly below it (`engines.hybrid`), so they keep only the older
tokens of the block the window starts in (and a block the next step frees). Every allocator holds a
window group's tokens from some position on: 0, or `window_held_from(seq, g)` where it frees.

One term per (sequence, window group): `behind` tokens held older than the window (negative: the
sequence is that many tokens short of it), each `scale` slots (the group's share of one slot's
bytes). A sequence that computes a token every step moves its terms up by one a step, so the
engine integrates them exactly over a segment (`kvbench.metrics.occupancy.window_integral`).

A slot several sequences share (forked samples, beams, prefix-cache hits) lies outside the window
only when it lies behind every sharer's window: a sharer still inside reads it. `window_terms`
counts each sequence's tokens as its own; `shared_terms` corrects the count of the blocks the
block-table allocators share (paged's, and each group's under `hybrid` and `jenga`, their prefix
variants too) to once per slot, behind the window of the sharer least far along. The engine
bounds the total by the token states (it can never exceed what is held).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from engines.hybrid import GroupShape
from kvbench.sequence import Sequence


@dataclass(frozen=True)
class WindowTerms:
    """The outside-window terms of some sequences: (m,) arrays, one entry per window group of each."""

    scale: np.ndarray  # slots one token of the group is (its bytes per token / a slot's)
    behind: np.ndarray  # tokens held older than the window; negative: short of the window

    @property
    def slots(self) -> float:
        """Slots the terms hold outside their window now."""
        return float(self.scale @ np.maximum(self.behind, 0))


def window_terms(allocator: object, shapes: Seq[GroupShape], seqs: Seq[Sequence]) -> WindowTerms:
    """The terms of `seqs` (resident in `allocator`) for the model's KV group `shapes`."""
    slot_bytes = sum(s.bytes_per_token for s in shapes)
    held_from = getattr(allocator, "window_held_from", None)  # allocators that free: hybrid, jenga
    scale, behind = [], []
    for g, shape in enumerate(shapes):
        if not shape.window:
            continue
        for seq in seqs:
            start = held_from(seq, g) if held_from is not None else 0
            scale.append(shape.bytes_per_token / slot_bytes)
            behind.append(seq.num_computed - shape.window + 1 - start)
    return WindowTerms(np.array(scale, dtype=np.float64), np.array(behind, dtype=np.int64))


def shared_terms(allocator: object, shapes: Seq[GroupShape], seqs: Seq[Sequence]) -> WindowTerms:
    """Terms that turn `window_terms(seqs)` into a count of each shared slot once.

    A block of B slots from position f, shared by sequences that have computed c_i tokens, holds
    clamp(c_i - W + 1 - f, 0, B) tokens behind sharer i's window W; each sharer's own terms count
    that, while the slots lie outside the window only as far as the least advanced sharer's does.
    clamp(x, 0, B) = max(x, 0) - max(x - B, 0), so the correction is four kinds of terms shaped as
    `window_terms`' (signed scales): minus each sharer's clamp, plus the least advanced one's. They
    move one token a step like the sharers', so `window_integral` integrates them as it does those.
    """
    shared = getattr(allocator, "shared_blocks", None)  # block-table allocators
    if shared is None or not seqs or not allocator.sharing_saved():  # nothing shared: no walk
        return WindowTerms(np.empty(0), np.empty(0, dtype=np.int64))
    slot_bytes = sum(s.bytes_per_token for s in shapes)
    bs, furthest = allocator.block_size, max(seq.num_computed for seq in seqs)
    scale, behind = [], []
    for g, shape in enumerate(shapes):
        if not shape.window or furthest < shape.window:
            continue
        share = shape.bytes_per_token / slot_bytes
        for first, sharers in shared(seqs, furthest - shape.window + 1, g):
            xs = [seq.num_computed - shape.window + 1 - first for seq in sharers]
            for x, sign in [*((x, -share) for x in xs), (min(xs), share)]:
                scale += [sign, -sign]
                behind += [x, x - bs]
    return WindowTerms(np.array(scale, dtype=np.float64), np.array(behind, dtype=np.int64))
