"""A sweep that must end by a given time (a time-limited GPU call): it starts no cell that it
expects to end past that time, and stops there, resumable.

Why: a real cell of a paper-scale sweep lasts its trace plus the drain (60-100 s at OPT-13B), and
a call that is killed at its time limit loses the cell in progress, on average half a cell of
GPU time per call. A sweep told its deadline (`--deadline-s`) instead stops before the first
cell that would not finish, its folder as a `--resume` expects it, and exits with
`DEADLINE_EXIT` so a script can tell "stopped in time" from a failure. The expected duration of a
cell is the longest wall time among the finished cells of its kind and engine (unloaded
baselines apart from loaded cells: a baseline of 5 requests is far shorter; and engine by engine:
on Figure 13's Alpaca cells at OPT-13B a paged cell lasts 22-30 s and a static one 190-196 s, so
judging paged by static stopped calls with a third of their time unused), with a margin. An
engine with no timed cell of its kind is judged by the longest cell of that kind of any engine
(nothing closer to judge it by; it errs long only where a slower engine was timed, so order a
sweep's engines slowest first where that is known); a cell of a kind no finished cell has
timed is started (nothing to judge it by), so a deadline never stops a sweep before its first
cell of each kind. A reproduction runs one sweep after another (a seed, a
preemption mode) under one `Deadline`, which keeps the longest wall time of each kind seen by any
of them: a sweep's first cell is judged by the sweeps before it, not started blind with seconds
left (at OPT-13B that lost the cell in progress of every Figure 19 call). Once an engine has a
cell of the kind timed, the estimate errs long: a sweep may stop with time to spare, not mid-cell;
an engine's first cell, judged by another engine's, may be cut where that engine was faster.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

DEADLINE_EXIT = 75  # sysexits' EX_TEMPFAIL: nothing failed; run again (with --resume) to go on
MARGIN = 1.1  # a cell is expected to last up to 10 % longer than the longest of its kind so far


class DeadlineReached(Exception):
    """The sweep stopped before a cell it expects to end past its deadline. Not a user error
    (`KvbenchError`): the CLI says so in one line and exits with `DEADLINE_EXIT`."""


@dataclass(frozen=True)
class Deadline:
    """A point in time (`time.monotonic()` seconds) by which the sweep must have ended."""

    at: float
    # the longest wall time (s) of a finished cell of each kind (True: unloaded baselines) and
    # engine seen by any sweep run under this deadline; mutable by design: the sweeps of one call
    # share it
    timed: dict[tuple[bool, str], float] = field(default_factory=dict, compare=False)

    def note(self, baseline: bool, engine: str, wall_s: float | None) -> None:
        """A cell of this kind and engine finished (or was found finished) in `wall_s` seconds."""
        if wall_s is not None and wall_s == wall_s:
            key = (baseline, engine)
            self.timed[key] = max(wall_s, self.timed.get(key, 0.0))

    def expected_s(self, baseline: bool, engine: str) -> float | None:
        """How long the next cell of this kind and engine is expected to last: by the engine's own
        cells of the kind where one was timed, else by every engine's (None: none timed yet)."""
        own = self.timed.get((baseline, engine))
        if own is not None:
            return expected_s([own])
        return expected_s([wall for (kind, _), wall in self.timed.items() if kind == baseline])

    @classmethod
    def in_seconds(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def left_s(self) -> float:
        return self.at - time.monotonic()

    def check(self, cell_id: str, expected_s: float | None) -> None:
        """Raise `DeadlineReached` where a cell expected to last `expected_s` would end past the
        deadline (None: no estimate, the cell starts)."""
        left = self.left_s()
        if expected_s is not None and expected_s > left:
            raise DeadlineReached(
                f"{cell_id} not started: it is expected to take {expected_s:.1f} s and {max(left, 0):.1f} s "
                "are left before --deadline-s; --resume goes on from it"
            )


def expected_s(walls: Iterable[float | None]) -> float | None:
    """How long the next cell of a kind is expected to last, from the wall times (s) of the
    finished cells of that kind: the longest, with `MARGIN` (None: none has been timed)."""
    timed = [w for w in walls if w is not None and w == w]
    return MARGIN * max(timed) if timed else None
