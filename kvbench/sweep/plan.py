"""What a sweep runs: its axes, the settings shared by every cell, and how the sustained rate is
found. Read by the sweep (`run`) and by the sustained-rate search (`sustained`, `rounds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.config import RunConfig
from kvbench.sweep.cell import CellRun
from kvbench.sweep.grid import Axes, Baseline, Cell, cell_config


@dataclass(frozen=True)
class SustainedOptions:
    """How the sustained rate is found (docs/SWEEPS.md)."""

    threshold_s: float | None = None  # normalized latency (s/token) to stay under; None: from a baseline
    multiple: float = 4.0  # default threshold: this many times the unloaded normalized latency
    bisect: int = 0  # extra rates tried between the last passing and first failing one
    baseline: Baseline = field(default_factory=Baseline)


@dataclass(frozen=True)
class SweepPlan:
    axes: Axes
    base: RunConfig  # every setting but the axes (the axes' fields are overwritten per cell)
    run: CellRun = field(default_factory=CellRun)
    sustained: SustainedOptions = field(default_factory=SustainedOptions)
    continue_on_error: bool = False

    @property
    def needs_baseline(self) -> bool:
        return bool(self.axes.swept_rates) and self.sustained.threshold_s is None

    def config(self, cell: Cell) -> RunConfig:
        return cell_config(self.base, cell, self.sustained.baseline)
