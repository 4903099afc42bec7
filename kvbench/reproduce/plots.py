"""A figure run on several seeds: its headline numbers as means with their 95 % intervals.

The per-seed plots (latency against rate, bars per engine) are the first seed's; this one plot
shows what the seeds add, the spread, with the paper's number beside each mean where it has
one. Colors are the report's (`kvbench.report.style`), so an engine reads alike everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from kvbench.report.style import PlotSkipped, engine_colors, pyplot, save
from kvbench.reproduce.rows import Row

# per figure: the metrics (a prefix of the row's metric) whose intervals are plotted, and the axis label
HEADLINE = {
    "fig2": ("token_states_%", "token states (% of the KV cache)"),
    "fig13": ("mean_batched_requests", "mean batched requests"),
    "fig12": ("sustained_rate_req_s", "sustained rate (req/s)"),
    "fig14": ("sustained_rate_req_s", "sustained rate (req/s)"),
    "fig16": ("sustained_rate_req_s", "sustained rate (req/s)"),
    "fig17": ("sustained_rate_req_s", "sustained rate (req/s)"),
    "fig15": ("saved_%@", "KV saved by sharing (%)"),
    "fig18b": ("normalized_latency_s@bs", "normalized latency (s/token)"),
    "fig19": ("overhead_ms_per_preemption@", "ms per preemption"),
}


def plot_seed_intervals(rows: Sequence[Row], out: Path) -> list[Path]:
    """One panel per workload: each headline number's mean over seeds with its interval (a
    sustained rate's bracket where that is wider), the paper's value as a diamond."""
    if not rows or rows[0].figure not in HEADLINE:
        raise PlotSkipped("no headline metric for this figure")
    prefix, label = HEADLINE[rows[0].figure]
    shown = [r for r in rows if r.metric.startswith(prefix) and r.kvbench is not None and r.n > 1]
    if not shown:
        raise PlotSkipped("fewer than two seeds measured the headline numbers")
    workloads = list(dict.fromkeys(r.workload for r in shown))
    plt = pyplot()
    colors = engine_colors(r.engine for r in shown)
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.4), layout="constrained",
                             squeeze=False)  # fmt: skip
    for ax, workload in zip(axes[0], workloads, strict=True):
        mine = [r for r in shown if r.workload == workload]
        for x, r in enumerate(mine):
            high = r.high if r.high is not None and math.isfinite(r.high) else r.kvbench
            low = r.low if r.low is not None else r.kvbench
            ax.errorbar([x], [r.kvbench], yerr=[[r.kvbench - low], [high - r.kvbench]], fmt="o", capsize=4,
                        color=colors[r.engine])  # fmt: skip
            if r.high is not None and math.isinf(r.high):
                ax.annotate("no fail", (x, high), textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=7)  # fmt: skip
            if r.paper is not None:
                ax.scatter([x], [r.paper], marker="D", s=40, facecolor="none", edgecolor="black", zorder=4)
        ticks = [f"{r.engine}\n{r.metric.removeprefix(prefix)}".strip() for r in mine]
        ax.set_xticks(range(len(mine)), ticks, fontsize=7, rotation=30)
        ax.set(title=workload, ylabel=label)
        ax.grid(True, axis="y", alpha=0.3)
    n = max(r.n for r in shown)
    fig.suptitle(f"{rows[0].figure}: mean over {n} seeds, 95 % interval (diamond: the paper)", fontsize=10)
    return save(fig, out)
