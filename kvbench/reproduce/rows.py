"""What every figure of `kvbench reproduce` hands back: rows of kvbench beside the paper.

A figure's folder holds `figure.csv` (the rows), `figure.json` (rows, verdict, notes, plots),
so the report and the claims table are rebuilt from the files alone, whichever figures ran in
which invocation.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvbench.results.files import atomic_open, read_json, write_text

COLUMNS = ("figure", "engine", "workload", "metric", "kvbench", "paper", "ratio")


@dataclass(frozen=True)
class Setting:
    """Model, KV budget and how far to scale the paper's request rates for this machine."""

    model: str = "opt-13b"
    kv_cache_gib: float = 12.0
    rate_scale: float = 1.0  # the paper's rates times this (a faster model needs more load)
    real: bool = False
    cost_model: str | None = None
    paper_threshold: bool = True  # Fig. 12: 0.5 s/token as the paper; else 4 x unloaded latency
    device: str = "cuda"  # real runs (a CPU run of a tiny model checks the real path in tests)


@dataclass(frozen=True)
class Options:
    quick: bool
    setting: Setting
    num_requests: int | None = None  # overrides the figures' counts (tests)
    seed: int = 0

    def pick(self, quick, full, real=None):
        """This run's size of a grid: `real` for a quick run on a GPU, where every point is a
        real run of tens of seconds and the calibrated simulation fills in between."""
        if self.quick and self.setting.real and real is not None:
            return real
        return quick if self.quick else full

    def requests(self, quick: int, full: int, real: int | None = None) -> int:
        return self.num_requests or self.pick(quick, full, real)


@dataclass(frozen=True)
class Row:
    figure: str
    engine: str
    workload: str
    metric: str
    kvbench: float | None
    paper: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.kvbench is None or not self.paper:
            return None
        return self.kvbench / self.paper

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


@dataclass(frozen=True)
class FigureResult:
    name: str
    title: str
    rows: tuple[Row, ...]
    verdict: str  # one line, computed from the rows
    plots: tuple[str, ...] = ()  # file names inside the figure folder
    notes: tuple[str, ...] = field(default_factory=tuple)


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def write_figure(result: FigureResult, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_open(folder / "figure.csv", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for row in result.rows:
            writer.writerow([_cell(row.to_dict()[c]) for c in COLUMNS])
    data = {
        "name": result.name, "title": result.title, "verdict": result.verdict, "plots": list(result.plots),
        "notes": list(result.notes), "rows": [row.to_dict() for row in result.rows],
    }  # fmt: skip
    write_text(folder / "figure.json", json.dumps(data, indent=2) + "\n")


def read_figure(folder: Path) -> FigureResult | None:
    """A figure written by `write_figure`, or None where the folder holds none."""
    path = folder / "figure.json"
    if not path.is_file():
        return None
    data = read_json(path)  # a broken file: one line naming it
    rows = tuple(Row(**{k: r[k] for k in COLUMNS if k != "ratio"}) for r in data["rows"])
    return FigureResult(
        data["name"], data["title"], rows, data["verdict"], tuple(data["plots"]), tuple(data["notes"])
    )


def lookup(rows, figure: str, engine: str, workload: str, metric: str) -> float | None:
    for row in rows:
        if (row.figure, row.engine, row.workload, row.metric) == (figure, engine, workload, metric):
            return row.kvbench
    return None


def markdown(result: FigureResult) -> str:
    """The figure's rows as a markdown table, kvbench beside the paper."""
    lines = [
        "| engine | workload | metric | kvbench | paper | kvbench / paper |",
        "|---|---|---|---|---|---|",
    ]
    for row in result.rows:
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        lines.append(
            f"| {row.engine} | {row.workload} | {row.metric} | {_num(row.kvbench)} | {_num(row.paper)} "
            f"| {ratio} |"
        )
    return "\n".join(lines)


def _num(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
