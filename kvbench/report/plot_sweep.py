"""Figures of a sweep (`sweep.csv`, one row per cell): Figures 12, 13 and 18b.

A sweep varies engine x rate (x block size x budget x trace x seed). Every figure draws one
panel per (model, trace, KV budget) the sweep holds, averages over seeds, and reads only
`sweep.csv` (and `sustained.csv` for the sustained-rate marks), so it renders from the files
alone. Cells whose metrics are empty (failed or not yet run) are left out.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
from pandas.api.types import is_numeric_dtype

from kvbench.report.style import PlotSkipped, engine_colors, engine_rank, legend_outside, pyplot, save
from kvbench.results.load import Sweep, load_sweep

PANEL_KEYS = ("model", "trace", "kv_cache_gib")
DEFAULT_BLOCK_SIZE = 16
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _sweep(sweep: Sweep | Path | str) -> Sweep:
    return sweep if isinstance(sweep, Sweep) else load_sweep(Path(sweep))


def panels(sweep: Sweep) -> list[tuple[str, np.ndarray]]:
    """(title, row mask) per distinct (model, trace, KV budget) of the sweep."""
    keys = [k for k in PANEL_KEYS if k in sweep.cells]
    values = [sweep.strings(k) for k in keys]
    combos = sorted({tuple(v[i] for v in values) for i in range(sweep.num_cells)})
    out = []
    for combo in combos:
        mask = np.ones(sweep.num_cells, dtype=bool)
        for v, c in zip(values, combo, strict=True):
            mask &= v == c
        title = ", ".join(
            f"{c} GiB KV" if k == "kv_cache_gib" else c for k, c in zip(keys, combo, strict=True)
        )
        out.append((title or "sweep", mask))
    return out


def _block_size_of(sweep: Sweep, mask: np.ndarray) -> tuple[np.ndarray, str]:
    """Rows at the default block size (16) where present, else the most common: Figure 12 fixes it."""
    sizes = sweep.column("block_size")
    if not np.isfinite(sizes[mask]).any():
        return mask, ""
    present = Counter(sizes[mask].tolist())
    chosen = DEFAULT_BLOCK_SIZE if DEFAULT_BLOCK_SIZE in present else present.most_common(1)[0][0]
    note = f", block size {chosen:g}" if len(present) > 1 else ""
    return mask & (sizes == chosen), note


def _mean_by(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean of y over equal x (seeds), NaNs dropped; sorted by x."""
    ok = np.isfinite(x) & np.isfinite(y)
    xs = np.unique(x[ok])
    return xs, np.array([y[ok][x[ok] == v].mean() for v in xs])


def _engines(sweep: Sweep, mask: np.ndarray) -> list[str]:
    return sorted(set(sweep.strings("engine")[mask]), key=engine_rank)


def _sustained(sweep: Sweep, engine: str, title_values: dict[str, str], block: float | None) -> float | None:
    """The engine's sustained rate in this panel, from sustained.csv (None where absent)."""
    table = sweep.sustained
    column = next((c for c in ("sustained_rate", "sustained_rate_rps", "rate") if c in table), None)
    if column is None or "engine" not in table:
        return None
    mask = table["engine"].astype(str).to_numpy() == engine
    for key, value in title_values.items():
        if key in table:
            mask &= np.array([f"{v:g}" if isinstance(v, float) else str(v) for v in table[key]]) == value
    if block is not None and "block_size" in table and is_numeric_dtype(table["block_size"]):
        mask &= table["block_size"].to_numpy(dtype=np.float64) == block
    if not is_numeric_dtype(table[column]):
        return None
    rates = table[column].to_numpy(dtype=np.float64)[mask]
    rates = rates[np.isfinite(rates)]
    return float(rates.mean()) if len(rates) else None


def _threshold(sweep: Sweep) -> float | None:
    table = sweep.sustained
    for column in ("threshold_s", "threshold", "latency_threshold_s"):
        if column in table and is_numeric_dtype(table[column]):
            values = table[column].to_numpy(dtype=np.float64)
            if np.isfinite(values).any():
                return float(np.nanmax(values))
    return None


def _rate_figure(sweep: Sweep, metric: str, ylabel: str, title: str, out: Path, mark_sustained: bool):
    if metric not in sweep.cells or "rate" not in sweep.cells:
        raise PlotSkipped(f"{sweep.path / 'sweep.csv'} has no rate or {metric} column")
    plt = pyplot()
    groups = panels(sweep)
    colors = engine_colors(sweep.strings("engine"))
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups) + 2.5, 4.4), squeeze=False,
                             layout="constrained")  # fmt: skip
    handles: dict = {}
    marks: dict = {}  # sustained rate and threshold: listed after the engines
    threshold = _threshold(sweep) if mark_sustained else None
    rates, values = sweep.column("rate"), sweep.column(metric)
    drawn = False
    for ax, (panel, mask) in zip(axes[0], groups, strict=True):
        mask, note = _block_size_of(sweep, mask)
        chosen = sweep.column("block_size")[mask]
        block = float(chosen[0]) if len(chosen) and np.isfinite(chosen[0]) else None
        ids = {k: sweep.strings(k)[mask][0] for k in PANEL_KEYS if k in sweep.cells and mask.any()}
        top = 0.0
        for engine in _engines(sweep, mask):
            rows = mask & (sweep.strings("engine") == engine)
            xs, ys = _mean_by(rates[rows], values[rows])
            if not len(xs):
                continue
            drawn = True
            top = max(top, float(ys.max()))
            (line,) = ax.plot(xs, ys, marker="o", markersize=4, color=colors[engine])
            handles.setdefault(engine, line)
            rate = _sustained(sweep, engine, ids, block) if mark_sustained else None
            if rate is not None:
                mark = ax.axvline(rate, color=colors[engine], linestyle=":", linewidth=1.3)
                marks.setdefault("sustained rate (dotted, sustained.csv)", mark)
        if threshold is not None:
            marks.setdefault("latency threshold", ax.axhline(threshold, color="grey", linestyle="--", lw=1))
        clip = metric == "normalized_latency_s" and top > 1.0
        ax.set_ylim(0, 1.0 if clip else None)
        ax.set(xlabel="request rate (req/s)", title=f"{panel}{note}")
        ax.set_ylabel(f"{ylabel}{', clipped at 1' if clip else ''}")
        ax.grid(True, alpha=0.3)
    if not drawn:
        raise PlotSkipped(f"{sweep.path / 'sweep.csv'}: no cell has a value for {metric}")
    fig.suptitle(title)
    handles.update(marks)
    legend_outside(fig, list(handles.values()), list(handles), title="engine")
    return save(fig, out)


def plot_latency_vs_rate(sweep: Sweep | Path | str, out: Path) -> list[Path]:
    """Figure 12: normalized latency against request rate per engine, sustained rates marked."""
    return _rate_figure(
        _sweep(sweep), "normalized_latency_s", "normalized latency (s/token)",
        "Normalized latency (mean E2EL ÷ output tokens, s/token) vs request rate", out, True,
    )  # fmt: skip


def plot_batched_vs_rate(sweep: Sweep | Path | str, out: Path) -> list[Path]:
    """Figure 13 over a sweep: mean batched requests against request rate per engine."""
    return _rate_figure(
        _sweep(sweep), "mean_batched_requests", "mean batched requests",
        "Mean batched requests (time-weighted over busy time) vs request rate", out, False,
    )  # fmt: skip


def plot_block_size(sweep: Sweep | Path | str, out: Path) -> list[Path]:
    """Figure 18b: normalized latency against block size, one line per (engine, rate)."""
    sweep = _sweep(sweep)
    sizes = sweep.column("block_size")
    latency = sweep.column("normalized_latency_s")
    if len(set(sizes[np.isfinite(sizes) & np.isfinite(latency)].tolist())) < 2:
        raise PlotSkipped(f"{sweep.path / 'sweep.csv'}: fewer than two block sizes with results")
    plt = pyplot()
    groups = panels(sweep)
    colors = engine_colors(sweep.strings("engine"))
    rates = sweep.column("rate")
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups) + 2.5, 4.4), squeeze=False,
                             layout="constrained")  # fmt: skip
    handles: dict = {}
    for ax, (panel, mask) in zip(axes[0], groups, strict=True):
        for engine in _engines(sweep, mask):
            rows = mask & (sweep.strings("engine") == engine)
            if len(set(sizes[rows & np.isfinite(latency)].tolist())) < 2:
                continue  # the block size does not vary for this engine (contiguous engines)
            for i, rate in enumerate(np.unique(rates[rows])):
                at = rows & ((rates == rate) if math.isfinite(rate) else ~np.isfinite(rates))
                xs, ys = _mean_by(sizes[at], latency[at])
                style = ("-", "--", ":", "-.")[i % 4]
                label = f"{engine}, {rate:g} req/s" if math.isfinite(rate) else engine
                (line,) = ax.plot(
                    xs, ys, marker=MARKERS[i % len(MARKERS)], linestyle=style, color=colors[engine]
                )
                handles.setdefault(label, line)
        present = sorted(set(sizes[mask & np.isfinite(sizes)].tolist()))
        ax.set_xscale("log", base=2)
        ax.set_xticks(present, [f"{s:g}" for s in present])
        ax.set(xlabel="block size (token slots per block, log scale)", ylabel="normalized latency (s/token)",
               title=panel)  # fmt: skip
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    if not handles:
        raise PlotSkipped(f"{sweep.path / 'sweep.csv'}: no engine ran at two block sizes")
    fig.suptitle("Normalized latency (s/token) vs block size")
    legend_outside(fig, list(handles.values()), list(handles), title="engine, rate")
    return save(fig, out)
