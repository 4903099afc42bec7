"""benchmarks/step_profile.py's torch.profiler window: only the steps of the kind asked for.

Why: a short prefill's time beside a decode step's is what the Alpaca panel turns on at
OPT-13B, and a profile of a whole run mixes both kinds (and outlasts a device call)."""

from __future__ import annotations

from benchmarks.step_profile import torch_report
from kvbench.config import RunConfig
from workloads.spec import WorkloadSpec


def config() -> RunConfig:
    # six requests arriving together: prefill steps and decode steps both occur
    workload = WorkloadSpec("uniform:prompt=8..16,output=3..6", num_requests=6, rate=1e4, seed=1)
    return RunConfig(
        "paged",
        model="tiny-opt",
        workload=workload,
        kv_cache_gib=0.01,
        block_size=4,
        attention="torch",
        max_num_seqs=2,
    )


def calls(report: str, op: str) -> int:
    """The "# of Calls" column (the table's last) of `op`'s row."""
    (row,) = [line for line in report.splitlines() if line.split()[:1] == [op]]
    return int(row.split()[-1])


def test_only_the_asked_kinds_steps_are_profiled():
    """Two prefill steps, after one: OPT embeds tokens and positions once per forward, so the
    profile holds exactly 2 x 2 embedding lookups (a step of another kind inside the window, or
    the run around it, would add its own). A decode call runs a segment of one or more steps:
    two of them hold at least two forwards, and fewer than the whole run's."""
    prefill = torch_report(config(), top=100, steps=2, skip=1, kind="prefill")
    assert prefill.startswith("--- by self host time ---")
    assert calls(prefill, "aten::embedding") == 4
    whole = calls(torch_report(config(), top=100), "aten::embedding")
    decode = calls(torch_report(config(), top=100, steps=2, skip=1, kind="decode"), "aten::embedding")
    assert decode % 2 == 0 and 4 <= decode < whole - 4, (decode, whole)


def test_a_window_past_the_runs_steps_profiles_nothing_and_says_so():
    report = torch_report(config(), top=10, steps=3, skip=500, kind="prefill")
    assert report.startswith("the run had ")
    assert "prefill steps, fewer than 500 + 3: nothing profiled" in report


def test_each_prefill_steps_wall_time_splits_at_the_forward_passs_return():
    """One host timeline per step row, in order: a prefill's forward pass returns inside its
    call; the table puts the steps in quarters by wall time, fastest first, each quarter's
    launch time within its wall time."""
    from dataclasses import replace

    from benchmarks.step_profile import host_table, timed_run

    run_config = replace(config(), workload=replace(config().workload, num_requests=10))
    result, calls = timed_run(run_config)
    steps = result.run.steps
    assert calls.shape == (len(steps), 3)
    prefill = [i for i, step in enumerate(steps) if step.kind == "prefill"]
    assert len(prefill) >= 4
    start, launched, end = calls[prefill].T
    assert (start < launched).all() and (launched <= end).all()
    assert (calls[1:, 0] >= calls[:-1, 2]).all()  # calls in step order, none overlapping
    header, columns, *quarters = host_table(result, calls, "prefill")
    assert header.startswith("prefill calls by wall time")
    assert columns.split()[:4] == ["quarter", "calls", "wall", "ms"]
    assert [line.split()[0] for line in quarters] == ["Q1", "Q2", "Q3", "Q4"]
    assert sum(int(line.split()[1]) for line in quarters) == len(prefill)
    walls = [float(line.split()[2]) for line in quarters]
    launches = [float(line.split()[3]) for line in quarters]
    assert walls == sorted(walls) and all(0 < a <= w for a, w in zip(launches, walls, strict=True))
    assert host_table(result, calls[:-1], "prefill") == []  # a timeline that lost a row: no table
