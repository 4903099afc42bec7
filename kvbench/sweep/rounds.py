"""Bisection in rounds: every group's next midpoint run as one batch.

The sustained-rate search (`kvbench.sweep.sustained`) is written as one loop per group
(engine x setup): pick the midpoint of the bracket, run its cells, re-read the verdict,
repeat. Run as written, that is one cell at a time, while the groups are independent: a
cluster (or several local GPUs) could run every group's next midpoint at once.

So before the real pass the sweep runs the search against `_Lookahead`, a stand-in for the
sweep's state that answers a cell finished in this invocation with its row and any other with
a pending row (which the search reads as failed), noting the cell. The first cells a group
asks for are exactly its next midpoint (all its repeats): their rate follows from finished
cells only. What the group asks for after that rests on the stand-in's made-up answers and is
ignored. The sweep runs that batch and asks again until no group wants a cell; the real pass
then finds every cell it asks for finished and only assembles sustained.csv. The search stays
in one place, and a round costs one pass of its arithmetic, nothing against a cell. sweep.csv
ends as a cell-by-cell search would write it: each group's bisection rows together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kvbench.sweep.grid import BISECT, Cell
from kvbench.sweep.progress import Progress
from kvbench.sweep.sustained import sustained_table

if TYPE_CHECKING:
    from kvbench.sweep.plan import SweepPlan


class Batches(Protocol):
    """What the rounds need from the running sweep."""

    rows: dict[str, dict]  # sweep.csv rows by cell id
    finished: set[str]  # ids whose row is final in this invocation (run, found done, or failed)
    progress: Progress

    def plan_cells(self, cells: list[Cell]) -> None: ...

    def run(self, cell: Cell) -> dict: ...

    def run_batch(self, cells: list[Cell]) -> None: ...

    def write(self) -> None: ...


class _Lookahead:
    """The sweep's state as the search sees it, answering unfinished cells with 'pending'."""

    def __init__(self, state: Batches) -> None:
        self.rows, self.finished = state.rows, state.finished
        self.wanted: dict[tuple, list[Cell]] = {}  # group -> the cells of its next midpoint

    def plan_cells(self, cells: list[Cell]) -> None:
        pass

    def run(self, cell: Cell) -> dict:
        if cell.id in self.finished:
            return self.rows[cell.id]
        first = self.wanted.setdefault(cell.group, [cell])
        if first[0].rate == cell.rate and cell not in first:
            first.append(cell)  # another repeat of the same midpoint
        return {"status": "pending"}


def sustained_in_rounds(plan: SweepPlan, state: Batches, grid: list[Cell]) -> list[dict]:
    """Run the bisection round by round, each round one batch; then the rows of sustained.csv.

    The progress bar's total counted `bisect` rounds per group up front (`upfront_cells`): a
    batch beyond them grows the total, and what is left of them at the end counts as skipped,
    so the bar never passes its total, however many rounds a target bracket or steps take.
    """
    counted = upfront_cells(plan, grid)
    while True:
        lookahead = _Lookahead(state)
        sustained_table(plan, lookahead, grid)
        batch = [cell for cells in lookahead.wanted.values() for cell in cells]
        if not batch:
            break
        state.progress.plan(max(0, len(batch) - counted))
        counted = max(0, counted - len(batch))
        state.plan_cells(batch)
        state.run_batch(batch)
    state.progress.plan(-counted)
    table = sustained_table(plan, state, grid)
    _group_bisection_rows(state, grid)
    return table


def upfront_cells(plan: SweepPlan, grid: list[Cell]) -> int:
    """The bisection cells a sweep's progress total counts before any ran: `bisect` rounds of
    every group's repeats (a target bracket or steps past the grid may take more, or fewer)."""
    if not plan.axes.swept_rates:
        return 0
    return len({cell.group for cell in grid}) * plan.sustained.bisect * plan.axes.repeats


def _group_bisection_rows(state: Batches, grid: list[Cell]) -> None:
    """Rows planned round by round, reordered group by group (a stable sort keeps the rest)."""
    groups = {group: i for i, group in enumerate(dict.fromkeys(cell.group for cell in grid))}

    def key(item: tuple[str, dict]) -> tuple[bool, int]:
        row = item[1]
        if row["role"] != BISECT:
            return False, 0
        return True, groups[tuple(row[k] for k in ("engine", "trace", "block_size", "kv_cache_gib", "seed"))]

    rows = sorted(state.rows.items(), key=key)
    state.rows.clear()
    state.rows.update(rows)
    state.write()
