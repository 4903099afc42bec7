"""`kvbench sweep`: grid parsing, real simulated sweeps, sustained rates, resume, kills, failures."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.metrics.summary import parse_slo
from kvbench.sweep.cell import CellRun, command, config_differences, run_cell
from kvbench.sweep.grid import (
    BASELINE,
    GRID,
    Axes,
    Cell,
    cell_config,
    grid_cells,
    parse_block_sizes,
    parse_budgets,
    parse_engines,
    parse_rates,
    parse_seeds,
    trace_token,
)
from kvbench.sweep.plan import SustainedOptions, SweepPlan
from kvbench.sweep.progress import Progress
from kvbench.sweep.run import OtherSettings, run_sweep
from kvbench.sweep.stats import bisect_rate, bracket_width, mean_ci95, ratio_interval, sustained_rate, t975
from tests.support import sweep_stopped_after_its_first_cell
from tests.test_bad_flags import assert_one_error
from tests.test_bad_flags import kvbench as in_process
from tests.test_cli import kvbench
from workloads.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent
EVERY = (
    "static", "orca-max", "orca-pow2", "orca-oracle", "paged", "paged-static", "paged-prefix", "vmm",
    "hybrid", "jenga", "hybrid-prefix", "jenga-prefix",
)  # fmt: skip


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def plan(
    engines=("paged",), rates=(2.0,), num_requests=40, kv=(4.0,), repeats=1, sustained=None, **kw
) -> SweepPlan:
    axes = Axes(tuple(engines), ("sharegpt-paper",), tuple(rates), (16,), tuple(kv), (0,), repeats)
    base = RunConfig("paged", workload=WorkloadSpec(num_requests=num_requests, max_total_len=1000))
    return SweepPlan(axes, base, sustained=sustained or SustainedOptions(threshold_s=1.0), **kw)


def quiet() -> Progress:
    return Progress(0, stream=io.StringIO())


# --- the grid --------------------------------------------------------------------------------


def test_axes_parse_and_refuse_bad_values_naming_the_axis():
    assert parse_engines("paged, orca-max,paged", real=False) == ("paged", "orca-max")
    assert parse_engines("all", real=False) == EVERY
    assert parse_rates("4,1,2.5") == (1.0, 2.5, 4.0) and parse_rates(None) == (None,)
    assert parse_block_sizes("16,32") == (16, 32) and parse_budgets("12,0.5") == (12.0, 0.5)
    assert parse_seeds("0,3") == (0, 3)
    for call, message in (
        (lambda: parse_engines("paged,vllm", real=False), "--engines: unknown engine 'vllm'"),
        (lambda: parse_engines("hf-cb", real=False), "--engines: hf-cb is an external engine"),
        (lambda: parse_rates("1,fast"), "--rates: 'fast' is not a positive number of requests/s"),
        (lambda: parse_rates("0"), "--rates: '0' is not a positive number"),
        (lambda: parse_rates("1,,2"), "--rates: empty value in '1,,2'"),
        (lambda: parse_rates("inf"), "--rates: 'inf' is not a positive number"),
        (lambda: parse_block_sizes("12"), "--block-sizes: '12' is not a positive power of two"),
        (lambda: parse_budgets("-1"), "--kv-cache-gib: '-1' is not a positive number of GiB"),
        (lambda: parse_seeds("x"), "--seeds: 'x' is not an integer >= 0"),
    ):
        with pytest.raises(KvbenchError) as error:
            call()
        assert str(error.value).startswith(message), str(error.value)


def test_cell_ids_are_readable_stable_and_distinct():
    cell = Cell(GRID, "paged", "sharegpt-paper", 2.0, 16, 12.0, 0)
    assert cell.id == "paged__trace-sharegpt-paper__rate-2__bs-16__kv-12__seed-0__rep-0"
    assert Cell(GRID, "paged", "sharegpt-paper", 0.125, 16, None, 3, 1).id.endswith(
        "__rate-0.125__bs-16__kv-gpu__seed-3__rep-1"
    )
    assert "rate-unloaded" in Cell(BASELINE, "paged", "sharegpt-paper", None, 16, 12.0, 0).id
    # specs that are not folder names get a slug and a hash, and stay apart
    a, b = trace_token("uniform:prompt=4..30,output=2..12"), trace_token("uniform:prompt=4..30,output=2..13")
    assert a != b and "/" not in a and a.startswith("uniform-prompt-4..30-output-2..12-")
    axes = Axes(
        ("paged", "static"), ("sharegpt-paper", "alpaca-paper"), (1.0, 2.0), (16, 32), (12.0,), (0,), 2
    )
    cells = grid_cells(axes)
    assert len(cells) == 2 * 2 * 2 * 2 * 2 == len({c.id for c in cells})
    assert [c.workload_seed for c in cells[:2]] == [0, 1000]  # repeats shift the seed


def test_cell_config_sets_the_axes_and_a_sparse_baseline():
    base = RunConfig("paged", workload=WorkloadSpec(num_requests=500))
    config = cell_config(base, Cell(GRID, "paged", "alpaca-paper", 3.0, 32, 6.0, 2, 1))
    assert (config.engine, config.block_size, config.kv_cache_gib) == ("paged", 32, 6.0)
    config = cell_config(base, Cell(GRID, "orca-max", "alpaca-paper", 3.0, 32, 6.0, 2, 1))
    assert (config.engine, config.block_size, config.kv_cache_gib) == ("orca-max", 16, 6.0)  # reads none
    assert (config.workload.source, config.workload.rate, config.workload.seed) == ("alpaca-paper", 3.0, 1002)
    unloaded = cell_config(base, Cell(BASELINE, "paged", "sharegpt-paper", None, 16, 6.0, 0))
    assert (unloaded.workload.arrivals, unloaded.workload.rate, unloaded.workload.num_requests) == (
        "constant",
        0.001,
        50,
    )


# --- pure numbers ----------------------------------------------------------------------------


def test_confidence_interval():
    mean, half = mean_ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / math.sqrt(3))
    assert math.isnan(mean_ci95([5.0])[1]) and t975(1) == 12.706
    assert t975(31) == pytest.approx(2.0395, abs=1e-3) and t975(1000) == pytest.approx(1.9623, abs=1e-3)


def test_sustained_rate_on_made_up_points():
    curve = [(1.0, 0.02), (2.0, 0.025), (4.0, 0.04), (8.0, 0.9), (16.0, 3.0)]
    verdict = sustained_rate(curve, threshold=0.1)
    assert (verdict.sustained_rate, verdict.first_fail, verdict.bracket) == (4.0, 8.0, (4.0, 8.0))
    # a pass above a failure is noise in the knee: the search stops at the first failure
    assert sustained_rate([(1, 0.02), (2, 0.5), (3, 0.05)], 0.1).sustained_rate == 1
    assert sustained_rate([(1, 0.02), (2, None), (3, 0.05)], 0.1).sustained_rate == 1  # failed cell
    everything = sustained_rate([(1, 0.02), (2, 0.03)], 0.1)
    assert everything.sustained_rate == 2 and everything.bracket is None and "may be higher" in everything.how
    nothing = sustained_rate([(1, 0.5), (2, 0.6)], 0.1)
    assert nothing.sustained_rate is None and nothing.bracket == (0.0, 1)


def test_bisection_on_a_made_up_curve_converges_on_the_knee():
    def latency(rate: float) -> float:  # flat, then a wall at 5.3 req/s
        return 0.02 if rate < 5.3 else 1.0

    points = [(r, latency(r)) for r in (1.0, 2.0, 4.0, 8.0)]
    for _ in range(6):
        bracket = sustained_rate(points, 0.1).bracket
        rate = bisect_rate(bracket)
        points.append((rate, latency(rate)))
    verdict = sustained_rate(points, 0.1)
    assert verdict.sustained_rate < 5.3 <= verdict.first_fail
    assert verdict.first_fail - verdict.sustained_rate == pytest.approx(4.0 / 2**6)


def test_bracket_width_and_the_interval_of_a_ratio_of_brackets():
    assert bracket_width((4.0, 4.4)) == pytest.approx(0.1)
    assert bracket_width((0.0, 1.0)) == math.inf  # even the lowest rate failed
    # A in [6, 6.6), B in [2, 2.2): A / B in [6 / 2.2, 6.6 / 2]
    assert ratio_interval((6.0, 6.6), (2.0, 2.2)) == pytest.approx((6 / 2.2, 3.3))
    assert ratio_interval((6.0, 6.6), (0.0, 0.5)) == (12.0, math.inf)  # B never passed


def test_bisection_stops_once_the_bracket_is_as_narrow_as_asked(tmp_path):
    """--bracket 0.1: midpoints until (first fail - last pass) / last pass <= 10 %, whatever
    the grid's spacing; the cells' latencies on either side of the bound confirm the bracket."""
    sustained = SustainedOptions(threshold_s=0.1, bracket=0.1)
    p = plan(engines=("orca-max",), rates=(0.5, 16.0), num_requests=150, kv=(12.0,), sustained=sustained)
    result = run_sweep(p, tmp_path / "s", progress=quiet())
    (row,) = rows_of(tmp_path / "s" / "sustained.csv")
    low, high = float(row["last_pass_rate"]), float(row["first_fail_rate"])
    assert 0 < (high - low) / low <= 0.1
    rounds = int(row["bisect_cells"])
    assert rounds == [r["role"] for r in result.rows].count("bisect") and rounds >= 5  # 0.5..16: 32x apart
    latency = {float(r["rate"]): float(r["normalized_latency_s"]) for r in result.rows}
    assert latency[low] < 0.1 <= latency[high]
    # each end's own latency beside it, read from the cells the bracket rests on
    assert float(row["last_pass_latency_s"]) == pytest.approx(latency[low], rel=1e-9)
    assert float(row["first_fail_latency_s"]) == pytest.approx(latency[high], rel=1e-9)


def test_a_step_outside_the_grid_is_just_under_a_bracket_wide():
    from kvbench.sweep.stats import Verdict
    from kvbench.sweep.sustained import step_outside

    every_pass, lowest_failed = Verdict(2.0, None, ""), Verdict(None, 1.8, "")
    assert step_outside(every_pass, [1.8, 2.0], 0.1) == 2.19  # 2.0 x 1.095
    assert step_outside(lowest_failed, [1.8, 2.0], 0.1) == 1.644  # 1.8 / 1.095, 4 digits
    assert step_outside(Verdict(1.8, 2.0, ""), [1.8, 2.0], 0.1) is None  # bracketed: bisection's turn
    assert step_outside(every_pass, [1.8, 2.0], None) is None  # no target bracket, no steps
    assert bracket_width((2.0, 2.19)) < 0.1 and bracket_width((1.644, 1.8)) < 0.1


@pytest.mark.parametrize(
    ("pair", "steps"),
    [((0.9, 0.95), (1.04, 1.139)), ((1.3, 1.4), (1.187, 1.084))],
    ids=["both-pass-steps-up", "both-fail-steps-down"],
)
def test_a_placed_pair_on_one_side_of_the_knee_steps_across_it(tmp_path, pair, steps):
    """Orca (Max)'s knee here is near 1.11 req/s (bisected to 2 %: 1.105 passes, 1.121 fails). An
    engine's own pair of rates that both pass steps up, both fail steps down, a bracket's width at
    a time, until a pass and a fail at most 10 % apart enclose the knee; no bisection from 0."""
    sustained = SustainedOptions(threshold_s=0.1, bracket=0.1, extend=4)
    p = plan(engines=("orca-max",), rates=pair, num_requests=150, kv=(12.0,), sustained=sustained)
    p = SweepPlan(
        replace(p.axes, rates=(0.5,), engine_rates=(("orca-max", pair),)), p.base, sustained=sustained
    )
    result = run_sweep(p, tmp_path / "s", progress=quiet())
    assert [float(r["rate"]) for r in result.rows] == [*pair, *steps]  # never the axes' own 0.5
    (row,) = rows_of(tmp_path / "s" / "sustained.csv")
    low, high = float(row["last_pass_rate"]), float(row["first_fail_rate"])
    assert (low, high) == (min(steps), max(steps)) and 0 < (high - low) / low <= 0.1
    assert row["bisect_cells"] == "2" and "stepped outside the grid 2x" in row["how"]
    latency = {float(r["rate"]): float(r["normalized_latency_s"]) for r in result.rows}
    assert latency[low] < 0.1 <= latency[high]


# --- real sweeps (simulated) -----------------------------------------------------------------


def test_every_engine_one_row_per_cell(tmp_path):
    p = plan(engines=EVERY, rates=(2.0, 8.0), repeats=2)
    result = run_sweep(p, tmp_path / "s", progress=quiet())
    rows = rows_of(tmp_path / "s" / "sweep.csv")
    cells = len(EVERY) * 2 * 2  # engines x rates x repeats
    assert len(rows) == len(result.rows) == cells and result.ran == cells and result.failed == 0
    assert {r["engine"] for r in rows} == set(EVERY) and {r["status"] for r in rows} == {"ok"}
    for row in rows:
        folder = tmp_path / "s" / "cells" / row["cell_id"]
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["engine"] == row["engine"] and float(row["rate"]) in (2.0, 8.0)
        assert float(row["request_throughput"]) == summary["request_throughput"]
        assert float(row["p99_ttft_s"]) == summary["p99_ttft_s"]
        assert float(row["occupancy_token_states"]) == summary["occupancy"]["token_states"]
        config = json.loads((folder / "config.json").read_text())
        assert config["workload"]["seed"] == 1000 * int(row["repeat"])
    # the two repeats of a point share its mean and 95 % interval
    pair = [r for r in rows if r["engine"] == "paged" and r["rate"] == "8.0"]
    values = [float(r["normalized_latency_s"]) for r in pair]
    mean, half = mean_ci95(values)
    assert all(float(r["normalized_latency_s_mean"]) == pytest.approx(mean) for r in pair)
    assert float(pair[0]["normalized_latency_s_ci95"]) == pytest.approx(half) and half > 0
    described = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert described["axes"]["engines"] == list(EVERY) and described["base_config"]["model"] == "opt-13b"


def test_sustained_rate_of_a_real_sweep_with_bisection(tmp_path):
    sustained = SustainedOptions(bisect=2)  # threshold: 4 x the lowest unloaded latency, for both
    p = plan(
        engines=("paged", "orca-max"),
        rates=(0.5, 1.0, 16.0),
        num_requests=150,
        kv=(12.0,),
        sustained=sustained,
    )
    result = run_sweep(p, tmp_path / "s", progress=quiet())
    rows = {r["cell_id"]: r for r in rows_of(tmp_path / "s" / "sweep.csv")}
    table = {r["engine"]: r for r in rows_of(tmp_path / "s" / "sustained.csv")}
    assert [r["role"] for r in result.rows].count("baseline") == 2
    assert [r["role"] for r in result.rows].count("bisect") == 4  # 2 per engine
    baselines = {r["engine"]: r for r in rows.values() if r["role"] == "baseline"}
    lowest = min(float(r["normalized_latency_s"]) for r in baselines.values())
    assert table["paged"]["latency_threshold_s"] == table["orca-max"]["latency_threshold_s"]  # one bound
    for engine, row in table.items():
        baseline = baselines[engine]
        assert int(baseline["peak_batched_requests"]) == 1  # truly unloaded
        assert float(row["unloaded_latency_s"]) == pytest.approx(float(baseline["normalized_latency_s"]))
        threshold = float(row["latency_threshold_s"])
        assert threshold == pytest.approx(4 * lowest) and "shared by all" in row["threshold_source"]
        latency = {
            float(r["rate"]): float(r["normalized_latency_s"])
            for r in rows.values()
            if r["engine"] == engine and r["role"] != "baseline"
        }
        ok, fail = float(row["sustained_rate"]), float(row["first_fail_rate"])
        assert latency[ok] < threshold <= latency[fail]
        assert all(v < threshold for r, v in latency.items() if r < ok)
        assert row["bisect_cells"] == "2" and "bisected 2x" in row["how"]
    # paged keeps up with more than max-length reservations do (the paper's Figure 12)
    assert float(table["paged"]["sustained_rate"]) > float(table["orca-max"]["sustained_rate"])


def test_resume_skips_finished_cells_and_a_full_folder_needs_a_choice(tmp_path):
    out = tmp_path / "s"
    p = plan(engines=("paged", "orca-oracle"), rates=(1.0, 3.0))
    run_sweep(p, out, progress=quiet())
    stamps = {f: f.stat().st_mtime_ns for f in out.glob("cells/*/summary.json")}
    assert len(stamps) == 4
    again = run_sweep(p, out, resume=True, progress=quiet())
    assert (again.ran, again.resumed) == (0, 4)
    assert {f: f.stat().st_mtime_ns for f in out.glob("cells/*/summary.json")} == stamps
    assert [r["status"] for r in rows_of(out / "sweep.csv")] == ["ok"] * 4
    with pytest.raises(KvbenchError, match="is not empty: --resume continues that sweep, --overwrite"):
        run_sweep(p, out, progress=quiet())
    # a changed setting cannot be resumed into the same folder
    other = SweepPlan(p.axes, RunConfig("paged", workload=WorkloadSpec(num_requests=41, max_total_len=1000)))
    tables = {name: (out / name).read_bytes() for name in ("sweep.csv", "sweep.json")}
    with pytest.raises(KvbenchError, match=r"--resume: .* ran other settings \(workload\)"):
        run_sweep(other, out, resume=True, progress=quiet())
    assert {name: (out / name).read_bytes() for name in tables} == tables  # a refused resume writes nothing
    assert run_sweep(p, out, overwrite=True, progress=quiet()).ran == 4


RESUMED = ("sweep", "--model", "tiny-opt", "--kv-cache-gib", "0.002", "--trace", "fixed:prompt=4,output=4",
           "--num-requests", "5", "--bisect", "1")  # fmt: skip


def resumed_sweep(capsys, monkeypatch, out: Path, *args: str, engines="paged", rates="1,2"):
    """`kvbench sweep` in this process on a tiny grid: (exit code, stdout, stderr)."""
    command = (*RESUMED, "--engines", engines, "--rates", rates, *args, "--out", str(out))
    return in_process(capsys, monkeypatch, *command)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"args": ("--seeds", "3")}, "--seeds: 0 there, 3 now; a resume may add values, not drop them"),
        ({"engines": "vmm"}, "--engines: paged there, vmm now; a resume may add values"),
        ({"rates": "1"}, "--rates: 1,2 there, 1 now"),
        ({"args": ("--step-by-step",)}, "--step-by-step: off there, on now"),
        ({"args": ("--threshold-multiple", "3")}, "--threshold-multiple: 4 there, 3 now"),
        ({"args": ("--latency-threshold", "1")}, "--latency-threshold: none there, 1 now"),
        ({"args": ("--bisect", "0")}, "the bisection: --bisect 1 there, --bisect 0 now; a resumed bisection"),
        ({"args": ("--bracket", "0.5")}, "the bisection: --bisect 1 there, --bisect 1 --bracket 0.5 now"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v.get("args", ())) or str(v),
)
def test_a_resume_that_would_not_continue_the_folders_sweep_is_refused(tmp_path, capsys, monkeypatch,
                                                                       change, named):  # fmt: skip
    """The resume would rewrite sweep.json, sweep.csv and sustained.csv for its own grid or bound
    while the folder's cells stay, so `kvbench compare` would mix the two: it is refused in one
    line naming the setting, its saved value and the new one, and no file changes."""
    out = tmp_path / "s"
    assert resumed_sweep(capsys, monkeypatch, out)[0] == 0
    tables = {name: (out / name).read_bytes() for name in ("sweep.json", "sweep.csv", "sustained.csv")}
    done = resumed_sweep(capsys, monkeypatch, out, "--resume", *change.get("args", ()),
                         **{k: v for k, v in change.items() if k != "args"})  # fmt: skip
    line = assert_one_error(*done, f"--resume: {out} ran other settings ({named}")
    assert line.endswith("use another --out, or --overwrite")
    assert {name: (out / name).read_bytes() for name in tables} == tables


def test_a_resume_may_add_axis_values_take_the_bisection_further_and_run_cells_otherwise(
    tmp_path, capsys, monkeypatch
):
    """Values added to axes (listed in any order), more bisection rounds, and other ways of running
    cells continue the sweep: its finished cells are found, not run again."""
    out = tmp_path / "s"
    assert resumed_sweep(capsys, monkeypatch, out)[0] == 0
    first = [row["cell_id"] for row in rows_of(out / "sweep.csv")]
    assert len(first) == 3  # paged's baseline and two rates
    code, stdout, err = resumed_sweep(
        capsys, monkeypatch, out, "--resume", "--seeds", "1,0", "--bisect", "2", "--continue-on-error",
        "--deadline-s", "600", engines="orca-oracle,paged", rates="2,1,4",
    )  # fmt: skip
    assert code == 0, err
    assert "16 cells (13 run, 3 resumed, 0 failed)" in stdout
    rows = {row["cell_id"]: row for row in rows_of(out / "sweep.csv")}
    assert set(first) <= set(rows) and {row["status"] for row in rows.values()} == {"ok"}
    assert json.loads((out / "sweep.json").read_text())["axes"]["seeds"] == [1, 0]
    # the same command again, in child processes: nothing left to run, nothing refused
    isolated = ("--isolate", "--cell-timeout", "600")
    again = resumed_sweep(capsys, monkeypatch, out, "--resume", "--seeds", "0,1", "--bisect", "2", *isolated,
                          engines="paged,orca-oracle", rates="1,2,4")  # fmt: skip
    assert again[0] == 0 and "16 cells (0 run, 16 resumed, 0 failed)" in again[1], again[2]


def test_a_sweep_saved_before_a_setting_existed_resumes_as_that_settings_default(tmp_path):
    """A sweep.json lacks the keys of settings added after it was written: each counts as its
    default (as in a cell's config.json), so the sweep resumes with its original command, and
    only a non-default value of such a setting makes it another sweep's."""
    out = tmp_path / "s"
    p = plan(rates=(1.0, 2.0))
    run_sweep(p, out, progress=quiet())

    def as_an_older_kvbench_wrote_it() -> None:
        saved = json.loads((out / "sweep.json").read_text())
        for section, key in (("axes", "engine_rates"), ("sustained", "bracket"), ("sustained", "extend"),
                             ("cell_run", "tables"), ("base_config", "chunked_prefill")):  # fmt: skip
            del saved[section][key]
        del saved["duration_s"], saved["base_config"]["workload"]["max_history"]
        (out / "sweep.json").write_text(json.dumps(saved))

    as_an_older_kvbench_wrote_it()
    assert run_sweep(p, out, resume=True, progress=quiet()).resumed == 2
    as_an_older_kvbench_wrote_it()
    shutil.rmtree(out / "cells")  # no finished cell to compare: the sweep.json alone decides
    chunked = replace(p, base=replace(p.base, chunked_prefill=True))
    with pytest.raises(OtherSettings, match=r"\(--chunked-prefill: off there, on now\)"):
        run_sweep(chunked, out, resume=True, progress=quiet())
    other = replace(p, base=replace(p.base, workload=replace(p.base.workload, num_requests=41)))
    with pytest.raises(OtherSettings, match=r"\(--num-requests: 40 there, 41 now\)"):
        run_sweep(other, out, resume=True, progress=quiet())


def test_a_failing_cell_is_recorded_or_stops_the_sweep(tmp_path):
    # orca-max reserves 2048 slots per request: more than 1 GiB of OPT-13B KV (1310 slots)
    p = plan(engines=("orca-max", "paged"), rates=(1.0, 2.0), kv=(1.0,), continue_on_error=True)
    result = run_sweep(p, tmp_path / "a", progress=quiet())
    rows = rows_of(tmp_path / "a" / "sweep.csv")
    assert [r["status"] for r in rows] == ["failed", "failed", "ok", "ok"] and result.failed == 2
    assert "cannot fit the KV arena of 1310 slots" in rows[0]["error"] and rows[0]["request_throughput"] == ""
    assert not (tmp_path / "a" / "cells" / rows[0]["cell_id"]).exists()
    stop = SweepPlan(p.axes, p.base, sustained=p.sustained)
    with pytest.raises(KvbenchError, match=r"^cell orca-max__\S+ failed: request \d+ .*--continue-on-error"):
        run_sweep(stop, tmp_path / "b", progress=quiet())
    assert [r["status"] for r in rows_of(tmp_path / "b" / "sweep.csv")] == [
        "failed",
        "pending",
        "pending",
        "pending",
    ]


def test_progress_line_counts_cells_and_gives_an_eta(tmp_path):
    stream = io.StringIO()
    run_sweep(plan(rates=(1.0, 2.0, 3.0)), tmp_path / "s", progress=Progress(3, stream=stream))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("[" + "#" * 24 + "] 3/3 cells")
    assert "ETA 0:00" in lines[-1] and "__rate-3__" in lines[-1]


# --- the command line ------------------------------------------------------------------------


def test_isolated_cells_equal_in_process_ones_and_record_failures(tmp_path):
    args = ("sweep", "--engines", "paged,orca-max", "--rates", "2", "--kv-cache-gib", "1",
            "--num-requests", "30", "--max-total-len", "1000", "--slo", "ttft=1", "--percentiles", "50,99.9",
            "--continue-on-error", "--latency-threshold", "1")  # fmt: skip
    inside = kvbench(*args, "--out", str(tmp_path / "in"))
    isolated = kvbench(*args, "--isolate", "--out", str(tmp_path / "iso"))
    assert inside.returncode == isolated.returncode == 0, isolated.stderr
    assert "2 cells (2 run, 0 resumed, 1 failed)" in isolated.stdout
    a, b = rows_of(tmp_path / "in" / "sweep.csv"), rows_of(tmp_path / "iso" / "sweep.csv")
    assert [r["status"] for r in b] == ["ok", "failed"] and b[1]["error"] == a[1]["error"]
    for key in ("request_throughput", "normalized_latency_s", "goodput", "p99.9_tpot_s", "num_preemptions"):
        assert a[0][key] == b[0][key], key
    cell = tmp_path / "iso" / "cells" / b[0]["cell_id"]
    assert json.loads((cell / "env.json").read_text())["command"][1:2] == ["simulate"]


def test_an_isolated_cell_runs_exactly_its_config(tmp_path):
    workload = WorkloadSpec(num_requests=20, prefix="fewshot-1", arrivals="gamma", burstiness=0.5)
    base = RunConfig("paged", workload=workload, percentiles=(50.0, 99.9), slo=parse_slo("tpot=0.05"))
    config = cell_config(base, Cell(GRID, "orca-oracle", "alpaca-paper", 2.5, 32, 0.5, 1))
    assert config.block_size == 16  # orca-oracle reads no block size: it runs, and records, the default
    argv = command(config, tmp_path / "c", CellRun(isolate=True))
    assert argv[1:4] == ["-m", "kvbench", "simulate"] and argv[-2:] == ["--out", str(tmp_path / "c")]
    assert "--burstiness" in argv and "--prefix" in argv and "--slo" in argv
    outcome = run_cell(config, tmp_path / "c", CellRun(isolate=True))  # checks the child's config.json
    assert outcome.ok and outcome.summary["engine"] == "orca-oracle" and "p99.9_itl_s" in outcome.summary
    assert config_differences(config, tmp_path / "c") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--engines", "paged,vllm"), "error: --engines: unknown engine 'vllm'"),
        (("--rates", "1,fast"), "error: --rates: 'fast' is not a positive number of requests/s"),
        (("--block-sizes", "24"), "error: --block-sizes: '24' is not a positive power of two"),
        (
            ("--bisect", "2"),
            "error: --bisect, --bracket and --latency-threshold find a sustained rate: give --rates",
        ),
        (("--resume", "--overwrite"), "error: --resume and --overwrite contradict each other"),
        (
            ("--rates", "2", "--duration", "0"),
            "error: --duration must be a finite number in (0, 1000000000], got 0.0",
        ),
        (
            ("--rates", "2", "--duration", "nan"),
            "error: --duration must be a finite number in (0, 1000000000], got nan",
        ),
        (("--duration", "30"), "error: --duration sets each rate's request count: give --rates"),
    ],
)
def test_bad_sweep_input_is_one_line(tmp_path, args, message):
    proc = kvbench("sweep", "--num-requests", "5", *args, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(message)


def test_duration_gives_every_rate_a_trace_of_that_length(tmp_path):
    """--duration: rate x duration requests per loaded cell (at least 20); the sweep records it, so
    a resume with another duration is refused as other settings."""
    out = tmp_path / "d"
    args = ["sweep", "--engines", "paged", "--rates", "1,4", "--kv-cache-gib", "4",
            "--latency-threshold", "1", "--duration", "10", "--out", str(out)]  # fmt: skip
    proc = kvbench(*args)
    assert proc.returncode == 0, proc.stderr
    counts = {float(r["rate"]): int(r["num_requests"]) for r in rows_of(out / "sweep.csv")}
    assert counts == {1.0: 20, 4.0: 40}
    assert json.loads((out / "sweep.json").read_text())["duration_s"] == 10.0
    again = kvbench(*args[:-4], "--duration", "20", "--out", str(out), "--resume")
    assert again.returncode == 2 and "ran other settings" in again.stderr, again.stderr


def test_a_killed_sweep_resumes_without_redoing_or_losing_a_cell(tmp_path):
    out = tmp_path / "s"
    args = ["sweep", "--engines", "paged", "--rates", "4,6,8,10,12,16", "--latency-threshold", "0.1",
            "--kv-cache-gib", "4", "--num-requests", "600", "--out", str(out)]  # fmt: skip
    sweep_stopped_after_its_first_cell(args, out, ROOT)  # SIGKILLed between its first and second cell
    finished = [f for f in out.glob("cells/*/summary.json") if not f.parent.name.startswith(".")]
    done = {f: f.stat().st_mtime_ns for f in finished}
    assert len(done) == 1
    resumed = kvbench(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"6 cells ({6 - len(done)} run, {len(done)} resumed, 0 failed)" in resumed.stdout
    assert {f: f.stat().st_mtime_ns for f in done} == done  # not redone
    rows = rows_of(out / "sweep.csv")
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"}
    assert len(list(out.glob("cells/*/summary.json"))) == 6 and not list(out.glob("cells/.*"))
    assert (out / "sustained.csv").is_file()


def test_a_setting_added_after_a_cell_ran_counts_as_its_default_when_resuming(tmp_path):
    """A cell recorded before a setting existed was run with that setting's default: resuming keeps
    it, at the top level and inside the workload, and only a non-default value makes it another's."""
    config = RunConfig("paged", workload=WorkloadSpec(num_requests=10, rate=2.0))
    assert run_cell(config, tmp_path / "c", CellRun()).ok
    path = tmp_path / "c" / "config.json"
    recorded = json.loads(path.read_text())
    del recorded["chunked_prefill"], recorded["vmm_map"], recorded["workload"]["time_scale"]
    path.write_text(json.dumps(recorded))
    assert config_differences(config, tmp_path / "c") == []
    chunked = replace(config, chunked_prefill=True, workload=replace(config.workload, time_scale=2.0))
    assert config_differences(chunked, tmp_path / "c") == ["chunked_prefill", "workload"]
    assert config_differences(replace(config, block_size=32), tmp_path / "c") == ["block_size"]


def test_the_summary_line_says_how_close_each_end_fell_to_the_bound():
    """A pass 0.2 % under the bound reads as one, next to a fail 50 % over: the line a user reads
    shows which verdicts another seed may reverse; an end without a latency is left out."""
    from kvbench.cli.sweep import _end_margins

    row = {"latency_threshold_s": 0.1, "last_pass_rate": 1.0, "last_pass_latency_s": 0.0998,
           "first_fail_rate": 1.1, "first_fail_latency_s": 0.15}  # fmt: skip
    assert _end_margins(row) == "; 0.09980 at 1 (-0.2 %), 0.1500 at 1.1 (+50.0 %)"
    far = {**row, "first_fail_latency_s": 1.2}  # 12 x the bound: still in per cent
    assert _end_margins(far) == "; 0.09980 at 1 (-0.2 %), 1.200 at 1.1 (+1100.0 %)"
    failed = {**row, "first_fail_latency_s": None}  # a cell of the first fail failed: said so
    assert _end_margins(failed) == "; 0.09980 at 1 (-0.2 %), failed at 1.1"
    every_rate_passed = {**row, "first_fail_rate": None, "first_fail_latency_s": None}
    assert _end_margins(every_rate_passed) == "; 0.09980 at 1 (-0.2 %)"
    assert _end_margins({**row, "latency_threshold_s": None}) == ""
