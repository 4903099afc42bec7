"""A sweep with a deadline (`--deadline-s`) starts no cell it expects to end past it, stops with
its folder ready for `--resume`, and a resumed sweep ends with exactly the cells of one that never
stopped. Deadlines here lie far in the past or the future, so no test depends on how fast the
machine runs a cell."""

from __future__ import annotations

import math

import pytest

from kvbench.sweep.deadline import DEADLINE_EXIT, MARGIN, Deadline, DeadlineReached, expected_s
from kvbench.sweep.plan import SustainedOptions
from kvbench.sweep.run import run_sweep
from tests.test_cli import kvbench
from tests.test_sweep import plan, quiet, rows_of

PAST = -1e6  # seconds from now: every timed cell would end past it
FUTURE = 1e6


def test_the_next_cell_is_expected_to_last_the_longest_of_its_kind_with_a_margin():
    assert expected_s([3.0, None, 7.5, math.nan, 1.0]) == pytest.approx(MARGIN * 7.5)
    assert expected_s([]) is None and expected_s([None, math.nan]) is None  # nothing timed: no estimate
    Deadline.in_seconds(FUTURE).check("c", 10.0)  # fits
    Deadline.in_seconds(FUTURE).check("c", None)  # no estimate: starts
    Deadline.in_seconds(PAST).check("c", None)  # even past the deadline
    with pytest.raises(
        DeadlineReached, match=r"^c not started: it is expected to take 2000000.0 s and [\d.]+ s"
    ):
        Deadline.in_seconds(FUTURE).check("c", 2 * FUTURE)
    with pytest.raises(
        DeadlineReached, match=r"and 0.0 s are left before --deadline-s; --resume goes on from it$"
    ):
        Deadline.in_seconds(PAST).check("c", 0.5)


def test_a_sweep_past_its_deadline_runs_one_cell_of_each_kind_then_resumes_to_the_same_cells(tmp_path):
    """Baselines (unloaded, short) are timed apart from loaded cells: the first of each kind has
    nothing to be judged by and starts; the next of a kind does not, the deadline having passed."""
    p = plan(engines=("paged", "orca-oracle"), rates=(1.0, 3.0), sustained=SustainedOptions(multiple=4.0))
    out, whole = tmp_path / "stopped", tmp_path / "whole"
    with pytest.raises(DeadlineReached, match=r"^orca-oracle__.*rate-unloaded.* not started"):
        run_sweep(p, out, progress=quiet(), deadline=Deadline.in_seconds(PAST))
    statuses = {row["cell_id"]: row["status"] for row in rows_of(out / "sweep.csv")}
    assert [cell for cell, status in statuses.items() if status == "ok"] == [
        "paged__trace-sharegpt-paper__rate-unloaded__bs-16__kv-4__seed-0__rep-0"
    ]
    assert len(statuses) == 6 and sorted(p.name for p in (out / "cells").iterdir()) == [next(iter(statuses))]
    assert not (out / "sustained.csv").exists()

    # resumed under a past deadline: baselines are timed now (the finished one), so it stops at
    # once, before the next baseline, having run nothing
    with pytest.raises(DeadlineReached, match=r"^orca-oracle__.*rate-unloaded"):
        run_sweep(p, out, resume=True, progress=quiet(), deadline=Deadline.in_seconds(PAST))
    resumed = run_sweep(p, out, resume=True, progress=quiet(), deadline=Deadline.in_seconds(FUTURE))
    assert (resumed.ran, resumed.resumed, resumed.failed) == (5, 1, 0)
    run_sweep(p, whole, progress=quiet())

    def cells(folder):
        keep = ("cell_id", "status", "rate", "normalized_latency_s", "num_preemptions", "makespan_s")
        return [{k: row[k] for k in keep} for row in rows_of(folder / "sweep.csv")]

    assert cells(out) == cells(whole)
    assert (out / "sustained.csv").read_text() == (whole / "sustained.csv").read_text()


def test_the_cli_stops_at_its_deadline_with_exit_75_and_refuses_a_deadline_that_is_not_positive(tmp_path):
    out = tmp_path / "s"
    args = [
        "sweep", "--engines", "paged,orca-oracle", "--rates", "1,3", "--num-requests", "30",
        "--kv-cache-gib", "4", "--max-total-len", "1000", "--out", str(out),
    ]  # fmt: skip
    proc = kvbench(*args, "--deadline-s", "0.001")
    assert proc.returncode == DEADLINE_EXIT, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("stopped: orca-oracle__") and last.endswith("--resume goes on from it")
    assert "Traceback" not in proc.stderr
    proc = kvbench(*args, "--resume", "--deadline-s", "1000000")
    assert proc.returncode == 0, proc.stderr
    assert "6 cells (5 run, 1 resumed, 0 failed)" in proc.stdout
    bad = kvbench(*args, "--resume", "--deadline-s", "0")
    assert bad.returncode == 2 and "--deadline-s" in bad.stderr and "Traceback" not in bad.stderr


def test_a_later_sweep_under_the_same_deadline_is_judged_by_the_cells_of_the_earlier_ones(tmp_path):
    """A reproduction's sweeps (seeds, preemption modes) share one deadline: the first cell of a
    new sweep is expected to last as long as the longest of its kind timed before, so it is not
    started with too little time left (a blind start would be killed with the call)."""
    deadline = Deadline.in_seconds(FUTURE)
    run_sweep(plan(engines=("paged",), rates=(1.0,)), tmp_path / "first", progress=quiet(), deadline=deadline)
    assert set(deadline.timed) == {(False, "paged")} and deadline.timed[False, "paged"] > 0  # loaded, timed
    later = Deadline(deadline.at - 2 * FUTURE, deadline.timed)  # the same record, the time spent
    with pytest.raises(DeadlineReached, match=r"^paged__.*rate-2.* not started"):
        run_sweep(
            plan(engines=("paged",), rates=(2.0,)), tmp_path / "second", progress=quiet(), deadline=later
        )
    assert not (tmp_path / "second" / "cells").exists() or not any((tmp_path / "second" / "cells").iterdir())
    assert later.expected_s(False, "paged") == pytest.approx(MARGIN * deadline.timed[False, "paged"])
    later.check(
        "a baseline", later.expected_s(True, "paged")
    )  # a kind never timed still starts its first cell


def test_each_engine_is_judged_by_its_own_cells_and_an_untimed_one_by_the_longest_of_any():
    """Engines of one sweep last very differently (Figure 13's Alpaca cells at OPT-13B: paged
    22-30 s, static 190-196 s): a paged cell judged by static's time would not start with two
    minutes left, a third of a call unused. An engine with no cell of its own timed yet is judged
    by the longest cell of its kind of any engine: too long errs safe, too short loses a cell."""
    deadline = Deadline.in_seconds(FUTURE)
    deadline.note(False, "static", 196.0)
    deadline.note(False, "paged", 30.0)
    deadline.note(False, "paged", 22.0)
    deadline.note(False, "paged", math.nan)  # a failed cell's time judges nothing
    deadline.note(True, "static", 2.0)
    assert deadline.expected_s(False, "paged") == pytest.approx(MARGIN * 30.0)
    assert deadline.expected_s(False, "static") == pytest.approx(MARGIN * 196.0)
    assert deadline.expected_s(False, "orca-max") == pytest.approx(MARGIN * 196.0)  # untimed: any engine's
    assert deadline.expected_s(True, "paged") == pytest.approx(MARGIN * 2.0)  # baselines apart
    left = Deadline(deadline.at - FUTURE + 100.0, deadline.timed)  # 100 s left
    left.check("paged", left.expected_s(False, "paged"))  # 33 s expected: starts
    with pytest.raises(DeadlineReached, match=r"^orca-max not started: it is expected to take 215.6 s"):
        left.check("orca-max", left.expected_s(False, "orca-max"))


def test_a_sweep_judges_each_cell_it_hands_out_by_that_cells_own_engine(tmp_path):
    """The sweep asks the deadline about the engine of the cell it is about to start: with paged
    timed short and another engine timed past the time left, paged's cells start (judged by the
    slow engine's time, none would) and the slow engine's first cell does not."""
    deadline = Deadline.in_seconds(FUTURE)
    deadline.note(False, "orca-oracle", 2 * FUTURE)  # far past the time left
    deadline.note(False, "paged", 1.0)
    done = run_sweep(plan(engines=("paged",), rates=(1.0, 2.0)), tmp_path / "paged", progress=quiet(),
                     deadline=deadline)  # fmt: skip
    assert (done.ran, done.failed) == (2, 0)
    with pytest.raises(DeadlineReached, match=r"^orca-oracle__.* not started"):
        run_sweep(plan(engines=("orca-oracle",), rates=(1.0,)), tmp_path / "oracle", progress=quiet(),
                  deadline=deadline)  # fmt: skip


def test_a_sweep_cut_before_its_bisection_keeps_the_rows_of_bisected_cells_for_the_next_resume(tmp_path):
    """Seed 0 swept and bisected once (0.5 passes 0.03 s/token, 8 fails: 4.25 run); seed 1 added
    and the sweep resumed past its deadline, so it stops in seed 1's grid, before any bisection:
    its sweep.csv still lists seed 0's bisected cell, with the wall time it was run in. Resumed
    again to the end, that cell's row keeps its wall time (the sweep reads it from the last
    sweep.csv, the cell folder holds none) and the sweep ends as one run whole."""
    from kvbench.config import RunConfig
    from kvbench.sweep.grid import Axes
    from kvbench.sweep.plan import SweepPlan
    from workloads.spec import WorkloadSpec

    def seeds(*values):
        axes = Axes(("paged",), ("sharegpt-paper",), (0.5, 8.0), (16,), (4.0,), values, 1)
        base = RunConfig("paged", workload=WorkloadSpec(num_requests=40, max_total_len=1000))
        return SweepPlan(axes, base, sustained=SustainedOptions(threshold_s=0.03, bisect=1))

    out = tmp_path / "s"
    run_sweep(seeds(0), out, progress=quiet())
    first = {row["cell_id"]: row for row in rows_of(out / "sweep.csv")}
    (bisected,) = [cell for cell, row in first.items() if row["role"] == "bisect"]
    assert "rate-4.25" in bisected and float(first[bisected]["wall_s"]) > 0
    with pytest.raises(DeadlineReached, match=r"seed-1.* not started"):
        run_sweep(seeds(0, 1), out, resume=True, progress=quiet(), deadline=Deadline.in_seconds(PAST))
    cut = {row["cell_id"]: row for row in rows_of(out / "sweep.csv")}
    assert cut[bisected]["wall_s"] == first[bisected]["wall_s"] and cut[bisected]["status"] == "ok"
    done = run_sweep(seeds(0, 1), out, resume=True, progress=quiet())
    end = {row["cell_id"]: row for row in rows_of(out / "sweep.csv")}
    assert end[bisected]["wall_s"] == first[bisected]["wall_s"]
    whole = run_sweep(seeds(0, 1), tmp_path / "whole", progress=quiet())
    assert sorted(end) == sorted(row["cell_id"] for row in whole.rows) and done.failed == 0
