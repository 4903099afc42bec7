"""KV occupancy: the categories of DESIGN.md (and mapped idle pages), and their exact time integrals.

An allocator reports a `Footprint`: four additive totals over the sequences it holds.
Every category is a *linear* function of (footprint, external fragmentation, arena size),
so the time integral of the categories is the same function applied to the integrals of
those totals. That is what lets the simulator skip thousands of identical decode steps and
still report exact time-weighted occupancy.

How the categories split one sequence's slots (F = its final K/V length)::

    granted  |<----------------------------------------------------------->|
    asked    |<---------------------------------------------->|
    target   |<------------------------------->|  (min(F, asked))
    tokens   |<------------->|
             [ token_states  | reservation     | internal     | allocator |
                                                  frag          overhead

Of the token states, those a sliding-window layer still holds for tokens older than its window
(positions below num_computed - W + 1: no step reads them again) are `outside_window`: `paged`
keeps them all, `hybrid` and `jenga` only the older tokens of a block still partly inside the
window (`engines.windows`). They are carved out of `token_states`, so the categories still sum.

Slots an allocator keeps for reuse under no sequence (a virtual-memory allocator's pages
still mapped under the range of a finished request, `engines.vmm`) are `mapped_idle`. The
arena's free slots split into `external_frag` (free, but in extents too small for the request
waiting at the head of the queue) and `free`.

Shared slots (forked sequences, prefix cache hits) count once, in every total. A prefix
cache's blocks that no sequence references any more still hold K/V, but any allocation may
take them (evicting what they hold), so they are `free`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CATEGORIES = (
    "token_states",
    "outside_window",
    "reservation",
    "internal_frag",
    "allocator_overhead",
    "mapped_idle",
    "external_frag",
    "free",
)
# the paper's "External frag. & Others" (Figure 2): every category past internal fragmentation
PAPER_OTHER = ("outside_window", "allocator_overhead", "mapped_idle", "external_frag", "free")


@dataclass(frozen=True, slots=True)
class Footprint:
    """Totals over resident sequences, in slots (or slot-seconds for an integral)."""

    tokens: float  # slots holding computed K/V (shared slots once)
    target: float  # slots asked for that lie below the sequences' final lengths
    asked: float  # slots the reservation policy asked for
    granted: float  # slots the allocator handed out (asked + rounding)
    external: float = 0.0  # free slots unusable by the request waiting at the head
    idle: float = 0.0  # slots kept for reuse under no sequence (mapped idle pages)
    outside: float = 0.0  # of `tokens`: slots window layers hold for tokens older than the window

    def __add__(self, o: Footprint) -> Footprint:
        return Footprint(
            self.tokens + o.tokens,
            self.target + o.target,
            self.asked + o.asked,
            self.granted + o.granted,
            self.external + o.external,
            self.idle + o.idle,
            self.outside + o.outside,
        )

    def scaled(self, factor: float) -> Footprint:
        return Footprint(
            self.tokens * factor,
            self.target * factor,
            self.asked * factor,
            self.granted * factor,
            self.external * factor,
            self.idle * factor,
            self.outside * factor,
        )


def categories(fp: Footprint, capacity: float) -> dict[str, float]:
    """Split `capacity` slots (or slot-seconds) into the categories; they sum to it."""
    return {
        "token_states": fp.tokens - fp.outside,
        "outside_window": fp.outside,
        "reservation": fp.target - fp.tokens,
        "internal_frag": fp.asked - fp.target,
        "allocator_overhead": fp.granted - fp.asked,
        "mapped_idle": fp.idle,
        "external_frag": fp.external,
        "free": capacity - fp.granted - fp.idle - fp.external,
    }


def whole_slots(fp: Footprint, num_slots: int) -> list[int]:
    """The categories of an instant in whole slots, still summing to `num_slots`: each rounded
    down, `free` taking the remainder (a page may grant a fraction of a slot, `engines.vmm`)."""
    values = [int(v) for v in categories(fp, num_slots).values()]
    values[-1] = num_slots - sum(values[:-1])
    return values


@dataclass(frozen=True, slots=True)
class KVSnapshot:
    """Occupancy of the arena at one instant, in slots; the categories sum to num_slots."""

    num_slots: int
    token_states: int
    outside_window: int
    reservation: int
    internal_frag: int
    allocator_overhead: int
    mapped_idle: int
    external_frag: int
    free: int

    @classmethod
    def of(cls, fp: Footprint, num_slots: int) -> KVSnapshot:
        return cls(num_slots, *whole_slots(fp, num_slots))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in CATEGORIES}


@dataclass(frozen=True, slots=True)
class Growth:
    """Slots an allocator added at each step of a multi-step segment.

    `asked[j]` and `target[j]` are the increments made before step j (0 for contiguous
    engines, whose reservation is made once at admission); `granted` is `asked` unless given
    (a page of a fractional number of slots grants the fraction but asks whole slots).
    """

    asked: np.ndarray  # (k,)
    target: np.ndarray  # (k,)
    granted: np.ndarray | None = None  # (k,) floats; None: equal to asked


def segment_integral(
    end: Footprint,
    durations: np.ndarray,
    tokens_per_step: int,
    growth: Growth | None,
    outside: float | None = None,
) -> Footprint:
    """Exact integral of the footprint over the k steps of one segment.

    `end` is the footprint after the last step; step j's footprint is `end` minus the tokens
    computed and the slots grown after it. With d the (k,) step durations and D_j the time
    elapsed before step j, sum_j d_j * (end - later_j) = end * sum(d) - sum_j delta_j * D_j
    for the slot growth, and tokens_per_step * sum_j d_j * (k - 1 - j) for the tokens.
    `outside` is the integral of the outside-window slots (`window_integral`), which do not
    grow at a constant rate; None: constant at `end.outside`.
    """
    if len(durations) == 1:
        return end.scaled(float(durations[0]))
    # durations: (k,) seconds; before: (k,) time elapsed before each step
    total = float(durations.sum())
    before = np.cumsum(durations) - durations
    later_steps = np.arange(len(durations) - 1, -1, -1)  # (k,) steps after step j
    token_deficit = tokens_per_step * float(durations @ later_steps)
    asked_deficit = target_deficit = granted_deficit = 0.0
    if growth is not None:
        asked_deficit = float(growth.asked @ before)
        target_deficit = float(growth.target @ before)
        granted_deficit = asked_deficit if growth.granted is None else float(growth.granted @ before)
    return Footprint(
        tokens=end.tokens * total - token_deficit,
        target=end.target * total - target_deficit,
        asked=end.asked * total - asked_deficit,
        granted=end.granted * total - granted_deficit,
        external=end.external * total,
        idle=end.idle * total,  # constant within a segment: see `KVAllocator.growth_horizon`
        outside=end.outside * total if outside is None else outside,
    )


def window_integral(scale: np.ndarray, behind: np.ndarray, durations: np.ndarray) -> float:
    """Exact integral over a segment's k steps of sum_i scale_i * max(behind_i - later_j, 0).

    Term i is one window group of one sequence that computes a token every step: after the last
    step it holds `behind_i` tokens older than its window (negative: that many short of it), so
    after step j, with later_j = k - 1 - j steps still to come, it held max(behind_i - later_j, 0).
    Only the last min(behind_i, k) steps contribute; with suffix sums of d and d x later over the
    steps, each term costs O(1): behind_i x sum(d) - sum(d x later) over those steps.
    """
    k = len(durations)
    later = np.arange(k - 1, -1, -1)  # (k,)
    # suffix sums over the last e steps, e = 0..k: (k + 1,)
    tail_d = np.concatenate(([0.0], np.cumsum(durations[::-1])))
    tail_dl = np.concatenate(([0.0], np.cumsum((durations * later)[::-1])))
    steps = np.clip(behind, 0, k).astype(np.int64)  # (m,) steps during which term i held any
    return float(scale @ (behind * tail_d[steps] - tail_dl[steps]))
