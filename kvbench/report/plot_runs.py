"""Figures comparing run folders by their summaries and requests: Figures 2 and 13, latency CDFs.

Each function takes run folders (paths or loaded `Run`s) and an output path (the stem of
a PNG and an SVG), reads only what the runs saved, and returns the files it wrote. A figure
whose data is missing raises `PlotSkipped` with the reason, which a report shows as a note.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from pandas.api.types import is_numeric_dtype

from kvbench.metrics.occupancy import CATEGORIES
from kvbench.paper import FIG13_BATCHED, FIG13_RATE, PAPER_NAMES
from kvbench.report.style import (
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    PlotSkipped,
    engine_colors,
    engine_rank,
    legend_outside,
    pyplot,
    save,
)
from kvbench.results.load import Run, as_runs

LINESTYLES = ("-", "--", ":", "-.")


def ordered(runs: Iterable[Run | Path | str]) -> list[Run]:
    """Runs in engine-table order (static ... paged), then by label."""
    return sorted(as_runs(runs), key=lambda r: (engine_rank(r.engine), r.label))


def display_names(runs: Sequence[Run], wrap: bool = False) -> list[str]:
    """The engine name (as in ENGINES); the run's label beside (or, `wrap`, under) it where engines repeat."""
    engines = [r.engine for r in runs]
    sep = "\n" if wrap else " "
    return [r.engine if engines.count(r.engine) == 1 else f"{r.engine}{sep}({r.label})" for r in runs]


def linestyles(runs: Sequence[Run]) -> list[str]:
    """Solid for an engine's first run, then dashed, dotted...: repeats of an engine stay apart."""
    seen: dict[str, int] = {}
    styles = []
    for r in runs:
        styles.append(LINESTYLES[seen.get(r.engine, 0) % len(LINESTYLES)])
        seen[r.engine] = seen.get(r.engine, 0) + 1
    return styles


def _tick(name: str, engine: str) -> str:
    paper = PAPER_NAMES.get(engine)
    return f"{name}\n{paper}" if paper else name


def plot_occupancy_bars(runs: Iterable[Run | Path | str], out: Path) -> list[Path]:
    """Figure 2: each run's KV arena split into the six categories, as stacked % bars.

    Uses `occupancy_saturated` (steps during which a request waited: the paper's setting)
    where the run ever saturated, else the busy-time `occupancy`; such bars are hatched and
    the title says so.
    """
    runs = [r for r in ordered(runs) if r.occupancy[0]]
    if not runs:
        raise PlotSkipped("no run has an occupancy breakdown in summary.json")
    plt = pyplot()
    names = display_names(runs, wrap=True)
    fig, ax = plt.subplots(figsize=(1.3 * len(runs) + 3.5, 4.8), layout="constrained")
    x = np.arange(len(runs))
    bottom = np.zeros(len(runs))
    saturated = [r.occupancy[1] for r in runs]
    for cat in CATEGORIES:
        values = np.array([100 * r.occupancy[0].get(cat, 0.0) for r in runs])
        bars = ax.bar(x, values, bottom=bottom, color=CATEGORY_COLORS[cat], label=CATEGORY_LABELS[cat],
                      edgecolor="white", linewidth=0.5)  # fmt: skip
        for bar, sat in zip(bars, saturated, strict=True):
            if not sat:
                bar.set_hatch("//")
        if cat == "token_states":
            for xi, v in zip(x, values, strict=True):
                ax.text(xi, v / 2, f"{v:.1f}%", ha="center", va="center", fontsize=9, color="white",
                        fontweight="bold")  # fmt: skip
        bottom += values
    colors = engine_colors(r.engine for r in runs)
    ax.set_xticks(x, [_tick(n, r.engine) for n, r in zip(names, runs, strict=True)])
    for label, r in zip(ax.get_xticklabels(), runs, strict=True):
        label.set_color(colors[r.engine])
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of the KV arena (token slots)")
    if all(saturated):
        when = "time-weighted while requests waited for memory (occupancy_saturated)"
    elif not any(saturated):
        when = "time-weighted over busy time (occupancy; no run saturated)"
    else:
        when = (
            "time-weighted while requests waited (occupancy_saturated);\nhatched: never saturated, busy time"
        )
    ax.set_title(f"KV cache occupancy (%), {when}", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    legend_outside(fig, handles[::-1], labels[::-1], title="category")
    return save(fig, out)


def _paper_batched(run: Run) -> float | None:
    """Figure 13's value for this engine where the run is the paper's setting (model, trace, rate)."""
    trace = str(run.summary.get("trace", ""))
    if run.summary.get("model") != "opt-13b" or trace not in FIG13_RATE:
        return None
    if run.rate is None or not math.isclose(run.rate, FIG13_RATE[trace]):
        return None
    return FIG13_BATCHED[trace].get(run.engine)


def plot_batched_bars(runs: Iterable[Run | Path | str], out: Path) -> list[Path]:
    """Figure 13: mean batched requests per run (time-weighted over busy time), peak marked."""
    runs = [r for r in ordered(runs) if r.summary.get("mean_batched_requests") is not None]
    if not runs:
        raise PlotSkipped("no run has mean_batched_requests in summary.json")
    plt = pyplot()
    names = display_names(runs, wrap=True)
    colors = engine_colors(r.engine for r in runs)
    fig, ax = plt.subplots(figsize=(1.3 * len(runs) + 3.5, 4.4), layout="constrained")
    x = np.arange(len(runs))
    means = np.array([float(r.summary["mean_batched_requests"]) for r in runs])
    bars = ax.bar(x, means, color=[colors[r.engine] for r in runs])
    ax.bar_label(bars, [f"{m:.1f}" for m in means], label_type="center", fontsize=9, color="white",
                 fontweight="bold")  # fmt: skip
    peaks = [r.summary.get("peak_batched_requests") for r in runs]
    if any(p is not None for p in peaks):
        ax.scatter(x, [math.nan if p is None else p for p in peaks], marker="_", s=400, color="black",
                   label="peak", zorder=3)  # fmt: skip
    paper = [_paper_batched(r) for r in runs]
    if any(p is not None for p in paper):
        ax.scatter(x, [math.nan if p is None else p for p in paper], marker="D", s=40, facecolor="none",
                   edgecolor="black", label="paper, Fig. 13", zorder=4)  # fmt: skip
    ax.set_xticks(x, [_tick(n, r.engine) for n, r in zip(names, runs, strict=True)])
    ax.set_ylabel("requests in the batch")
    ax.set_title("Mean batched requests per engine (time-weighted over busy time)", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    bar = plt.matplotlib.patches.Patch(facecolor="#BBBBBB", label="mean (bar, engine's color)")
    legend_outside(fig, [bar, *handles], [bar.get_label(), *labels])
    return save(fig, out)


_LATENCIES = (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s/token)"), ("e2el_s", "E2EL (s)"))


def _two_five(value: float, _pos) -> str:
    """Minor log ticks labelled at 2 and 5 x 10^k, so a range inside one decade still reads."""
    if value <= 0:
        return ""
    lead = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if lead in (2, 5) else ""


def plot_latency_cdfs(runs: Iterable[Run | Path | str], out: Path) -> list[Path]:
    """Empirical CDFs of TTFT, TPOT and E2EL per run, from requests.csv (log time axes)."""
    runs = [r for r in ordered(runs) if "e2el_s" in r.requests]
    if not runs:
        raise PlotSkipped("no run has a requests.csv with latencies")
    plt = pyplot()
    names = display_names(runs)
    colors = engine_colors(r.engine for r in runs)
    styles = linestyles(runs)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), layout="constrained")
    lines = {}
    for ax, (column, title) in zip(axes, _LATENCIES, strict=True):
        positive = True
        for r, name, style in zip(runs, names, styles, strict=True):
            if column not in r.requests or not is_numeric_dtype(r.requests[column]):
                continue
            col = r.requests[column].to_numpy(dtype=np.float64)
            if not np.isfinite(col).any():
                continue
            values = np.sort(col[np.isfinite(col)])
            positive &= bool(values[0] > 0)
            frac = np.arange(1, len(values) + 1) / len(values)
            (line,) = ax.step(values, frac, where="post", color=colors[r.engine], linestyle=style, label=name)
            lines.setdefault(name, line)
        if positive and ax.has_data():
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            low, high = ax.get_xlim()
            narrow = high < 100 * low  # under two decades: label 2 and 5 x 10^k too
            ax.xaxis.set_minor_formatter(
                plt.matplotlib.ticker.FuncFormatter(_two_five)
                if narrow
                else plt.matplotlib.ticker.NullFormatter()
            )
        ax.set(xlabel=f"{title}, log scale" if positive else title, ylabel="fraction of requests",
               title=f"{title.split(' ')[0]} CDF", ylim=(0, 1.02))  # fmt: skip
        ax.grid(True, alpha=0.3)
    fig.suptitle("Per-request latency distributions (requests.csv)")
    legend_outside(fig, list(lines.values()), list(lines), title="engine")
    return save(fig, out)
