"""Each engine's sustained request rate from a sweep's cells, refined by bisection.

The definitions (threshold, baseline, bisection) are in docs/SWEEPS.md; the arithmetic on
(rate, latency) points is the pure `kvbench.sweep.stats`. This module reads the sweep's rows
and, to bisect, asks the sweep to run more cells.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from kvbench.sweep.grid import BASELINE, BISECT, Cell
from kvbench.sweep.stats import Verdict, bisect_rate, bracket_width, rate_latency, sustained_rate

if TYPE_CHECKING:
    from kvbench.sweep.plan import SweepPlan


class Cells(Protocol):
    """What the search needs from a running sweep: its rows, and more cells run on demand."""

    rows: dict[str, dict]  # sweep.csv rows by cell id

    def plan_cells(self, cells: list[Cell]) -> None: ...

    def run(self, cell: Cell) -> dict: ...


def _latency(rows: list[dict]) -> float | None:
    """A rate's normalized latency from its cells' rows, as `rate_latency` reads repeats (None
    where any of them failed)."""
    return rate_latency([row["normalized_latency_s"] if row["status"] == "ok" else None for row in rows])


def _failed_repeats(rates: Mapping[float, list[dict]]) -> str:
    """Where some but not all of a rate's repeats failed, said in `how`: such a rate is read as
    over the bound, and a reader of sustained.csv sees why (a rate whose repeats all failed is
    the plain case and goes unsaid)."""
    said = []
    for rate, rows in sorted(rates.items()):
        failed = sum(row["status"] != "ok" for row in rows)
        if 0 < failed < len(rows):
            said.append(f"{failed} of {len(rows)} repeats failed at {rate:g}")
    return f"; {', '.join(said)} (read as over)" if said else ""


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
        verdict, bisected = _bisect(plan, state, cells[0], rates, threshold)  # `rates` gains its cells
        ends = _end_latencies(verdict, rates)
        how = verdict.how + _failed_repeats(rates) if verdict else "no threshold: the unloaded cell failed"
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
                "last_pass_latency_s": ends[0], "first_fail_latency_s": ends[1],
                "rates_tried": len(rates), "bisect_cells": bisected,
                "how": how,
            }
        )  # fmt: skip
    return out


def _end_latencies(verdict: Verdict | None, rates: Mapping[float, list[dict]]) -> tuple:
    """Normalized latency at the bracket's last pass and first fail (None: no such rate, or its
    cells failed), so a reader sees how close to the bound each end fell: a pass 0.2 % under it
    is a verdict the next seed may reverse, one 20 % under is not (docs/SWEEPS.md)."""
    if verdict is None:
        return None, None
    ends = (verdict.last_pass, verdict.first_fail)
    return tuple(None if rate is None else _latency(rates[rate]) for rate in ends)


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
    rows = [state.rows[_baseline(cell, engine).id] for engine in plan.axes.engines]
    ok = [row for row in rows if row["status"] == "ok"]
    if not ok:
        return None, unloaded, f"every baseline of {cell.trace} failed"
    threshold, source = shared_bound(ok, plan.sustained.multiple)
    return threshold, unloaded, source


def shared_bound(baselines: Sequence[Mapping], multiple: float) -> tuple[float, str]:
    """(bound, where it came from): `multiple` x the lowest normalized latency among the compared
    engines' finished unloaded baselines (sweep.csv rows: engine, normalized_latency_s,
    peak_batched_requests), the one bound every engine of the comparison is judged against."""
    row = min(baselines, key=lambda row: row["normalized_latency_s"])
    lowest = row["normalized_latency_s"]
    source = (
        f"{multiple:g} x {lowest:.4g} s/token, the lowest unloaded latency of "
        f"{len(baselines)} engines ({row['engine']}), shared by all"
    )
    if row["peak_batched_requests"] > 1:
        peak = row["peak_batched_requests"]
        source += f"; its requests overlapped (peak batch {peak}): lower --baseline-rate"
    return multiple * lowest, source


def _baseline(cell: Cell, engine: str) -> Cell:
    return Cell(BASELINE, engine, cell.trace, None, cell.block_size, cell.kv_cache_gib, cell.seed)


def _bisect(plan: SweepPlan, state: Cells, first: Cell, rates: dict, threshold: float | None):
    """Refine the verdict by bisection: `bisect` rounds, or until the bracket is `bracket` wide
    (each midpoint run for every repeat); with `extend`, first step past the grid's end until
    one rate passes and one fails."""
    options, repeats = plan.sustained, plan.axes.repeats
    if threshold is None:
        return None, 0

    def verdict() -> Verdict:
        return sustained_rate([(rate, _latency(rows)) for rate, rows in rates.items()], threshold)

    def wanted(current: Verdict) -> bool:
        if not current.bracket or done >= options.max_rounds:
            return False
        return options.bracket is None or bracket_width(current.bracket) > options.bracket

    current, done, steps = verdict(), 0, 0
    while True:
        rate = step_outside(current, sorted(rates), options.bracket) if steps < options.extend else None
        if rate is not None:
            steps += 1
        elif wanted(current):
            rate = bisect_rate(current.bracket)
            done += 1
        else:
            break
        cells = [
            Cell(BISECT, first.engine, first.trace, rate, first.block_size, first.kv_cache_gib, first.seed, r)
            for r in range(repeats)
        ]
        state.plan_cells(cells)
        rates[rate] = [state.run(cell) for cell in cells]
        current = verdict()
    if done or steps:
        how = f"{current.how} ({', '.join(_rounds(steps, done))})"
        current = Verdict(current.last_pass, current.first_fail, how)
    return current, (done + steps) * repeats


def _rounds(steps: int, done: int) -> list[str]:
    said = ((steps, f"stepped outside the grid {steps}x"), (done, f"bisected {done}x"))
    return [text for n, text in said if n]


def step_outside(current: Verdict, swept: list[float], bracket: float | None) -> float | None:
    """The next rate past the grid's end, or None where a pass and a fail already bracket it.

    Every rate passed: one step up from the highest; the lowest failed: one step down from it.
    A step is just under `bracket` wide (rounded to 4 significant digits, which moves a rate by
    at most 0.05 %), so the first result on the far side closes a narrow enough bracket.
    """
    if bracket is None or not swept:
        return None
    factor = 1 + 0.95 * bracket
    if current.first_fail is None and current.last_pass is not None:
        return float(f"{swept[-1] * factor:.4g}")
    if current.last_pass is None and current.first_fail == swept[0]:
        return float(f"{swept[0] / factor:.4g}")
    return None
