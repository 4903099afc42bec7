"""Plots of a trace: length histograms (the paper's Figure 11) and arrivals over time.

Pure functions of a `Trace`, written to PNG (and SVG beside it); matplotlib is imported
lazily so the rest of kvbench works without it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvbench.report.style import pyplot
from kvbench.requests import Trace
from kvbench.results.files import save_figure
from kvbench.results.outputs import PLOT_TAG


def plot_trace(trace: Trace, out: Path) -> list[Path]:
    """Write `out` (PNG) and its SVG twin; returns both paths."""
    plt = pyplot("kvbench trace plot")
    fig = trace_figure(trace)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png"), out.with_suffix(".svg")]
    for path in paths:
        save_figure(fig, path, dpi=120, metadata={"Title": f"{PLOT_TAG}: {trace.name}"})  # results.outputs
    plt.close(fig)
    return paths


def trace_figure(trace: Trace):
    """Input and output length histograms and the arrival rate, side by side (not yet saved)."""
    plt = pyplot("kvbench trace plot")
    prompt = np.fromiter((r.prompt_len for r in trace.requests), dtype=np.int64)
    output = np.fromiter((r.output_len for r in trace.requests), dtype=np.int64)
    arrival = np.fromiter((r.arrival_s for r in trace.requests), dtype=np.float64)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
    for ax, values, label in ((axes[0], prompt, "input"), (axes[1], output, "output")):
        ax.hist(values, bins=min(100, max(10, len(np.unique(values)))), color="#4C72B0", density=True)
        ax.axvline(values.mean(), color="#C44E52", linestyle="--", label=f"mean {values.mean():,.1f}")
        ax.set(xlabel=f"# {label} tokens", ylabel="density", title=f"{label} length")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))  # 2e-4, not 0.000200
        _readable(ax.xaxis, integer=True)
        ax.legend()
    span = float(arrival[-1] - arrival[0])
    if span > 0:
        bins = max(1, min(200, int(np.ceil(span))))
        counts, edges = np.histogram(arrival, bins=bins)
        axes[2].plot(edges[:-1], counts / np.diff(edges), color="#55A868")
        axes[2].set(xlabel="time (s)", ylabel="requests / s", title="arrivals")
        _readable(axes[2].xaxis, integer=False)
    else:
        axes[2].text(0.5, 0.5, "all requests arrive at t = 0", ha="center", va="center")
        axes[2].set_axis_off()
    fig.suptitle(f"{trace.name}: {len(trace):,} requests")
    return fig


def _readable(axis, integer: bool) -> None:
    """At most about six ticks, labelled `25k` once the axis passes 10,000 and `1,500` below.

    Mooncake's prompts reach 126,195 tokens: matplotlib's default eight six-digit labels in a
    third of the figure's width ran into each other.
    """
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    def label(value: float, _pos) -> str:
        if max(abs(v) for v in axis.get_view_interval()) >= 10_000:
            return f"{value / 1000:,g}k" if value else "0"
        return f"{value:,g}"

    axis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10], integer=integer))
    axis.set_major_formatter(FuncFormatter(label))
