"""Each engine's sustained request rate from a sweep's cells, refined by bisection.

The definitions (threshold, baseline, bisection) are in docs/SWEEPS.md; the arithmetic on
(rate, latency) points is the pure `kvbench.sweep.stats`. This module reads the sweep's rows
and, to bisect, asks the sweep to run more cells.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Protocol

from kvbench.sweep.grid import BASELINE, BISECT, Cell
from kvbench.sweep.progress import Progress
from kvbench.sweep.stats import Verdict, bisect_rate, sustained_rate

if TYPE_CHECKING:
    from kvbench.sweep.plan import SweepPlan


class Cells(Protocol):
    """What the search needs from a running sweep: its rows, and more cells run on demand."""

    rows: dict[str, dict]  # sweep.csv rows by cell id
    progress: Progress

    def plan_cells(self, cells: list[Cell]) -> None: ...

    def run(self, cell: Cell) -> dict: ...


def _latency(rows: list[dict]) -> float | None:
    """Mean normalized latency over a point's finished repeats (None: all failed)."""
    values = [row["normalized_latency_s"] for row in rows if row["status"] == "ok"]
    return sum(values) / len(values) if values else None


def sustained_table(plan: SweepPlan, state: Cells, grid: list[Cell]) -> list[dict]:
    """Each group's verdict, refined by bisection; rows of sustained.csv."""
    by_group: dict[tuple, list[Cell]] = defaultdict(list)
    for cell in grid:
        by_group[cell.group].append(cell)
    out = []
    for group, cells in by_group.items():
        threshold, unloaded, source = _threshold(plan, state, cells[0])
        rates: dict[float, list[dict]] = defaultdict(list)
        for cell in cells:
            rates[cell.rate].append(state.rows[cell.id])
        verdict, bisected = _bisect(plan, state, cells[0], rates, threshold)
        engine, trace, bs, kv, seed = group
        base = plan.config(cells[0])
        out.append(
            {
                "engine": engine, "model": base.model, "trace": trace, "block_size": bs, "kv_cache_gib": kv,
                "emulate_gpu": base.emulate_gpu, "seed": seed,
                "sustained_rate": verdict.sustained_rate if verdict else None,
                "latency_threshold_s": threshold, "unloaded_latency_s": unloaded, "threshold_source": source,
                "last_pass_rate": verdict.last_pass if verdict else None,
                "first_fail_rate": verdict.first_fail if verdict else None,
                "rates_tried": len(rates), "bisect_cells": bisected,
                "how": verdict.how if verdict else "no threshold: the unloaded cell failed",
            }
        )  # fmt: skip
    return out


def _threshold(plan: SweepPlan, state: Cells, cell: Cell) -> tuple[float | None, float | None, str]:
    """(threshold, unloaded latency, where the threshold came from) for `cell`'s group."""
    if plan.sustained.threshold_s is not None:
        return plan.sustained.threshold_s, None, "--latency-threshold"
    baseline = Cell(BASELINE, cell.engine, cell.trace, None, cell.block_size, cell.kv_cache_gib, cell.seed)
    row = state.rows[baseline.id]
    if row["status"] != "ok":
        return None, None, f"baseline cell {baseline.id} failed"
    unloaded = row["normalized_latency_s"]
    source = f"{plan.sustained.multiple:g} x unloaded ({baseline.id})"
    if row["peak_batched_requests"] > 1:
        source += (
            f"; its requests overlapped (peak batch {row['peak_batched_requests']}): lower --baseline-rate"
        )
    return plan.sustained.multiple * unloaded, unloaded, source


def _bisect(plan: SweepPlan, state: Cells, first: Cell, rates: dict, threshold: float | None):
    """Refine the verdict with up to --bisect midpoint rates (each run for every repeat)."""
    if threshold is None:
        state.progress.plan(-plan.sustained.bisect * plan.axes.repeats)
        return None, 0

    def verdict() -> Verdict:
        return sustained_rate([(rate, _latency(rows)) for rate, rows in rates.items()], threshold)

    current, done = verdict(), 0
    while done < plan.sustained.bisect and current.bracket:
        rate = bisect_rate(current.bracket)
        cells = [
            Cell(BISECT, first.engine, first.trace, rate, first.block_size, first.kv_cache_gib, first.seed, r)
            for r in range(plan.axes.repeats)
        ]
        state.plan_cells(cells)
        rates[rate] = [state.run(cell) for cell in cells]
        current, done = verdict(), done + 1
    state.progress.plan(-(plan.sustained.bisect - done) * plan.axes.repeats)
    if done:
        current = Verdict(current.last_pass, current.first_fail, f"{current.how} (bisected {done}x)")
    return current, done * plan.axes.repeats
