"""`kvbench trace plot` stays readable: no two tick labels of an axis touch or come closer than
one em, on Mooncake's six-digit prompt lengths and on short synthetic traces alike."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from workloads.spec import WorkloadSpec, build_trace

pytest.importorskip("matplotlib")

from kvbench.report.style import pyplot
from kvbench.report.trace_plot import plot_trace, trace_figure

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
DPI = 120  # plot_trace's


def crowded_labels(fig) -> list[str]:
    """Every pair of neighbouring drawn tick labels closer than one em (the labels' font size)."""
    fig.set_dpi(DPI)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    crowded = []
    for ax in fig.axes:
        for axis, along in ((ax.xaxis, 0), (ax.yaxis, 1)):
            low, high = sorted(axis.get_view_interval())
            labels = [
                tick.label1
                for tick in axis.get_major_ticks()
                if low <= tick.get_loc() <= high and tick.label1.get_visible() and tick.label1.get_text()
            ]
            boxes = [(label.get_window_extent(renderer), label.get_text()) for label in labels]
            boxes.sort(key=lambda item: item[0].get_points()[0][along])
            for (a, text_a), (b, text_b) in itertools.pairwise(boxes):
                em = labels[0].get_fontsize() * DPI / 72
                gap = b.get_points()[0][along] - a.get_points()[1][along]
                if gap < em:
                    crowded.append(f"{ax.get_title()}: {text_a!r} and {text_b!r} {gap:.0f} px apart")
    return crowded


WIDE = WorkloadSpec("uniform:prompt=891..126195,output=1..2000", num_requests=3000, rate=3.4)  # Mooncake's


def traces():
    yield build_trace(WIDE)
    yield build_trace(WorkloadSpec("fixed:prompt=7,output=3", num_requests=20, rate=50.0))
    yield build_trace(WorkloadSpec("sharegpt-paper", num_requests=500, rate=2.0))
    if MOONCAKE.is_file():
        yield build_trace(WorkloadSpec(str(MOONCAKE)))


def test_tick_labels_never_crowd():
    plt = pyplot()
    for trace in traces():
        fig = trace_figure(trace)
        try:
            assert crowded_labels(fig) == [], trace.name
        finally:
            plt.close(fig)


def test_long_axes_read_in_thousands(tmp_path):
    trace = build_trace(WIDE)
    fig = trace_figure(trace)
    fig.canvas.draw()
    inputs, outputs, _ = fig.axes
    assert "100k" in [t.get_text() for t in inputs.get_xticklabels()]
    assert "1,000" in [t.get_text() for t in outputs.get_xticklabels()]
    pyplot().close(fig)
    paths = plot_trace(trace, tmp_path / "t.png")
    assert [p.name for p in paths] == ["t.png", "t.svg"] and all(p.stat().st_size > 0 for p in paths)
