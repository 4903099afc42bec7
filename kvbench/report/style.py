"""What every kvbench figure shares: engine colors, category colors, saving, skipping.

One color per engine in every figure (a reader who learnt that `paged` is red in Figure 2
should not have to re-read a legend in Figure 12). Engines that `engines.ENGINES` does not
know get colors from a spare palette in name order, so they too stay stable within a report.
matplotlib is imported lazily so the rest of kvbench works without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.metrics.occupancy import CATEGORIES
from kvbench.results.files import save_figure

ENGINE_COLORS = {
    "static": "#7F7F7F",
    "orca-max": "#4C72B0",
    "orca-pow2": "#8172B2",
    "orca-oracle": "#55A868",
    "paged": "#C44E52",
    "paged-static": "#DA8BC3",
    "paged-prefix": "#E17C05",
    "vmm": "#17BECF",
    "hybrid": "#BCBD22",
    "jenga": "#8C564B",
    "hybrid-prefix": "#7B7C11",  # a darker hybrid: the same pool, prompt blocks shared by content
    "jenga-prefix": "#5E3A32",
}
_SPARE = ("#CCB974", "#64B5CD", "#937860", "#DD8452", "#8C613C", "#1B9E77", "#7570B3", "#E7298A")
ENGINE_ORDER = tuple(ENGINE_COLORS)

CATEGORY_COLORS = {
    "token_states": "#2A9D8F",
    "outside_window": "#1D5C63",  # a darker token states: held, never read again
    "reservation": "#8AB17D",
    "internal_frag": "#E9C46A",
    "allocator_overhead": "#F4A261",
    "mapped_idle": "#B5838D",
    "external_frag": "#E76F51",
    "free": "#E8E8E8",
}
CATEGORY_LABELS = {
    "token_states": "token states",
    "outside_window": "outside window",
    "reservation": "reservation",
    "internal_frag": "internal frag.",
    "allocator_overhead": "allocator overhead",
    "mapped_idle": "mapped idle",
    "external_frag": "external frag.",
    "free": "free",
}
assert tuple(CATEGORY_COLORS) == CATEGORIES


class PlotSkipped(Exception):
    """The saved results lack what this figure needs (e.g. memory columns of a simulation)."""


def engine_colors(engines: Iterable[str]) -> dict[str, str]:
    """Known engines keep their color; unknown ones take spare colors in name order."""
    unknown = sorted({e for e in engines if e not in ENGINE_COLORS})
    spare = {e: _SPARE[i % len(_SPARE)] for i, e in enumerate(unknown)}
    return {**ENGINE_COLORS, **spare}


def engine_rank(engine: str) -> tuple[int, str]:
    """Sort key: the order of the engine table (static ... paged), then unknown names."""
    return (ENGINE_ORDER.index(engine) if engine in ENGINE_ORDER else len(ENGINE_ORDER), engine)


def pyplot(what: str = "kvbench's plots"):
    """matplotlib's pyplot on the file-only Agg backend, or a one-line error naming `what` needs it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KvbenchError(f"{what}: matplotlib is missing: pip install 'kvbench[plot]'") from None
    return plt


def save(fig, out: Path) -> list[Path]:
    """Write `out` as PNG and SVG (same stem), close the figure; returns both paths."""
    plt = pyplot()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png"), out.with_suffix(".svg")]
    with plt.rc_context({"svg.fonttype": "none"}):  # SVG text stays text: searchable, editable, smaller
        for path in paths:
            save_figure(fig, path, dpi=110)
    plt.close(fig)
    return paths


def step_series(
    start: np.ndarray, duration: np.ndarray, values: np.ndarray, max_points: int = 800
) -> tuple[np.ndarray, np.ndarray]:
    """A piecewise-constant series of step rows, ready for a `steps-post` drawing.

    Row i holds `values[i]` from its start until the next row starts (idle gaps keep the
    last state: nothing changes until an arrival). Returns (x, y) with one more x than rows
    (the last row's end) and y repeated at the end. Longer series are resampled to
    `max_points` equal bins holding the exact time-weighted mean over each bin, so a
    million-row real run draws in the same time as a short one without aliasing spikes.
    `values` may be (rows,) or (rows, k).
    """
    order = np.argsort(start, kind="stable")
    start, duration, values = start[order], duration[order], values[order]
    knots = np.append(start, start[-1] + duration[-1])  # (rows + 1,)
    if len(start) <= max_points or knots[-1] <= knots[0]:
        return knots, np.concatenate([values, values[-1:]])
    widths = np.diff(knots)  # (rows,)
    area = np.cumsum(values * (widths if values.ndim == 1 else widths[:, None]), axis=0)
    area = np.concatenate([np.zeros_like(values[:1]), area])  # (rows + 1, ...)
    edges = np.linspace(knots[0], knots[-1], max_points + 1)
    if values.ndim == 1:
        at_edges = np.interp(edges, knots, area)
    else:
        at_edges = np.stack([np.interp(edges, knots, area[:, j]) for j in range(values.shape[1])], axis=1)
    step = edges[1] - edges[0]
    means = np.diff(at_edges, axis=0) / step
    return edges, np.concatenate([means, means[-1:]])


def legend_outside(fig, handles, labels, title: str | None = None) -> None:
    """One legend for the figure, right of the data, so no curve is hidden behind it."""
    fig.legend(handles, labels, loc="outside right center", frameon=False, title=title)
