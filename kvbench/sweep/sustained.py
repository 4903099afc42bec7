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
from kvbench.sweep.stats import Verdict, bisect_rate, bracket_width, sustained_rate

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
    """(threshold, unloaded latency, where the threshold came from) for `cell`'s group.

    One bound for every engine of a comparison (the paper reads every engine's rate where
    normalized latency crosses the same line): without --latency-threshold, `multiple` times
    the lowest unloaded latency among the compared engines' baselines (same trace, block size,
    budget and seed). Each engine's own baseline is still reported (`unloaded_latency_s`).
    """
    if plan.sustained.threshold_s is not None:  # no baselines run
        return plan.sustained.threshold_s, None, "--latency-threshold"
    own = state.rows[_baseline(cell, cell.engine).id]
    unloaded = own["normalized_latency_s"] if own["status"] == "ok" else None
    rows = [(state.rows[_baseline(cell, engine).id], engine) for engine in plan.axes.engines]
    ok = [(row["normalized_latency_s"], engine, row) for row, engine in rows if row["status"] == "ok"]
    if not ok:
        return None, unloaded, f"every baseline of {cell.trace} failed"
    lowest, engine, row = min(ok, key=lambda item: item[0])
    source = (
        f"{plan.sustained.multiple:g} x {lowest:.4g} s/token, the lowest unloaded latency of "
        f"{len(ok)} engines ({engine}), shared by all"
    )
    if row["peak_batched_requests"] > 1:
        peak = row["peak_batched_requests"]
        source += f"; its requests overlapped (peak batch {peak}): lower --baseline-rate"
    return plan.sustained.multiple * lowest, unloaded, source


def _baseline(cell: Cell, engine: str) -> Cell:
    return Cell(BASELINE, engine, cell.trace, None, cell.block_size, cell.kv_cache_gib, cell.seed)


def _bisect(plan: SweepPlan, state: Cells, first: Cell, rates: dict, threshold: float | None):
    """Refine the verdict by bisection: `bisect` rounds, or until the bracket is `bracket` wide
    (each midpoint run for every repeat)."""
    options, repeats = plan.sustained, plan.axes.repeats
    if threshold is None:
        state.progress.plan(-options.bisect * repeats)
        return None, 0

    def verdict() -> Verdict:
        return sustained_rate([(rate, _latency(rows)) for rate, rows in rates.items()], threshold)

    def wanted(current: Verdict) -> bool:
        if not current.bracket or done >= options.max_rounds:
            return False
        return options.bracket is None or bracket_width(current.bracket) > options.bracket

    current, done = verdict(), 0
    while wanted(current):
        rate = bisect_rate(current.bracket)
        cells = [
            Cell(BISECT, first.engine, first.trace, rate, first.block_size, first.kv_cache_gib, first.seed, r)
            for r in range(repeats)
        ]
        if done >= options.bisect:  # beyond the rounds counted up front: the total grows
            state.progress.plan(repeats)
        state.plan_cells(cells)
        rates[rate] = [state.run(cell) for cell in cells]
        current, done = verdict(), done + 1
    state.progress.plan(-max(0, options.bisect - done) * repeats)
    if done:
        current = Verdict(current.last_pass, current.first_fail, f"{current.how} (bisected {done}x)")
    return current, done * repeats
