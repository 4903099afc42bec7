"""`kvbench sweep`: a grid of runs, resumable cell by cell, and each engine's sustained rate.

    <out>/sweep.json      the grid, the base settings, the command
    <out>/cells/<id>/     one run's folder (config.json, env.json, steps.csv, requests.csv,
                          summary.json), written atomically by `write_result`
    <out>/sweep.csv       one row per cell, rewritten atomically after every cell
    <out>/sustained.csv   per engine and setup: the sustained rate and how it was found

The phases: the unloaded baseline cells (when the latency threshold is not given) and the
grid, one batch, then bisection between each engine's last passing and first failing rate, one
batch per round (`kvbench.sweep.rounds`). An executor (`kvbench.sweep.executor`: this machine,
or `kvbench.sweep.ray_executor`: a Ray cluster) runs each batch and hands cells back as they finish; this
process alone writes sweep.csv. A cell whose folder holds an intact summary.json is finished;
`--resume` skips it (after checking it ran the same settings), so a sweep killed at any point
loses at most the cells it was running. See docs/SWEEPS.md.
"""

from __future__ import annotations

import shutil
import sys
from contextlib import closing
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.results.files import read_json
from kvbench.results.outputs import prepare_out
from kvbench.results.ownership import is_temp, remove_owned
from kvbench.results.shape import check_summary
from kvbench.sweep.cell import Outcome, config_differences
from kvbench.sweep.deadline import Deadline
from kvbench.sweep.executor import CellJob, Executor, LocalExecutor
from kvbench.sweep.files import (
    CELL_COLUMNS,
    CI_METRICS,
    SUSTAINED_COLUMNS,
    add_confidence_intervals,
    cell_row,
    metric_columns,
    read_table,
    write_json_atomically,
    write_table,
)
from kvbench.sweep.grid import (
    BASELINE,
    REPEAT_SEED_STRIDE,
    Cell,
    grid_cells,
)
from kvbench.sweep.plan import SweepPlan
from kvbench.sweep.progress import Progress
from kvbench.sweep.rounds import sustained_in_rounds, upfront_cells
from kvbench.sweep.saved import resume_difference

OUR_FILES = ("cells", "sweep.csv", "sweep.json", "sustained.csv")


@dataclass(frozen=True)
class SweepResult:
    rows: list[dict]  # sweep.csv
    sustained: list[dict]  # sustained.csv ([] when no rate was swept)
    ran: int
    resumed: int
    failed: int


class _Sweep:
    """One invocation's state: the rows so far, by cell id, in the order cells were planned."""

    def __init__(
        self,
        plan: SweepPlan,
        out: Path,
        resume: bool,
        progress: Progress,
        executor: Executor,
        deadline: Deadline | None = None,
    ):
        self.plan, self.out, self.resume, self.progress = plan, out, resume, progress
        self.executor, self.deadline = executor, deadline
        self.rows: dict[str, dict] = {}
        self.finished: set[str] = set()  # cells whose row is final in this invocation
        self.previous = read_table(out / "sweep.csv")  # wall times of resumed cells
        self.columns = [*CELL_COLUMNS, *metric_columns(plan.base)]
        if plan.axes.repeats > 1:
            self.columns += [f"{m}_{stat}" for m in CI_METRICS for stat in ("mean", "ci95")]
        self.ran = self.resumed = self.failed = 0

    def plan_cells(self, cells: list[Cell]) -> None:
        for cell in cells:
            self.rows.setdefault(cell.id, cell_row(cell, self.plan.config(cell), "pending", None, "", None))

    def run(self, cell: Cell) -> dict:
        """`cell`'s row, running it first unless it is finished."""
        self.run_batch([cell])
        return self.rows[cell.id]

    def run_batch(self, cells: list[Cell]) -> None:
        """Run the cells not finished yet, all handed to the executor at once; record each as it ends."""
        by_id, jobs = {cell.id: cell for cell in cells}, []
        for cell in cells:
            if cell.id in self.finished:
                continue
            config, folder = self.plan.config(cell), self.out / "cells" / cell.id
            summary, damage = read_finished(folder) if self.resume else (None, "")
            if damage:  # its own files go first: a cell run in a process of its own (--isolate)
                # writes into a folder holding no older run, as a new cell does
                print(f"sweep: running {cell.id} again: {damage}", file=sys.stderr)
                remove_owned(folder)
            if summary is not None:
                self._found(cell, config, folder, summary)
            else:
                jobs.append(CellJob(cell.id, config, folder, self.plan.run))
        if not jobs:
            return
        # closed at once when a failed cell stops the sweep: the executor hands out nothing more
        with closing(self.executor.run(jobs, self._started)) as outcomes:
            for job, outcome in outcomes:
                self._ran(by_id[job.cell_id], job.config, outcome)

    def _started(self, job: CellJob) -> None:
        """A cell is about to start: first, where the sweep has a deadline, check the cell is
        expected to end before it (raises `DeadlineReached`, and nothing more is handed out)."""
        if self.deadline is not None:
            row = self.rows[job.cell_id]
            baseline = row["role"] == BASELINE  # timed apart from loaded cells
            self.deadline.check(job.cell_id, self.deadline.expected_s(baseline, row["engine"]))
        self.progress.begin(job.cell_id)

    def _found(self, cell: Cell, config: RunConfig, folder: Path, summary: dict) -> None:
        """A cell a previous invocation finished (after checking it ran these settings)."""
        _check_same_settings(config, folder)
        self.progress.begin(cell.id)
        wall = self.previous.get(cell.id, {}).get("wall_s") or None
        self.resumed += 1
        self.progress.finish(True, None)
        self._record(cell, cell_row(cell, config, "ok", summary, "", float(wall) if wall else None))

    def _ran(self, cell: Cell, config: RunConfig, outcome: Outcome) -> None:
        status = "ok" if outcome.ok else "failed"
        self.ran += 1
        self.failed += not outcome.ok
        self.progress.finish(outcome.ok, outcome.wall_s)
        wall = round(outcome.wall_s, 3)
        self._record(cell, cell_row(cell, config, status, outcome.summary, outcome.error, wall))

    def _record(self, cell: Cell, row: dict) -> None:
        self.rows[cell.id] = row
        if self.deadline is not None and row["status"] == "ok":
            self.deadline.note(row["role"] == BASELINE, row["engine"], row["wall_s"])
        self.finished.add(cell.id)
        self.write()
        if row["status"] == "failed" and not self.plan.continue_on_error:
            raise KvbenchError(
                f"cell {cell.id} failed: {row['error']} (--continue-on-error records failed cells and "
                "goes on; --resume retries them)"
            )

    def write(self, final: bool = False) -> None:
        """sweep.csv as far as the sweep got. Until the `final` write, the rows of the previous
        sweep.csv that this invocation has not planned yet (cells a bisection ran, planned
        again only when the search reaches them) stay in it as they were: a sweep stopped before
        its search would otherwise write them out, and the next resume would find their cells
        without the wall time they ran in."""
        rows = list(self.rows.values())
        if self.plan.axes.repeats > 1:
            add_confidence_intervals(rows)
        if not final:
            rows += [row for cell_id, row in self.previous.items() if cell_id not in self.rows]
        write_table(self.out / "sweep.csv", rows, self.columns)


class OtherSettings(KvbenchError):
    """A resumed folder's cell ran other settings than the plan's."""

    def __init__(self, folder: Path, differs: list[str]) -> None:
        self.folder, self.settings = folder, f"other settings ({', '.join(differs)})"
        super().__init__(f"--resume: {folder} ran {self.settings}; use another --out, or --overwrite")


def _check_same_settings(config: RunConfig, folder: Path) -> None:
    differs = config_differences(config, folder)
    if differs:
        raise OtherSettings(folder, differs)


# what a resumed sweep reads of a finished cell beyond its settings: the latency its search and
# bounds judge, and the throughput its capacity is; a summary lacking a key kvbench added later is
# an older cell, still finished (a resume must not rerun hours of GPU cells for a new column)
RESUMED_KEYS = ("normalized_latency_s", "request_throughput")


def read_finished(folder: Path) -> tuple[dict | None, str]:
    """(summary.json, "") of a cell a previous invocation finished; (None, "") where the cell
    has no summary.json; (None, what is wrong) where its summary.json or config.json is damaged
    (not JSON, not an object, a metric that is not a number, one of `RESUMED_KEYS` missing).

    A damaged cell counts as unfinished and runs again rather than stopping the resume: its
    folder is kvbench's own (<out>/cells/<id>, replaced whole when the cell ends), so running it
    again loses nothing the user wrote, where a refusal would leave them to delete it by hand.
    """
    path = folder / "summary.json"
    if not path.is_file():
        return None, ""
    try:
        summary = check_summary(path, read_json(path))
        lacking = [key for key in RESUMED_KEYS if key not in summary]
        if lacking:
            raise KvbenchError(f"{path}: no {lacking[0]!r}")
        read_json(folder / "config.json")
    except KvbenchError as damage:
        return None, str(damage)
    return summary, ""


def _check_resumable(plan: SweepPlan, out: Path, cells: list[Cell]) -> None:
    """Refuse a resume whose finished cells ran other settings, or whose sweep is not the one
    sweep.json saved (`kvbench.sweep.saved`: other values on an axis, another bound, ...),
    before anything is written: a refused resume leaves sweep.json and sweep.csv as they were."""
    for cell in cells:
        folder = out / "cells" / cell.id
        if read_finished(folder)[0] is not None:
            _check_same_settings(plan.config(cell), folder)
    difference = resume_difference(plan, out / "sweep.json")
    if difference is not None:
        raise OtherSettings(out, [difference])


def run_sweep(
    plan: SweepPlan,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    executor: Executor | None = None,
    deadline: Deadline | None = None,
) -> SweepResult:
    """Run every cell of `plan` into `out`; write sweep.csv, sweep.json and sustained.csv.

    `executor`: where the cells run (default: in order, in this process); the caller closes it.
    `deadline`: start no cell expected to end past it (`kvbench.sweep.deadline`): the sweep then
    raises `DeadlineReached`, its folder written as far as it got, for `resume` to go on.
    """
    out = Path(out)
    executor = executor or LocalExecutor()
    _prepare_folder(out, resume, overwrite)
    grid = grid_cells(plan.axes)
    baselines = _baseline_cells(plan, grid) if plan.needs_baseline else []
    if resume:
        _check_resumable(plan, out, baselines + grid)
    progress = progress or Progress(len(baselines) + len(grid) + upfront_cells(plan, grid))
    write_json_atomically(out / "sweep.json", _description(plan, len(baselines) + len(grid), executor))
    state = _Sweep(plan, out, resume, progress, executor, deadline)
    try:
        state.plan_cells(baselines + grid)
        state.write()
        state.run_batch(baselines + grid)
        sustained = sustained_in_rounds(plan, state, grid) if plan.axes.swept_rates else []
        state.write(final=True)
    finally:
        progress.close()
    if sustained:
        write_table(out / "sustained.csv", sustained, SUSTAINED_COLUMNS)
    return SweepResult(list(state.rows.values()), sustained, state.ran, state.resumed, state.failed)


def _prepare_folder(out: Path, resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise KvbenchError("--resume and --overwrite contradict each other: pick one")
    prepare_out(out, "sweep", overwrite)  # a folder kvbench did not write is never reused
    if out.exists() and not out.is_dir():
        raise KvbenchError(f"--out {out} is a file, not a folder")
    busy = out.is_dir() and any(out.iterdir())
    if busy and resume and not (out / "sweep.json").is_file():
        raise KvbenchError(f"--resume: {out} holds no sweep (no sweep.json)")
    if busy and not resume:
        if not overwrite:
            raise KvbenchError(
                f"--out {out} is not empty: --resume continues that sweep, --overwrite replaces it"
            )
        for name in OUR_FILES:  # kvbench's files only: what a user put among the cells stays
            remove_owned(out / name)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    # what a killed sweep leaves: a cell's or a table's temporary copy
    leftovers = [p for folder in (out, out / "cells") for p in folder.iterdir() if is_temp(p.name)]
    for stale in leftovers:
        shutil.rmtree(stale) if stale.is_dir() and not stale.is_symlink() else stale.unlink(missing_ok=True)


def _baseline_cells(plan: SweepPlan, grid: list[Cell]) -> list[Cell]:
    """One unloaded cell per engine and setup (the first repeat's seed)."""
    groups = dict.fromkeys(cell.group for cell in grid)
    return [Cell(BASELINE, e, trace, None, bs, kv, seed) for e, trace, bs, kv, seed in groups]


def _description(plan: SweepPlan, planned: int, executor: Executor) -> dict:
    from kvbench.version import __version__

    return {
        "command": sys.argv,
        "kvbench": __version__,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "real" if plan.run.real else "simulated",
        "axes": asdict(plan.axes),
        "repeat_seed_stride": REPEAT_SEED_STRIDE,
        "base_config": plan.base.to_dict(),
        "cell_run": asdict(plan.run),
        "sustained": asdict(plan.sustained),
        "continue_on_error": plan.continue_on_error,
        "duration_s": plan.duration_s,
        "executor": executor.describe(),
        "cells_planned": planned,
    }
