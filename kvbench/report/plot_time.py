"""Figures over a run's time, from steps.csv: occupancy, physical memory, roofline efficiency.

steps.csv rows are multi-step segments (`start_s`, `duration_s`, `num_steps`): each row's
state is drawn as a step held until the next row starts (`plots_style.step_series`). The
memory and roofline columns come from a real run's collectors and are optional: a figure
whose columns no run has raises `PlotSkipped` (a simulation has none of them).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api.types import is_numeric_dtype

from kvbench.metrics.occupancy import CATEGORIES
from kvbench.report.plot_runs import display_names, linestyles, ordered
from kvbench.report.style import (
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    PlotSkipped,
    engine_colors,
    legend_outside,
    pyplot,
    save,
    step_series,
)
from kvbench.results.load import Run

GIB = 2**30
MAX_PANELS = 12  # one panel per run; past this a figure is unreadable


def _has(run: Run, *columns: str) -> bool:
    steps = run.steps
    return all(c in steps and is_numeric_dtype(steps[c]) for c in columns) and len(steps) > 0


def _floats(steps: pd.DataFrame, column: str) -> np.ndarray:
    """A numeric steps.csv column as a float array (`_has` checked it is there)."""
    return steps[column].to_numpy(dtype=np.float64)


def _panels(plt, n: int, height: float, width: float = 11.0):
    fig, axes = plt.subplots(n, 1, figsize=(width, height * n + 1.0), sharex=True, squeeze=False,
                             layout="constrained")  # fmt: skip
    return fig, axes[:, 0]


def _title(ax, name: str, color: str, extra: str = "") -> None:
    ax.set_title(f"{name}{extra}", loc="left", fontsize=10, color=color, fontweight="bold")


_REQUIRED = tuple(c for c in CATEGORIES if c not in ("mapped_idle", "outside_window"))  # older runs lack them


def plot_occupancy_timeline(runs: Iterable[Run | Path | str], out: Path) -> list[Path]:
    """The occupancy categories over time per run (stacked, % of the arena), running requests on top."""
    runs = [r for r in ordered(runs) if _has(r, "start_s", "duration_s", *_REQUIRED)]
    if not runs:
        raise PlotSkipped("no run has steps.csv with the occupancy columns")
    shown, hidden = runs[:MAX_PANELS], len(runs) - MAX_PANELS
    plt = pyplot()
    names = display_names(shown)
    colors = engine_colors(r.engine for r in shown)
    fig, axes = _panels(plt, len(shown), 1.9)
    handles = {}
    for ax, r, name in zip(axes, shown, names, strict=True):
        steps = r.steps
        start, duration = _floats(steps, "start_s"), _floats(steps, "duration_s")
        columns = [_floats(steps, c) if c in steps else np.zeros(len(steps)) for c in CATEGORIES]
        slots = sum(column[0] for column in columns)
        stack = np.stack(columns, axis=1) * (100.0 / slots)  # (rows, categories) %
        extra = np.stack([_floats(steps, "num_running")], axis=1) if "num_running" in steps else None
        x, y = step_series(start, duration, stack)
        top = np.cumsum(y, axis=1)
        for j, cat in enumerate(CATEGORIES):
            low = top[:, j - 1] if j else np.zeros(len(x))
            handles[CATEGORY_LABELS[cat]] = ax.fill_between(
                x, low, top[:, j], step="post", color=CATEGORY_COLORS[cat], linewidth=0
            )
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of arena")
        _title(ax, name, colors[r.engine], f"  ({int(slots):,} slots)")
        if extra is not None:
            twin = ax.twinx()
            xr, running = step_series(start, duration, extra[:, 0])
            (line,) = twin.plot(xr, running, drawstyle="steps-post", color="black", linewidth=0.8)
            handles["running requests (right axis)"] = line
            twin.set_ylabel("running")
            twin.set_ylim(bottom=0)
    axes[-1].set_xlabel("time (s)")
    more = f"; {hidden} more runs not drawn" if hidden > 0 else ""
    fig.suptitle(f"KV arena occupancy over time (% of token slots, from steps.csv){more}")
    legend_outside(fig, list(handles.values()), list(handles))
    return save(fig, out)


_MEMORY_COLORS = {
    "torch_allocated_bytes": "#4C72B0",
    "torch_reserved_bytes": "#DD8452",
    "torch_inactive_split_bytes": "#937860",
    "nvml_used_bytes": "#C44E52",
    "nvml_process_bytes": "#8172B2",
}


def memory_columns(run: Run) -> list[str]:
    """Every numeric `*_bytes` column of steps.csv (torch and NVML collectors, and any later one)."""
    return [c for c, v in run.steps.items() if c.endswith("_bytes") and is_numeric_dtype(v)]


def plot_memory_timeline(runs: Iterable[Run | Path | str], out: Path) -> list[Path]:
    """Physical device memory over time per run (GiB) against the KV arena's size."""
    runs = [r for r in ordered(runs) if memory_columns(r) and _has(r, "start_s", "duration_s")]
    if not runs:
        raise PlotSkipped("no run has memory columns (*_bytes) in steps.csv: simulations measure none")
    shown = runs[:MAX_PANELS]
    plt = pyplot()
    names = display_names(shown)
    colors = engine_colors(r.engine for r in shown)
    fig, axes = _panels(plt, len(shown), 2.2)
    handles = {}
    palette = dict(_MEMORY_COLORS)  # columns no collector names yet get spare colors, per figure
    spare = iter(("#55A868", "#CCB974", "#64B5CD", "#8C8C8C", "#DA8BC3", "#1B9E77"))
    for ax, r, name in zip(axes, shown, names, strict=True):
        steps = r.steps
        start, duration = _floats(steps, "start_s"), _floats(steps, "duration_s")
        for column in memory_columns(r):
            color = palette.get(column) or palette.setdefault(column, next(spare, "black"))
            values = _floats(steps, column) / GIB
            ok = np.isfinite(values)
            if not ok.any():
                continue
            x, y = step_series(start[ok], duration[ok], values[ok])
            (line,) = ax.plot(x, y, drawstyle="steps-post", color=color, linewidth=1.2)
            handles.setdefault(column, line)
        arena, source = r.arena_bytes
        if arena is not None:
            line = ax.axhline(arena / GIB, color="black", linestyle="--", linewidth=1)
            handles.setdefault(f"KV arena ({source})", line)
        ax.set_ylabel("GiB")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        _title(ax, name, colors[r.engine])
    axes[-1].set_xlabel("time (s)")
    fig.suptitle("Physical device memory over time (GiB), torch and NVML, against the KV arena")
    legend_outside(fig, list(handles.values()), list(handles))
    return save(fig, out)


def roofline_efficiency(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode rows' (start_s, batch_size, efficiency): roofline time per step / measured time per step.

    `roofline_s` covers the row's `num_steps` steps like `duration_s` does, so the per-step
    ratio (roofline_s / num_steps) / (duration_s / num_steps) is the row's ratio. Prefill
    rows carry NaN and are left out.
    """
    steps = run.steps
    count = _floats(steps, "num_steps") if "num_steps" in steps else np.ones(len(steps))
    per_step = _floats(steps, "duration_s") / count
    roof = _floats(steps, "roofline_s") / count
    keep = np.isfinite(roof) & (per_step > 0)
    if "kind" in steps:
        keep &= steps["kind"].astype(str).to_numpy() == "decode"
    start, batch = _floats(steps, "start_s"), _floats(steps, "batch_size")
    return start[keep], batch[keep], roof[keep] / per_step[keep]


def plot_roofline(runs: Iterable[Run | Path | str], out: Path) -> list[Path]:
    """Roofline efficiency of decode steps over time and by batch size (100 % = at the floor)."""
    runs = [r for r in ordered(runs) if _has(r, "roofline_s", "start_s", "duration_s", "batch_size")]
    runs = [r for r in runs if len(roofline_efficiency(r)[0])]
    if not runs:
        raise PlotSkipped("no run has roofline_s in steps.csv: only real GPU runs measure it")
    plt = pyplot()
    names = display_names(runs)
    colors = engine_colors(r.engine for r in runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4), layout="constrained")
    lines = {}
    for r, name, style in zip(runs, names, linestyles(runs), strict=True):
        start, batch, eff = roofline_efficiency(r)
        left.scatter(start, 100 * eff, s=4, color=colors[r.engine], alpha=0.5, linewidths=0)
        sizes = np.unique(batch)
        medians = [100 * float(np.median(eff[batch == b])) for b in sizes]
        (line,) = right.plot(
            sizes, medians, marker="o", markersize=3, color=colors[r.engine], linestyle=style
        )
        lines[name] = line
    left.set(xlabel="time (s)", ylabel="efficiency (%)", title="each decode row")
    right.set(xlabel="batch size (requests)", ylabel="median efficiency (%)", title="by batch size")
    right.set_xscale("log", base=2)
    right.xaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    for ax in (left, right):
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    fig.suptitle("Roofline efficiency of decode steps: (bytes to move ÷ read bandwidth) ÷ measured step time")
    legend_outside(fig, list(lines.values()), list(lines), title="engine")
    return save(fig, out)
