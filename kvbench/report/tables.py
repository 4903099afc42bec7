"""The tables of `kvbench report` and `kvbench compare`: result folders found and tabulated.

A path given to either command is a run folder (summary.json), a sweep folder (sweep.csv,
cells/), or a folder whose children are run or sweep folders (a demo folder). Anything else
is a one-line error. Everything shown is read from those files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.metrics.occupancy import PAPER_OTHER
from kvbench.report.format import aligned, count, number, percent, significant
from kvbench.report.style import engine_rank
from kvbench.results.load import NOT_RESULTS, Run, Sweep, label_runs, load_run, load_sweep


def not_results(path: Path) -> KvbenchError:
    return KvbenchError(f"{path}: {NOT_RESULTS}")


@dataclass(frozen=True)
class Results:
    """What a list of paths holds: standalone runs and sweeps (whose cells stay inside them)."""

    runs: tuple[Run, ...]
    sweeps: tuple[Sweep, ...]
    inputs: tuple[Path, ...]

    def all_runs(self) -> list[Run]:
        """The runs, then every sweep's cell folders (what `compare` lists)."""
        cells = [p for sweep in self.sweeps for p in sweep.folders]
        return list(self.runs) + _load_runs(cells, taken=[r.path for r in self.runs])


def _load_runs(paths: Sequence[Path], taken: Sequence[Path] = ()) -> list[Run]:
    labels = label_runs([*taken, *paths])[len(taken) :]
    return [load_run(p, label) for p, label in zip(paths, labels, strict=True)]


def discover(paths: Sequence[Path]) -> Results:
    """Sort `paths` into runs and sweeps (children one level down for a folder of results)."""
    run_paths: list[Path] = []
    sweep_paths: list[Path] = []
    for path in map(Path, paths):
        if (path / "summary.json").is_file():
            run_paths.append(path)
        elif (path / "sweep.csv").is_file():
            sweep_paths.append(path)
        elif path.is_dir():
            children = sorted(p for p in path.iterdir() if p.is_dir())
            runs = [p for p in children if (p / "summary.json").is_file()]
            sweeps = [p for p in children if (p / "sweep.csv").is_file() and p not in runs]
            if not runs and not sweeps:
                raise not_results(path)
            run_paths += runs
            sweep_paths += sweeps
        else:
            raise not_results(path)
    sweep_paths = list(dict.fromkeys(p.resolve() for p in sweep_paths))
    # a run given twice counts once, a sweep's cell given beside its sweep too (the sweep shows it)
    cells = {p.parent for s in sweep_paths for p in (s / "cells").glob("*/summary.json")}
    run_paths = [p for p in dict.fromkeys(p.resolve() for p in run_paths) if p not in cells]
    runs = sorted(_load_runs(run_paths), key=lambda r: (engine_rank(r.engine), r.label))
    return Results(tuple(runs), tuple(load_sweep(p) for p in sweep_paths), tuple(map(Path, paths)))


# ---- the key table: one column per metric, one row per run ----------------------------------


def _num(key: str, digits: int, scale: float = 1.0) -> Callable[[Run], str]:
    """digits 0: a count (`format.count`); otherwise a rate or time (`format.significant`)."""

    def get(run: Run) -> str:
        value = run.summary.get(key)
        return (count if digits == 0 else significant)(None if value is None else scale * float(value))

    return get


def _occ(category: str) -> Callable[[Run], str]:
    def get(run: Run) -> str:
        occupancy, _ = run.occupancy
        if category == "other":  # the paper's "External frag. & Others"
            value = sum(occupancy.get(c, 0.0) for c in PAPER_OTHER)
        else:
            value = occupancy.get(category)
        return percent(value)  # None: "-"

    return get


def _requests(run: Run) -> str:
    return f"{run.summary.get('completed', '?')}/{run.summary.get('num_requests', '?')}"


def _rate(run: Run) -> str:
    return "-" if run.rate is None else f"{run.rate:g}"


def _budget(run: Run) -> str:
    value = run.summary.get("kv_budget_bytes")
    return "-" if value is None else f"{value / 2**30:.2f}"


@dataclass(frozen=True)
class Metric:
    header: str
    get: Callable[[Run], str]


KEY_METRICS = (
    Metric("engine", lambda r: r.engine),
    Metric("mode", lambda r: str(r.summary.get("mode", "-"))),
    Metric("requests", _requests),
    Metric("rate req/s", _rate),
    Metric("throughput req/s", _num("request_throughput", 3)),
    Metric("output tok/s", _num("output_token_throughput", 1)),
    Metric("norm. latency s/tok", _num("normalized_latency_s", 4)),
    Metric("mean TTFT s", _num("mean_ttft_s", 3)),
    Metric("mean TPOT s", _num("mean_tpot_s", 4)),
    Metric("batched mean", _num("mean_batched_requests", 1)),
    Metric("batched peak", _num("peak_batched_requests", 0)),
    Metric("preemptions", _num("num_preemptions", 0)),
    Metric("token states %", _occ("token_states")),
    Metric("reservation %", _occ("reservation")),
    Metric("internal frag. %", _occ("internal_frag")),
    Metric("ext. frag. & other %", _occ("other")),
    Metric(
        "occupancy over", lambda r: ("saturated" if r.occupancy[1] else "busy") if r.occupancy[0] else "-"
    ),
)
SETTING_METRICS = (
    Metric("model", lambda r: str(r.summary.get("model", "-"))),
    Metric("trace", lambda r: str(r.summary.get("trace", "-"))),
    Metric("KV budget GiB", _budget),
    Metric("block size", lambda r: str(r.config.get("block_size", "-"))),
    Metric("makespan s", _num("makespan_s", 1)),
    Metric("alloc. overhead %", _occ("allocator_overhead")),
    Metric("external frag. %", _occ("external_frag")),
    Metric("free %", _occ("free")),
)
# summary keys that only some runs have (percentiles, ITL, goodput, collectors): shown where present.
# The key table (one row per run) takes the tail and the headline numbers; compare, a row per metric,
# has room for every percentile.
_KEY_HINTS = (
    "p99_",
    "mean_itl_s",
    "goodput",
    "roofline_efficiency",
    "energy_j",
    "peak_used",
    "peak_reserved",
)
_COMPARE_HINTS = (
    "p50_",
    "p90_",
    "p95_",
    "p99_",
    "_itl_",
    "goodput",
    "roofline_efficiency",
    "energy",
    "peak_",
)


def scalar_keys(runs: Sequence[Run]) -> list[str]:
    """Every top-level number of the runs' summaries, in first-seen order."""
    keys: dict[str, None] = {}
    for run in runs:
        for key, value in run.summary.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                keys.setdefault(key)
    return list(keys)


def _plain(value) -> str:
    return number(value)


def optional_metrics(
    runs: Sequence[Run], hints: Sequence[str] = _KEY_HINTS, everything: bool = False
) -> list[Metric]:
    """Summary numbers beyond the fixed ones: those whose names contain one of `hints`, or all."""
    shown = {"request_throughput", "output_token_throughput", "normalized_latency_s", "mean_ttft_s",
             "mean_tpot_s", "mean_batched_requests", "peak_batched_requests", "num_preemptions",
             "completed", "num_requests", "makespan_s", "kv_budget_bytes"}  # fmt: skip
    keys = [k for k in scalar_keys(runs) if k not in shown]
    if not everything:
        keys = [k for k in keys if any(hint in k for hint in hints)]
    return [Metric(k, lambda r, k=k: _plain(r.summary.get(k))) for k in keys]


def metric_table(runs: Sequence[Run], metrics: Sequence[Metric]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): a "run" column, then one column per metric."""
    return ["run", *(m.header for m in metrics)], [[r.label, *(m.get(r) for m in metrics)] for r in runs]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cell(text: str) -> str:  # one table cell: a line break (a folder's name may hold one) ends the row
        return " ".join(str(text).replace("|", "\\|").splitlines())

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned columns for a terminal, text left, numbers right (`kvbench.report.format.aligned`:
    the CLI draws the same cells as a rich table on a terminal)."""
    return aligned(header, rows)


def side_by_side(runs: Sequence[Run], metrics: Sequence[Metric]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) with one column per run and one row per metric: `compare`'s layout."""
    return ["", *(r.label for r in runs)], [[m.header, *(m.get(r) for r in runs)] for m in metrics]


def compare(paths: Sequence[Path], *, markdown: bool = False, everything: bool = False) -> str:
    """The runs under `paths` side by side (one column per run), in the order the paths were given
    (the runs of one folder in engine order)."""
    given = [Path(p).resolve() for p in paths]

    def order(run: Run) -> int:
        where = run.path.resolve()
        return next((i for i, p in enumerate(given) if p == where or p in where.parents), len(given))

    runs = sorted(discover(paths).all_runs(), key=order)
    if not runs:  # a sweep whose cells are gone: an empty table would look like a result
        raise KvbenchError(
            f"{paths[0]}: no run folder to compare (summary.json), not even in a sweep's cells/"
        )
    metrics = [*KEY_METRICS, *SETTING_METRICS, *optional_metrics(runs, _COMPARE_HINTS, everything)]
    header, rows = side_by_side(runs, metrics)
    return markdown_table(header, rows) if markdown else text_table(header, rows)
