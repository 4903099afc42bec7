"""kvbench's result figures, as pure functions of saved results (DESIGN.md principle 4).

| figure | function | reads |
|---|---|---|
| Fig. 2: occupancy breakdown | `plot_occupancy_bars` | summary.json `occupancy_saturated` / `occupancy` |
| occupancy over time | `plot_occupancy_timeline` | steps.csv occupancy columns |
| Fig. 13: batched requests | `plot_batched_bars`, `plot_batched_vs_rate` | summary.json, sweep.csv |
| latency CDFs | `plot_latency_cdfs` | requests.csv `ttft_s`, `tpot_s`, `e2el_s` |
| physical memory | `plot_memory_timeline` | steps.csv `*_bytes` (real runs), summary `arena_bytes` |
| roofline efficiency | `plot_roofline` | steps.csv `roofline_s` (real runs) |
| Fig. 12: latency vs rate | `plot_latency_vs_rate` | sweep.csv, sustained.csv |
| Fig. 18b: block size | `plot_block_size` | sweep.csv with several block sizes |

Each writes `<out>.png` and `<out>.svg` and returns the paths, or raises `PlotSkipped`
with the reason the saved results cannot make it. `figures_of_runs` / `figures_of_sweep`
make every figure that applies and keep the reasons of the rest as notes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.report.plot_runs import plot_batched_bars, plot_latency_cdfs, plot_occupancy_bars
from kvbench.report.plot_sweep import plot_batched_vs_rate, plot_block_size, plot_latency_vs_rate
from kvbench.report.plot_time import plot_memory_timeline, plot_occupancy_timeline, plot_roofline
from kvbench.report.style import PlotSkipped
from kvbench.results.load import Run, Sweep

__all__ = [
    "Figure",
    "PlotSkipped",
    "figures_of_runs",
    "figures_of_sweep",
    "plot_batched_bars",
    "plot_batched_vs_rate",
    "plot_block_size",
    "plot_latency_cdfs",
    "plot_latency_vs_rate",
    "plot_memory_timeline",
    "plot_occupancy_bars",
    "plot_occupancy_timeline",
    "plot_roofline",
]


@dataclass(frozen=True)
class Figure:
    """One figure of a report: the files written, or why there are none."""

    name: str  # file stem
    title: str
    paths: tuple[Path, ...]
    note: str = ""  # the reason it was skipped (paths empty)


RUN_FIGURES: tuple[tuple[str, str, Callable], ...] = (
    ("occupancy", "KV occupancy breakdown (Figure 2)", plot_occupancy_bars),
    ("batched", "Mean batched requests (Figure 13)", plot_batched_bars),
    ("occupancy_timeline", "Occupancy over time", plot_occupancy_timeline),
    ("latency_cdf", "Latency CDFs", plot_latency_cdfs),
    ("memory", "Physical memory over time", plot_memory_timeline),
    ("roofline", "Roofline efficiency of decode steps", plot_roofline),
)
SWEEP_FIGURES: tuple[tuple[str, str, Callable], ...] = (
    ("latency_vs_rate", "Normalized latency vs request rate (Figure 12)", plot_latency_vs_rate),
    ("batched_vs_rate", "Mean batched requests vs request rate (Figure 13)", plot_batched_vs_rate),
    ("block_size", "Block size vs latency (Figure 18b)", plot_block_size),
)


def _make(specs, data, out_dir: Path, prefix: str) -> list[Figure]:
    figures = []
    for name, title, plot in specs:
        stem = f"{prefix}{name}"
        try:
            figures.append(Figure(stem, title, tuple(plot(data, Path(out_dir) / stem))))
        except PlotSkipped as skipped:
            figures.append(Figure(stem, title, (), str(skipped)))
    return figures


def figures_of_runs(runs: Sequence[Run], out_dir: Path) -> list[Figure]:
    """Every run figure into `out_dir`; figures the runs cannot make carry a note instead."""
    return _make(RUN_FIGURES, runs, out_dir, "")


def figures_of_sweep(sweep: Sweep, out_dir: Path, prefix: str = "") -> list[Figure]:
    """Every sweep figure into `out_dir` (file names start with `prefix`)."""
    return _make(SWEEP_FIGURES, sweep, out_dir, prefix)
