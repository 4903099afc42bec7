"""What a sweep runs: its axes, the settings shared by every cell, and how the sustained rate is
found. Read by the sweep (`run`) and by the sustained-rate search (`sustained`, `rounds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.config import RunConfig
from kvbench.sweep.cell import CellRun
from kvbench.sweep.grid import Axes, Baseline, Cell, cell_config

MAX_ROUNDS = 12  # a target bracket with no --bisect cap: 2^-12 of the grid's spacing at worst


@dataclass(frozen=True)
class SustainedOptions:
    """How the sustained rate is found (docs/SWEEPS.md)."""

    threshold_s: float | None = None  # normalized latency (s/token) to stay under; None: from baselines
    # default threshold: this many times the lowest unloaded normalized latency of the compared
    # engines (one bound shared by every engine of a trace x block size x budget x seed)
    multiple: float = 4.0
    bisect: int = 0  # bisection rounds between the last pass and the first fail (with `bracket`: a cap)
    baseline: Baseline = field(default_factory=Baseline)
    # bisect until (first fail - last pass) / last pass is at most this (None: exactly `bisect` rounds)
    bracket: float | None = None
    # with `bracket`: steps at most beyond the grid's ends where an engine passed every rate (a
    # step up) or failed the lowest (a step down), each a bracket's width away, so that the first
    # result on the other side closes a bracket already narrow enough; for a grid placed near each
    # engine's knee (`Axes.engine_rates`), where bisecting from 0 or stopping at a lower bound
    # would waste or lose the runs (0: the grid's ends bound the search, as a plain sweep's do)
    extend: int = 0

    @property
    def max_rounds(self) -> int:
        """Bisection rounds at most: `bisect`, or with a target bracket and no cap, MAX_ROUNDS."""
        return self.bisect if self.bracket is None or self.bisect else MAX_ROUNDS


@dataclass(frozen=True)
class SweepPlan:
    axes: Axes
    base: RunConfig  # every setting but the axes (the axes' fields are overwritten per cell)
    run: CellRun = field(default_factory=CellRun)
    sustained: SustainedOptions = field(default_factory=SustainedOptions)
    continue_on_error: bool = False
    duration_s: float | None = None  # loaded cells' traces last this long (`cell_config`); None: a count

    @property
    def needs_baseline(self) -> bool:
        return bool(self.axes.swept_rates) and self.sustained.threshold_s is None

    def config(self, cell: Cell) -> RunConfig:
        return cell_config(self.base, cell, self.sustained.baseline, self.duration_s)
