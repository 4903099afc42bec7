"""What every figure of `kvbench reproduce` hands back: rows of kvbench beside the paper.

A figure's folder holds `figure.csv` (the rows), `figure.json` (rows, verdict, notes, plots),
so the report and the claims table are rebuilt from the files alone, whichever figures ran in
which invocation.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench.reproduce.verdicts import Interval
from kvbench.results.files import atomic_open, read_json, write_text

if TYPE_CHECKING:
    from kvbench.sweep.deadline import Deadline

SEED_PREFIX = "seed-"  # <figure>/seed-<s>/: one seed's runs, in the layout of a single-seed figure
# a seed's runs made at another commit's run code, kept as evidence beside the runs that replaced
# them (`<seed folder>/earlier/<sweep>/`): not the figure's, and not held out by its calibration
SET_ASIDE = "earlier"
# low/high/n came later: files written before them read as points of one seed
COLUMNS = ("figure", "engine", "workload", "metric", "kvbench", "paper", "ratio", "low", "high", "n")


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
    # real runs: a `kvbench calibrate` file of this model on this GPU; each rate figure's real
    # runs are then placed around every engine's sustained rate as the simulator calibrated by it
    # finds it (`kvbench.reproduce.sweeps.placed_rates`), not on a fixed grid
    placement: str | None = None
    # with `placement`: compute the placements only (a CPU ahead of the GPU), run no real cell
    place_only: bool = False
    # real runs: short prefills replayed as CUDA graphs (`--prefill-graphs`), so that a prefill
    # step costs its device work, not the host's launches (results/reference/alpaca-prefill-profile)
    prefill_graphs: bool = False

    def run_fields(self) -> dict:
        """The RunConfig fields every run of this setting shares beyond model and budget: a real
        run's device and prefill mode, a simulated one's cost model."""
        if self.real:
            return {"device": self.device, "prefill_graphs": self.prefill_graphs}
        return {"device": "cpu", "cost_model": self.cost_model}


@dataclass(frozen=True)
class Options:
    quick: bool
    setting: Setting
    num_requests: int | None = None  # overrides the figures' counts (tests)
    seed: int = 0
    repeats: int = 1  # seeds seed .. seed + repeats - 1, each in <figure>/seed-<s>/
    deadline: Deadline | None = None  # sweeps start no cell expected to end past it (never recorded)

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
    """One number beside the paper's: a value, or a mean over `n` seeds, with where it lies.

    [low, high] is the 95 % confidence interval of a mean over seeds, a sustained rate's bracket
    [last pass, first fail) (high inf: no rate failed), or the interval of a ratio of such
    quantities; None for both: the value is a point (one seed of a quantity measured exactly).
    """

    figure: str
    engine: str
    workload: str
    metric: str
    kvbench: float | None
    paper: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 1
    # merged over seeds: each seed's value in seed order (NaN: that seed has none); what the
    # verdicts compare seed by seed (`Interval.paired_ratio`); figure.json keeps it, figure.csv not
    seeds: tuple[float, ...] = ()

    @property
    def interval(self) -> Interval | None:
        """The verdicts' view of the row; None where nothing was measured: no value, or NaN (a
        run that has none, such as Figure 2's share weighted by the time requests wait in a run
        where none waited), which no verdict may hold against the paper as a number."""
        if self.kvbench is None or math.isnan(self.kvbench):
            return None
        low = self.kvbench if self.low is None else self.low
        high = self.kvbench if self.high is None else self.high
        return Interval(self.kvbench, low, high, self.seeds)

    @property
    def ratio(self) -> float | None:
        if self.kvbench is None or not self.paper:
            return None
        return self.kvbench / self.paper

    def to_dict(self) -> dict:
        data = {**asdict(self), "ratio": self.ratio}
        seeds = data.pop("seeds")
        if seeds:  # a seed without a value as null: JSON has no NaN
            data["seeds"] = [None if math.isnan(v) else v for v in seeds]
        return data


@dataclass(frozen=True)
class FigureResult:
    name: str
    title: str
    rows: tuple[Row, ...]
    verdict: str  # one line, computed from the rows
    plots: tuple[str, ...] = ()  # file names inside the figure folder
    notes: tuple[str, ...] = field(default_factory=tuple)


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
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
    rows = tuple(
        Row(
            **{k: r[k] for k in COLUMNS if k != "ratio" and k in r},
            seeds=tuple(math.nan if v is None else v for v in r.get("seeds") or ()),
        )
        for r in data["rows"]
    )
    return FigureResult(
        data["name"], data["title"], rows, data["verdict"], tuple(data["plots"]), tuple(data["notes"])
    )


def seed_folder(figure: Path, seed: int | None = None) -> Path:
    """One seed's folder of a figure (`seed` None: its lowest seed run there; a figure folder
    with no seed folder: itself, as written before seeds had folders)."""
    if seed is not None:
        return figure / f"{SEED_PREFIX}{seed}"
    seeds = sorted(
        (int(p.name[len(SEED_PREFIX) :]), p) for p in figure.glob(f"{SEED_PREFIX}*")
        if p.name[len(SEED_PREFIX) :].isdigit()
    )  # fmt: skip
    return seeds[0][1] if seeds else figure


def lookup(rows, figure: str, engine: str, workload: str, metric: str) -> float | None:
    row = find(rows, figure, engine, workload, metric)
    return None if row is None else row.kvbench


def find(rows, figure: str, engine: str, workload: str, metric: str) -> Row | None:
    for row in rows:
        if (row.figure, row.engine, row.workload, row.metric) == (figure, engine, workload, metric):
            return row
    return None


def merge_seeds(runs: Sequence[Sequence[Row]]) -> tuple[Row, ...]:
    """The rows of one figure run on several seeds: each number's mean and 95 % CI over seeds.

    A row that is itself an interval (a sustained-rate bracket, a ratio's interval) keeps the
    seeds' mean bracket where that is wider than the spread over seeds. Rows are matched by
    (engine, workload, metric); one seed's rows come back unchanged.
    """
    if len(runs) == 1:
        return tuple(runs[0])
    keyed: dict[tuple, list[Row]] = {}
    by_seed: dict[tuple, list[float]] = {}  # each seed's value, in seed order: NaN where it has none
    for seed, rows in enumerate(runs):
        for row in rows:
            key = (row.figure, row.engine, row.workload, row.metric)
            keyed.setdefault(key, []).append(row)
            finite = row.kvbench is not None and math.isfinite(row.kvbench)
            by_seed.setdefault(key, [math.nan] * len(runs))[seed] = row.kvbench if finite else math.nan
    merged = []
    for key, same in keyed.items():
        values = [r.kvbench for r in same if r.kvbench is not None and math.isfinite(r.kvbench)]
        first = same[0]
        if not values:
            merged.append(replace(first, n=0))
            continue
        spread = Interval.of_samples(values)
        measured = [r.interval for r in same if r.kvbench is not None and math.isfinite(r.kvbench)]
        low = min(spread.low, statistics.fmean(i.low for i in measured))
        high = max(spread.high, statistics.fmean(i.high for i in measured))
        point = low == high == spread.value
        merged.append(replace(first, kvbench=spread.value, low=None if point else low,
                              high=None if point else high, n=len(values),
                              seeds=tuple(by_seed[key])))  # fmt: skip
    return tuple(merged)


def markdown(result: FigureResult) -> str:
    """The figure's rows as a markdown table, kvbench beside the paper."""
    lines = [
        "| engine | workload | metric | kvbench [low, high] | n | paper | kvbench / paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result.rows:
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        lines.append(
            f"| {row.engine} | {row.workload} | {row.metric} | {with_interval(row)} | {row.n} "
            f"| {_num(row.paper)} | {ratio} |"
        )
    return "\n".join(lines)


def with_interval(row: Row) -> str:
    """The row as "mean [low, high]", or the value alone where it is a point."""
    if row.kvbench is None or row.low is None or row.high is None:
        return _num(row.kvbench)
    return f"{_num(row.kvbench)} [{_num(row.low)}, {_num(row.high)}]"


def _num(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
