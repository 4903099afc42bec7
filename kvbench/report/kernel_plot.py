"""Plots of a saved kernels.csv: latency against context (the paper's Fig. 18a) and bandwidth use.

Pure functions of the CSV (results on disk are the source of truth), written as PNG and SVG;
matplotlib is imported lazily so the benchmark runs without it.
"""

from __future__ import annotations

import csv
import math
from collections import Counter, defaultdict
from pathlib import Path

from kvbench.report.style import pyplot

ORDER = ("kvbench-paged", "kvbench-contiguous", "torch-sdpa", "flex-paged",
         "flashinfer-cuda-cores", "flashinfer-tensor-cores")  # fmt: skip
COLORS = {
    "kvbench-paged": "#C44E52", "kvbench-contiguous": "#4C72B0", "torch-sdpa": "#55A868",
    "flex-paged": "#8172B2", "flashinfer-cuda-cores": "#CCB974", "flashinfer-tensor-cores": "#64B5CD",
}  # fmt: skip
PAGED = {"kvbench-paged", "flex-paged", "flashinfer-cuda-cores", "flashinfer-tensor-cores"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")
_INTS = ("batch", "context", "block_size", "q_heads", "kv_heads", "gqa", "head_dim", "copies")
_FLOATS = ("us", "us_p10", "us_p90", "gbps", "bw_fraction", "vs_contiguous", "max_abs_err", "atol")


def read_rows(path: Path) -> list[dict]:
    """kernels.csv as dicts with numbers parsed (empty or unparsable numbers become NaN)."""
    with open(path, newline="", encoding="utf-8") as f:  # as kvbench writes it, whatever the locale
        rows = list(csv.DictReader(f))
    for row in rows:
        for key in _INTS:
            row[key] = int(row[key])
        for key in _FLOATS:
            try:
                row[key] = float(row[key])
            except ValueError:
                row[key] = math.nan
        row["ragged"] = row["ragged"] == "True"
    return rows


def plot_all(csv_path: Path, out_dir: Path) -> list[Path]:
    """Both figures from one CSV; returns the files written."""
    # full attention only, uncapped (a file written before the cap was a column has none)
    rows = [
        r for r in read_rows(csv_path) if r.get("window", "0") == "0" and not float(r.get("softcap") or 0)
    ]
    return plot_latency(rows, out_dir / "latency") + plot_bandwidth_fraction(
        rows, out_dir / "bandwidth_fraction"
    )


def plot_latency(rows: list[dict], out: Path) -> list[Path]:
    """Latency (µs) against context length, one panel per batch size (8 and 32 when present).

    Paged backends get one line per block size; backends that do not page get one line
    (their time does not depend on the block size; the median over block sizes is drawn).
    Only the most common (GQA, heads, head dim, dtype, raggedness) of the CSV is drawn.
    """
    plt = pyplot("kvbench kernels' plots")
    timed = [r for r in rows if r["status"] in ("ok", "wrong") and math.isfinite(r["us"])]
    if not timed:
        return _empty(plt, out, "no timed cells in this CSV")
    shape = Counter(_shape(r) for r in timed).most_common(1)[0][0]
    timed = [r for r in timed if _shape(r) == shape]
    batches = sorted({r["batch"] for r in timed})
    panels = [b for b in (8, 32) if b in batches] or batches[:4]
    block_sizes = sorted({r["block_size"] for r in timed})
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5 * len(panels) + 3, 4.4), squeeze=False, layout="constrained"
    )
    handles = {}
    for ax, batch in zip(axes[0], panels, strict=True):
        series = defaultdict(lambda: defaultdict(list))  # (backend, block size or None) -> context -> us
        for r in timed:
            if r["batch"] == batch:
                key = (r["backend"], r["block_size"] if r["backend"] in PAGED else None)
                series[key][r["context"]].append(r["us"])
        for (backend, bs), points in sorted(series.items(), key=lambda kv: (_rank(kv[0][0]), kv[0][1] or 0)):
            xs = sorted(points)
            ys = [sorted(points[x])[len(points[x]) // 2] for x in xs]
            paged = bs is not None
            label = f"{backend}, block {bs}" if paged else backend
            marker = MARKERS[block_sizes.index(bs) % len(MARKERS)] if paged else "."
            (line,) = ax.plot(xs, ys, marker=marker, color=COLORS.get(backend, "black"),
                              linestyle="-" if paged else "--", label=label)  # fmt: skip
            handles.setdefault(label, line)
        contexts = sorted({r["context"] for r in timed if r["batch"] == batch})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(contexts, [str(c) for c in contexts])
        ax.xaxis.set_minor_locator(plt.matplotlib.ticker.NullLocator())
        ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(plt.matplotlib.ticker.LogFormatter(minor_thresholds=(2, 0.5)))
        ax.set(xlabel="context length (tokens)", ylabel="latency (µs, log scale)", title=f"batch {batch}")
        ax.grid(True, which="major", alpha=0.3)
        ax.grid(True, which="minor", axis="y", alpha=0.1)
    gqa, kv_heads, head_dim, dtype, ragged = shape
    fig.suptitle(
        f"decode attention: {kv_heads * gqa} query / {kv_heads} KV heads, head dim {head_dim}, {dtype}"
        + (", ragged lengths" if ragged else "")
    )
    fig.legend(handles.values(), handles.keys(), loc="outside right center", frameon=False)
    return _save(plt, fig, out)


def plot_bandwidth_fraction(rows: list[dict], out: Path) -> list[Path]:
    """A heatmap: each cell (row) × backend (column), the fraction of the measured read bandwidth."""
    plt = pyplot("kvbench kernels' plots")
    if not rows:
        return _empty(plt, out, "no rows in this CSV")
    backends = sorted({r["backend"] for r in rows}, key=_rank)
    cells = sorted({(r["batch"], r["context"], r["block_size"], r["gqa"], r["cell"]) for r in rows})
    value = {(r["cell"], r["backend"]): r for r in rows}
    grid = [[value.get((c[-1], b), {}).get("bw_fraction", math.nan) for b in backends] for c in cells]
    fig, ax = plt.subplots(figsize=(1.6 * len(backends) + 3.5, 0.38 * len(cells) + 2.2))
    top = max([1.0] + [x for line in grid for x in line if math.isfinite(x)])  # above 1: L2 hits
    cmap = plt.get_cmap("viridis").with_extremes(bad="#DDDDDD")  # grey: failed or skipped
    image = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=top, aspect="auto")
    for i, cell in enumerate(cells):
        for j, backend in enumerate(backends):
            row = value.get((cell[-1], backend))
            fraction = grid[i][j]
            text = f"{fraction:.2f}" if math.isfinite(fraction) else (row["status"] if row else "—")
            color = "white" if math.isfinite(fraction) and fraction < 0.6 else "black"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(range(len(backends)), backends, rotation=30, ha="right")
    ax.set_yticks(range(len(cells)), [c[-1] for c in cells])
    ax.set(xlabel="backend", ylabel="cell (batch, context, block size, GQA ratio)")
    bandwidth = next((r["gbps"] / r["bw_fraction"] for r in rows if r["bw_fraction"] > 0), math.nan)
    ax.set_title(f"fraction of the measured read bandwidth ({bandwidth / 1e3:.2f} TB/s), useful bytes")
    fig.colorbar(image, ax=ax, label="useful bytes/s ÷ read bandwidth")
    return _save(plt, fig, out)


def _shape(row: dict) -> tuple:
    return row["gqa"], row["kv_heads"], row["head_dim"], row["dtype"], row["ragged"]


def _rank(backend: str) -> int:
    return ORDER.index(backend) if backend in ORDER else len(ORDER)


def _empty(plt, out: Path, message: str) -> list[Path]:
    fig, ax = plt.subplots(figsize=(5, 2))
    ax.text(0.5, 0.5, message, ha="center", va="center")
    ax.set_axis_off()
    return _save(plt, fig, out)


def _save(plt, fig, out: Path) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png"), out.with_suffix(".svg")]
    for path in paths:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths
