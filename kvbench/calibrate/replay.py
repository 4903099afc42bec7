"""A run's own step durations replayed through the simulator: does it schedule as the run did?

A held-out error (`kvbench.calibrate.check`) can come from two places: the step times the cost
model prices, or the schedule the simulator builds from them (which arrivals a step admits, how
many prompts a prefill batches, what a reservation holds back, where a segment is cut). Real and
simulated runs share the engine loop, the allocators and the schedulers, so the schedule should
be a function of the step durations alone. `replay` tests that on a run folder: a runner that
hands back, row by row, the durations the run recorded in steps.csv drives the run's engine over
its config's trace. Each batch the engine schedules is compared with the recorded row (prefill
or decode, batch size, start time, no more steps than the engine allows); the first that differs
is the divergence, named by its row. A replay that never diverges rebuilds the run's rows and
its summary, so every difference between the run and its simulation is the cost model's.

On the H200's OPT-13B runs (results/reference/calibration-opt13b/orca-queueing.md) all 76 real
runs of Figures 2, 12 and 13 replay without divergence, their summaries to six digits: the
calibrated simulator's queueing errors there are errors in step times, not in scheduling.

A vmm run that mapped ahead (`--vmm-map ahead`) is replayed with its allocator reserving the
same pages after each decode row (`VirtualAllocator.look_ahead`), as the run's runner did:
reserved pages hold admissions back, so a replay without them would schedule another run.

A decode row of k steps recorded only its total; the replay spreads it evenly over the k steps.
Finishes and admissions fall on row boundaries, so requests' times are the recorded ones; only
steps.csv's `num_waiting` (arrivals during a segment) may differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from engines.scheduler import Batch
from kvbench.calibrate.check import read_config
from kvbench.errors import KvbenchError
from kvbench.results.files import read_json
from kvbench.results.packed import table_path
from kvbench.runner import StepResult
from kvbench.simulate import execute

START_TOLERANCE = 1e-9  # relative: a row's start summed from spread steps may differ in the last bits


@dataclass(frozen=True)
class Row:
    """What the engine loop decides for one steps.csv row, and what it took."""

    kind: str  # "prefill" | "decode" | "mixed"
    batch_size: int
    num_steps: int
    start_s: float
    duration_s: float

    def describe(self) -> str:
        return f"{self.kind} of {self.batch_size} for {self.num_steps} step(s) at {self.start_s:.6f} s"


@dataclass(frozen=True)
class Divergence:
    row: int  # the steps.csv row (0-based) where the replay's schedule left the recorded one
    recorded: str  # that row as recorded; "none" past the last one
    scheduled: str  # what the engine scheduled there instead; "none" when it stopped earlier


@dataclass(frozen=True)
class Replay:
    run: str
    rows: int  # rows the replay ran (all of them when it did not diverge)
    divergence: Divergence | None
    summary: dict  # the replayed run's summary (up to the divergence, a run of other step times)


class _Diverged(Exception):
    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.row)
        self.divergence = divergence


class RecordedSteps:
    """A `Runner` returning recorded rows' durations in order; raises `_Diverged` at the first
    batch that is not the next recorded row's."""

    allocates_ahead = False

    def __init__(self, rows: list[Row], lookahead=None) -> None:
        self.rows = rows
        self.next = 0
        self.lookahead = lookahead  # a vmm allocator that maps ahead, as the run's did (None: none)
        if lookahead is not None:
            self.allocates_ahead = True  # reservations go on top of a segment's growth

    def run(self, batch: Batch, max_steps: int, start_s: float, until_s: float) -> StepResult:
        kind = batch.kind
        scheduled = Row(kind, len(batch.seqs), max_steps, start_s, math.nan)
        if self.next >= len(self.rows):
            raise _Diverged(Divergence(self.next, "none", f"{scheduled.describe()} (at most)"))
        row = self.rows[self.next]
        same = (
            row.kind == kind and row.batch_size == len(batch.seqs) and row.num_steps <= max_steps
            and math.isclose(row.start_s, start_s, rel_tol=START_TOLERANCE, abs_tol=START_TOLERANCE)
        )  # fmt: skip
        if not same:
            raise _Diverged(Divergence(self.next, row.describe(), f"{scheduled.describe()} (at most)"))
        self.next += 1
        k = row.num_steps
        durations = np.full(k, row.duration_s / k)  # (k,) the row's total, spread evenly
        durations[-1] = row.duration_s - float(durations[:-1].sum())
        if self.lookahead is not None and not batch.is_prefill:
            self.lookahead.look_ahead(batch.seqs, k)
        return StepResult(durations)


def recorded_rows(run: Path) -> list[Row]:
    """A run folder's steps.csv as `Row`s."""
    from kvbench.results.load import read_csv  # pandas: only where a run's tables are read
    from kvbench.results.shape import STEP_TEXT

    steps = run / "steps.csv"
    if table_path(steps) is None:
        raise KvbenchError(f"{run}: no steps.csv to replay")
    table = read_csv(steps, text=STEP_TEXT)
    columns = zip(
        table["kind"].astype(str), table["batch_size"].astype(int), table["num_steps"].astype(int),
        table["start_s"].astype(float), table["duration_s"].astype(float), strict=True,
    )  # fmt: skip
    return [Row(kind, int(b), int(k), float(s), float(d)) for kind, b, k, s, d in columns]


def replay(run: Path) -> Replay:
    """Drive `run`'s config through its engine with the step durations `run` recorded."""
    run = Path(run)
    rows = recorded_rows(run)
    config = replace(read_config(run), device="cpu")  # the simulator's loop: no device is touched
    ahead = config.engine == "vmm" and config.vmm_map == "ahead"
    runners: list[RecordedSteps] = []

    def make_runner(scheduler) -> RecordedSteps:
        runners.append(RecordedSteps(rows, scheduler.allocator if ahead else None))
        return runners[0]

    try:
        result = execute(config, make_runner, mode="replayed", coalesce=True)
    except _Diverged as stop:
        return Replay(str(run), stop.divergence.row, stop.divergence, {})
    runner = runners[0]
    if runner.next < len(rows):  # the engine finished before the recorded rows ran out
        return Replay(str(run), runner.next, Divergence(runner.next, rows[runner.next].describe(), "none"),
                      result.summary)  # fmt: skip
    return Replay(str(run), runner.next, None, result.summary)


METRICS = ("output_token_throughput", "normalized_latency_s", "mean_ttft_s")


def describe(done: Replay) -> str:
    """One line: rows replayed, the divergence if any, and the run's metrics beside the replay's."""
    if done.divergence is not None:
        d = done.divergence
        return f"{done.run}: diverged at row {d.row}: recorded {d.recorded}, scheduled {d.scheduled}"
    recorded = read_json(Path(done.run) / "summary.json")
    pairs = ", ".join(f"{m} {recorded[m]:.6g} -> {done.summary[m]:.6g}" for m in METRICS if m in recorded)
    return f"{done.run}: {done.rows} rows replayed, no divergence; {pairs}"


if __name__ == "__main__":  # python -m kvbench.calibrate.replay RUN...
    import sys

    for path in sys.argv[1:]:
        print(describe(replay(Path(path))))
