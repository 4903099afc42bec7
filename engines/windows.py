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

Shared slots (forked samples, beams, prefix-cache hits) are counted once per sequence mapping them
here; the engine bounds the total by the token states (it can never exceed what is held).
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
