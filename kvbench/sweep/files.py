"""A sweep's tables: sweep.csv (one row per cell) and sustained.csv, written atomically.

sweep.csv is rewritten whole after every cell (through a temporary file and a rename), so a
reader or a killed sweep sees the table before or after that cell, never half a row. A row
carries the cell's axis values, its status (`ok`, `failed` with the error, or `pending`) and
the key numbers of its summary.json; the cell folder keeps everything else. With `--repeats`,
each row also carries the mean and 95 % confidence half-width (`<metric>_mean`,
`<metric>_ci95`) of the key metrics over the repeats of its point.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.metrics.latency import percentile_key
from kvbench.metrics.occupancy import CATEGORIES
from kvbench.results.files import atomic_open, write_json
from kvbench.sweep.grid import Cell
from kvbench.sweep.stats import mean_ci95

CELL_COLUMNS = (
    "cell_id", "role", "status", "engine", "model", "trace", "rate", "block_size", "kv_cache_gib",
    "emulate_gpu", "seed", "repeat", "workload_seed", "mode", "wall_s", "error",
)  # fmt: skip
CI_METRICS = (
    "request_throughput", "output_token_throughput", "normalized_latency_s", "mean_ttft_s", "mean_tpot_s",
    "mean_batched_requests",
)  # fmt: skip
SUSTAINED_COLUMNS = (
    "engine", "model", "trace", "block_size", "kv_cache_gib", "emulate_gpu", "seed", "sustained_rate",
    "latency_threshold_s", "unloaded_latency_s", "threshold_source", "last_pass_rate", "first_fail_rate",
    "last_pass_latency_s", "first_fail_latency_s", "rates_tried", "bisect_cells", "how",
)  # fmt: skip


def metric_columns(config: RunConfig) -> list[str]:
    """The summary.json keys a sweep.csv row carries (the percentiles are the config's)."""
    ps = [percentile_key(p) for p in config.percentiles]
    columns = [
        "num_requests", "completed", "makespan_s", "request_throughput", "output_token_throughput",
        "total_token_throughput", "normalized_latency_s",
        *(f"{stat}_{metric}_s" for metric in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", *ps)),
        "mean_queueing_s",
    ]  # fmt: skip
    if config.slo.given():
        columns += ["goodput", "goodput_fraction"]
    columns += [
        "mean_batched_requests", "peak_batched_requests", "num_preemptions", "preempted_requests",
        "num_slots", "kv_budget_bytes", "saturated_share", *(f"occupancy_{c}" for c in CATEGORIES),
    ]  # fmt: skip
    return columns


def cell_row(cell: Cell, config: RunConfig, status: str, summary: dict | None, error: str, wall_s) -> dict:
    """One sweep.csv row: axis values, status, and the key metrics of a finished cell."""
    row = {
        "cell_id": cell.id, "role": cell.role, "status": status, "engine": cell.engine,
        "model": config.model, "trace": cell.trace, "rate": config.workload.rate,
        "block_size": cell.block_size, "kv_cache_gib": cell.kv_cache_gib, "emulate_gpu": config.emulate_gpu,
        "seed": cell.seed, "repeat": cell.repeat, "workload_seed": cell.workload_seed,
        "mode": (summary or {}).get("mode", ""), "wall_s": wall_s, "error": error,
    }  # fmt: skip
    if summary:
        busy = summary.get("busy_s") or 0.0
        flat = {**summary, "saturated_share": summary.get("saturated_s", 0.0) / busy if busy else math.nan}
        flat.update({f"occupancy_{k}": v for k, v in (summary.get("occupancy") or {}).items()})
        row.update({key: flat.get(key) for key in metric_columns(config)})
    return row


def point_key(row: dict) -> tuple:
    """Rows that repeat the same point (everything but the repeat and its seed)."""
    return tuple(row[k] for k in ("engine", "trace", "rate", "block_size", "kv_cache_gib", "seed", "role"))


def add_confidence_intervals(rows: Sequence[dict], metrics: Sequence[str] = CI_METRICS) -> None:
    """Give each row `<metric>_mean` and `<metric>_ci95` over the ok rows of its point."""
    by_point: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        if row["status"] == "ok":
            by_point[point_key(row)].append(row)
    for row in rows:
        peers = by_point.get(point_key(row), [])
        for metric in metrics:
            values = [float(p[metric]) for p in peers if p.get(metric) is not None]
            mean, half = mean_ci95(values)
            row[f"{metric}_mean"], row[f"{metric}_ci95"] = mean, half


def write_table(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """Write a CSV whole or not at all: a temporary file beside it, renamed over it."""
    with atomic_open(path, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: _cell_text(row.get(k)) for k in columns} for row in rows)


write_json_atomically = write_json  # sweep.json: every JSON file kvbench writes is atomic


def _cell_text(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def read_table(path: Path) -> dict[str, dict[str, str]]:
    """A previous sweep.csv by cell id ({} if there is none)."""
    if not path.is_file():
        return {}
    with open(path, newline="", encoding="utf-8") as f:  # as kvbench writes it, whatever the locale
        return {row["cell_id"]: row for row in csv.DictReader(f)}
