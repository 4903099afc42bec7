"""A figure panel's committed sweep read back seed by seed, for pages that judge cells run across
several device calls (the `compare.py` of results/reference folders).

A real panel's cells arrive a few at a time: a device call stops before a cell it cannot finish,
and a resumed sweep writes that cell `pending` in sweep.csv until it runs. A page that read the
cells as a finished sweep would count a pending cell a fail (it has no latency) and report a
bracket the bisection has not reached, so a seed's bracket is read only once the seed is done:
no cell of its engine pending, and the bracket no wider than the sweep's `--bracket`.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from kvbench.reproduce.sweeps import bracket_at, rate_latencies
from kvbench.sweep.stats import bracket_width

PENDING = "pending"  # sweep.csv `status` of a cell a resumed sweep has yet to run


def seed_cells(sweep_csv: Path, engines: Sequence[str], seed: int) -> list[dict]:
    """The loaded cells of `engines` on one seed of a sweep.csv (the unloaded baselines left
    out; another seed's cells would read as more rates of one curve), `rate` and
    `normalized_latency_s` as numbers (None where a cell has none), in engine then rate order."""
    with open(sweep_csv, newline="", encoding="utf-8") as f:  # as kvbench writes it, whatever the locale
        rows = [r for r in csv.DictReader(f) if r["role"] != "baseline" and r["engine"] in engines]
    rows = [
        {**r, "rate": float(r["rate"]),
         "normalized_latency_s": float(r["normalized_latency_s"]) if r["normalized_latency_s"] else None}
        for r in rows if int(r["seed"]) == seed
    ]  # fmt: skip
    return sorted(rows, key=lambda r: (list(engines).index(r["engine"]), r["rate"]))


def done_brackets(
    rows: Sequence[dict], engines: Sequence[str], bound: float, width: float
) -> tuple[dict[str, tuple[float, float] | None], int]:
    """Each engine's sustained-rate bracket under `bound` from one seed's cells (`seed_cells`),
    None where it is not done (a cell of the engine still pending, no rate passed, or the bracket
    wider than `width`, the sweep's `--bracket`: bisection goes on), and the cells pending. An
    engine with a pending cell is not read at all: `bracket_at` would count the cell a fail, and
    where it lies (a grid rate above a bracket already narrow, or the bisection's next) the
    reading may still change."""
    pending = [r for r in rows if r["status"] == PENDING]
    brackets = {}
    for engine in engines:
        late = any(r["engine"] == engine for r in pending)
        found = bracket_at(rows, engine, bound)
        brackets[engine] = None if late or found is None or bracket_width(found) > width else found
    return brackets, len(pending)


def end_margins(rows: Sequence[dict], engine: str, bracket: tuple[float, float], bound: float) -> tuple:
    """How far each end of `engine`'s bracket fell from `bound`: normalized latency over the
    bound, less 1, at the last pass and the first fail, each rate read as `bracket_at` reads it
    (`rate_latencies`: None where a cell of the rate failed or has no latency, and for an open
    end, inf). A pass 0.2 % under the bound is a verdict another seed may reverse; one 20 %
    under is not."""
    latencies = rate_latencies(rows, engine)
    return tuple(None if latencies.get(rate) is None else latencies[rate] / bound - 1 for rate in bracket)
