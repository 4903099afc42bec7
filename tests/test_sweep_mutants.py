"""A sweep's cells, rows and axes, pinned value by value where the sweep's own tests read them
only through a finished sweep (mutation testing, scope `sweep`: docs/MUTATION.md).

What these pin: how long a cell's trace is (requests = rate x duration, at least 20; a
baseline's count; a preset's rate), every column of a sweep.csv row and the saturated share in
it, the one-line refusal of each axis flag (named, even for an empty item), the folder-safe
trace token, and the time a deadline leaves. And the sweep's own state (kvbench/sweep/run.py):
what a resume reads back from sweep.csv and the cell folders, what it refuses and clears, the
progress counts, the rows a stopped or a resumed sweep keeps, and what sweep.json records.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from kvbench.config import RunConfig, Slo
from kvbench.errors import KvbenchError
from kvbench.results.files import temp_path
from kvbench.results.ownership import is_temp
from kvbench.sweep.cell import CellRun
from kvbench.sweep.deadline import Deadline
from kvbench.sweep.files import CELL_COLUMNS, CI_METRICS, cell_row, metric_columns, read_table, write_table
from kvbench.sweep.grid import (
    BASELINE,
    BISECT,
    GRID,
    REPEAT_SEED_STRIDE,
    Axes,
    Cell,
    cell_config,
    number_token,
    parse_block_sizes,
    parse_budgets,
    parse_engines,
    parse_seeds,
    parse_traces,
    trace_token,
)
from kvbench.sweep.plan import SustainedOptions, SweepPlan
from kvbench.sweep.progress import Progress
from kvbench.sweep.run import OtherSettings, run_sweep
from kvbench.version import __version__
from tests.test_sweep import plan, quiet
from workloads.spec import WorkloadSpec

LATENCIES = [
    f"{stat}_{m}_s" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "p50", "p90", "p99")
]
OCCUPANCY = [
    f"occupancy_{c}"
    for c in (
        "token_states", "outside_window", "reservation", "internal_frag", "allocator_overhead", "mapped_idle",
        "external_frag", "free",
    )
]  # fmt: skip
COLUMNS = [
    "num_requests", "completed", "makespan_s", "request_throughput", "output_token_throughput",
    "total_token_throughput", "normalized_latency_s", *LATENCIES, "mean_queueing_s",
    "mean_batched_requests", "peak_batched_requests", "num_preemptions", "preempted_requests", "num_slots",
    "kv_budget_bytes", "saturated_share", *OCCUPANCY,
]  # fmt: skip


def test_a_rows_metric_columns_are_named_exactly_and_goodput_joins_them_with_an_slo():
    assert metric_columns(RunConfig("paged")) == COLUMNS
    with_slo = metric_columns(RunConfig("paged", slo=Slo(ttft_s=1.0)))
    at = COLUMNS.index("mean_queueing_s") + 1
    assert with_slo == [*COLUMNS[:at], "goodput", "goodput_fraction", *COLUMNS[at:]]


def summary_of(columns: list[str]) -> dict:
    """A summary.json whose every key has its own value (busy 8 s, 2 of them saturated)."""
    summary = {key: float(i + 1) for i, key in enumerate(columns) if key != "saturated_share"}
    summary["occupancy"] = {key.removeprefix("occupancy_"): summary.pop(key) for key in OCCUPANCY}
    return {**summary, "mode": "simulated", "busy_s": 8.0, "saturated_s": 2.0}


def test_a_finished_cells_row_carries_its_axes_status_and_every_metric():
    config = RunConfig(
        "paged", model="opt-13b", emulate_gpu="a100-40gb", workload=WorkloadSpec("alpaca-paper", rate=4.5)
    )
    cell = Cell(GRID, "paged", "alpaca-paper", 4.5, 16, 12.0, 2, repeat=1)
    summary = summary_of(COLUMNS)
    row = cell_row(cell, config, "ok", summary, "", 61.5)
    assert row == {
        "cell_id": cell.id, "role": GRID, "status": "ok", "engine": "paged", "model": "opt-13b",
        "trace": "alpaca-paper", "rate": 4.5, "block_size": 16, "kv_cache_gib": 12.0,
        "emulate_gpu": "a100-40gb", "seed": 2, "repeat": 1, "workload_seed": 1002, "mode": "simulated",
        "wall_s": 61.5, "error": "",
        **{key: summary.get(key) for key in COLUMNS if key != "saturated_share" and key not in OCCUPANCY},
        **{f"occupancy_{k}": v for k, v in summary["occupancy"].items()},
        "saturated_share": 0.25,  # saturated over busy seconds
    }  # fmt: skip


def test_a_row_without_busy_time_or_saturated_time_or_a_summary():
    config = RunConfig("paged")
    cell = Cell(BISECT, "paged", "sharegpt-paper", 2.0, 16, None, 0)
    idle = cell_row(cell, config, "ok", {**summary_of(COLUMNS), "busy_s": 0.0}, "", 1.0)
    assert math.isnan(idle["saturated_share"])  # no busy time: no share, never a division by zero
    unsaturated = {k: v for k, v in summary_of(COLUMNS).items() if k != "saturated_s"}
    assert cell_row(cell, config, "ok", unsaturated, "", 1.0)["saturated_share"] == 0.0
    pending = cell_row(cell, config, "pending", None, "", None)
    assert pending["mode"] == "" and pending["status"] == "pending" and "completed" not in pending
    failed = cell_row(cell, config, "failed", None, "KvbenchError: out of memory", 3.0)
    assert (failed["mode"], failed["error"], failed["wall_s"]) == ("", "KvbenchError: out of memory", 3.0)


def test_a_duration_sets_a_loaded_cells_request_count_and_nothing_else_does():
    base = RunConfig("paged", workload=WorkloadSpec("sharegpt-paper", num_requests=300))
    loaded = Cell(GRID, "paged", "alpaca-paper", 2.01, 32, 6.0, 3)
    config = cell_config(base, loaded, duration_s=10.0)
    assert (config.engine, config.block_size, config.kv_cache_gib) == ("paged", 32, 6.0)
    assert config.workload.num_requests == 21  # ceil(2.01 x 10)
    assert (config.workload.source, config.workload.rate, config.workload.seed) == ("alpaca-paper", 2.01, 3)
    slow = replace(loaded, rate=0.5)
    assert cell_config(base, slow, duration_s=10.0).workload.num_requests == 20  # at least 20
    assert cell_config(base, loaded).workload.num_requests == 300  # no duration: the base's count
    # a baseline ignores the duration: a few requests, far apart, at most the base's count
    baseline = Cell(BASELINE, "paged", "alpaca-paper", None, 16, 6.0, 0)
    few = cell_config(
        RunConfig("paged", workload=WorkloadSpec("alpaca-paper", num_requests=10)), baseline, duration_s=10.0
    )
    assert (few.workload.num_requests, few.workload.rate, few.workload.arrivals) == (10, 0.001, "constant")
    assert cell_config(RunConfig("paged"), baseline, duration_s=10.0).workload.num_requests == 50


def test_a_preset_without_a_rate_runs_at_one_request_a_second_and_a_timed_trace_at_its_own_times():
    base = RunConfig("paged", workload=WorkloadSpec("sharegpt-paper", num_requests=30))
    own_times = Cell(GRID, "paged", "sharegpt-paper", None, 16, None, 0)
    config = cell_config(base, own_times, duration_s=60.0)
    assert (config.workload.rate, config.workload.num_requests) == (1.0, 30)  # no rate: no duration count
    gamma = RunConfig("paged", workload=WorkloadSpec("sharegpt-paper", num_requests=30, arrivals="gamma"))
    assert cell_config(gamma, own_times).workload.rate is None  # arrivals given: left to them
    timed = Cell(GRID, "paged", "uniform:prompt=4..8,output=2..3", None, 16, None, 0)
    assert cell_config(base, timed).workload.rate is None  # not a preset: its own timestamps


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (lambda t: parse_engines(t, False), "paged,,static", "--engines: empty value in 'paged,,static'"),
        (parse_block_sizes, "16,,32", "--block-sizes: empty value in '16,,32'"),
        (parse_budgets, "4,,8", "--kv-cache-gib: empty value in '4,,8'"),
        (parse_seeds, "0,,1", "--seeds: empty value in '0,,1'"),
        (parse_block_sizes, "0", "--block-sizes: '0' is not a positive power of two"),
        (parse_block_sizes, "24", "--block-sizes: '24' is not a positive power of two"),
        (parse_budgets, "0", "--kv-cache-gib: '0' is not a positive number of GiB"),
        (parse_budgets, "inf", "--kv-cache-gib: 'inf' is not a positive number of GiB"),
        (parse_seeds, "-1", "--seeds: '-1' is not an integer >= 0"),
    ],
)
def test_each_axis_flag_refuses_in_one_line_naming_itself(parse, text, message):
    with pytest.raises(KvbenchError) as refused:
        parse(text)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_the_axis_flags_accept_their_smallest_values():
    assert parse_block_sizes("1,2,4") == (1, 2, 4)
    assert parse_seeds("0") == (0,)
    assert parse_budgets("0.5") == (0.5,)


def test_an_unknown_engine_is_named_beside_every_choice():
    with pytest.raises(KvbenchError) as refused:
        parse_engines("paged,nope", False)
    said = str(refused.value)
    assert said.startswith("--engines: unknown engine 'nope'; choose from static, ") and said.endswith(
        " or all"
    )
    assert ", paged, " in said


def test_trace_tokens_are_the_spec_when_safe_else_a_cleaned_prefix_and_a_hash():
    def digest(spec: str) -> str:
        return hashlib.sha1(spec.encode()).hexdigest()[:8]

    assert trace_token("ShareGPT-v3.json") == "ShareGPT-v3.json"  # capitals are safe
    assert trace_token("X-trace-X") == "X-trace-X"  # only dashes and dots are cleaned off the ends
    ends_in_x = "a" * 39 + "X" + "b" * 5
    assert trace_token(ends_in_x) == f"{'a' * 39}X-{digest(ends_in_x)}"
    forty = "a" * 40
    assert trace_token(forty) == forty  # 40 characters: kept
    assert trace_token(forty + "b") == f"{forty}-{digest(forty + 'b')}"  # 41: cut and hashed
    assert trace_token("./traces/x y.csv") == f"traces-x-y.csv-{digest('./traces/x y.csv')}"  # ends cleaned
    cut = "c" * 39 + ".d" * 5  # its 40th character is a dot: the cut prefix loses it
    assert trace_token(cut) == f"{'c' * 39}-{digest(cut)}"
    assert number_token(None) == "trace" and number_token(2.0) == "2" and number_token(0.001) == "0.001"


def test_a_deadline_leaves_the_seconds_it_was_given_less_those_gone():
    deadline = Deadline.in_seconds(100.0)
    assert 99.0 < deadline.left_s() <= 100.0


def test_sweep_csv_reads_back_a_field_with_a_carriage_return_unchanged(tmp_path):
    path = tmp_path / "sweep.csv"
    rows = [{"cell_id": "a", "error": "Traceback\r\nline 2"}, {"cell_id": "b", "error": ""}]
    write_table(path, rows, ("cell_id", "error"))
    assert read_table(path) == {
        "a": {"cell_id": "a", "error": "Traceback\r\nline 2"},
        "b": {"cell_id": "b", "error": ""},
    }


@pytest.mark.parametrize(
    ("rates", "sustained", "bisect_rows"),
    [
        # bisection from (0.5, 2.0) to a 50 % bracket around orca-max's knee (near 1.11 req/s):
        # two of the five rounds counted up front, the other three skipped
        ((0.5, 2.0), SustainedOptions(threshold_s=0.1, bisect=5, bracket=0.5), 2),
        # a pair that both pass steps up twice past the grid: cells no round counted up front
        ((0.9, 0.95), SustainedOptions(threshold_s=0.1, bracket=0.1, extend=4), 2),
    ],
    ids=["fewer-than-counted", "more-than-counted"],
)
def test_the_progress_total_ends_at_the_cells_run_however_many_rounds_bisection_took(
    tmp_path, rates, sustained, bisect_rows
):
    """The bar counts `bisect` rounds per group up front; a round beyond them grows the total,
    and those not run count as skipped at the end, so it ends full, never past its total."""
    p = plan(engines=("orca-max",), rates=rates, num_requests=150, kv=(12.0,), sustained=sustained)
    counted = sustained.bisect  # one group, one repeat
    progress = Progress(len(rates) + counted, stream=io.StringIO())
    result = run_sweep(p, tmp_path / "s", progress=progress)
    assert sum(row["role"] == BISECT for row in result.rows) == bisect_rows
    assert progress.ran == len(result.rows) == len(rates) + bisect_rows
    assert progress.total == len(rates) + max(counted, bisect_rows)
    assert progress.skipped == max(0, counted - bisect_rows) and progress.done == progress.total


def test_trace_specs_default_to_sharegpt_drop_repeats_and_refuse_an_empty_one():
    assert parse_traces(None) == ("sharegpt-paper",)
    assert parse_traces([" alpaca-paper ", "alpaca-paper", "sharegpt-paper"]) == (
        "alpaca-paper",
        "sharegpt-paper",
    )
    with pytest.raises(KvbenchError, match=r"^--trace: empty trace spec$"):
        parse_traces(["alpaca-paper", "  "])


def test_a_sweep_without_rates_counts_no_bisection_in_its_progress_total(tmp_path, capsys):
    """A trace at its own timestamps has no rate to bisect: its bar's total is its cells."""
    sustained = SustainedOptions(threshold_s=0.1, bisect=3)
    run_sweep(
        plan(engines=("paged", "orca-max"), rates=(None,), num_requests=20, kv=(12.0,), sustained=sustained),
        tmp_path / "s",
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "] 2/2 cells" in last, last


# --- the sweep's state, its resume, what sweep.csv keeps (kvbench/sweep/run.py) --------------


def test_a_resumed_sweep_reads_each_found_cells_wall_time_from_sweep_csv(tmp_path):
    """A resumed cell's wall time is the one sweep.csv recorded (its folder keeps none): its row
    keeps it, and a deadline judges the next cell of its kind by the longest of them (a short
    baseline of 0.25 s as it is, a 5 s cell found before a 3 s one). A cell whose row sweep.csv
    lacks (a sweep killed between the cell's folder and the table's rewrite) is found all the
    same, with no wall time. Found cells count as resumed, never failed, on the progress line,
    and their rows say ok with no error."""
    p = plan(rates=(1.0, 2.0, 3.0), sustained=SustainedOptions(multiple=4.0))  # a baseline, 3 rates
    out = tmp_path / "s"
    run_sweep(p, out, progress=quiet())
    table = read_table(out / "sweep.csv")
    baseline, one, two, three = table
    columns = (out / "sweep.csv").read_text().splitlines()[0].split(",")
    walls = {baseline: "0.25", one: "5.0", two: "3.0"}  # three's row lost
    write_table(out / "sweep.csv", [{**table[cell], "wall_s": wall} for cell, wall in walls.items()], columns)

    deadline, stream = Deadline.in_seconds(1e6), io.StringIO()
    result = run_sweep(p, out, resume=True, progress=Progress(4, stream=stream), deadline=deadline)
    assert (result.ran, result.resumed, result.failed) == (0, 4, 0)
    assert deadline.timed == {(True, "paged"): 0.25, (False, "paged"): 5.0}
    rows = read_table(out / "sweep.csv")
    assert [(row["wall_s"], row["status"], row["error"]) for row in rows.values()] == [
        ("0.25", "ok", ""), ("5.0", "ok", ""), ("3.0", "ok", ""), ("", "ok", ""),
    ]  # fmt: skip
    assert [row["error"] for row in result.rows] == [""] * 4
    (line,) = stream.getvalue().splitlines()  # printed once, at the end: nothing was run
    assert line.split("] ", 1)[1].startswith("4/4 cells, 4 resumed  ") and line.endswith(f"  {three}")


def test_a_failed_cell_counts_once_and_a_sweep_it_stops_says_how_to_go_on(tmp_path):
    """The progress line counts the failed cells, not every cell run; wall times are kept to the
    millisecond. Without --continue-on-error the first failed cell stops the sweep with a line
    saying how to go on, and the cells not run stay pending: no wall time, no error, no metric."""
    p = plan(engines=("orca-max", "paged"), rates=(1.0, 2.0), kv=(1.0,), continue_on_error=True)
    stream = io.StringIO()
    run_sweep(p, tmp_path / "a", progress=Progress(4, stream=stream))
    assert stream.getvalue().splitlines()[-1].split("] ", 1)[1].startswith("4/4 cells, 2 failed  ")
    walls = [float(row["wall_s"]) for row in read_table(tmp_path / "a" / "sweep.csv").values()]
    assert len(walls) == 4 and all(wall == round(wall, 3) for wall in walls)

    with pytest.raises(KvbenchError) as stopped:
        run_sweep(replace(p, continue_on_error=False), tmp_path / "b", progress=quiet())
    failed, *pending = read_table(tmp_path / "b" / "sweep.csv").values()
    assert str(stopped.value) == (
        f"cell {failed['cell_id']} failed: {failed['error']} (--continue-on-error records failed cells "
        "and goes on; --resume retries them)"
    )
    assert [(r["status"], r["wall_s"], r["error"], r["request_throughput"]) for r in pending] == [
        ("pending", "", "", "")
    ] * 3


def test_a_resume_into_cells_run_with_other_settings_names_the_cell_and_every_setting(tmp_path):
    """The refusal names the finished cell's folder and each setting it ran otherwise, so the
    user sees which flags to give back."""
    p = plan(rates=(1.0,))
    out = tmp_path / "s"
    run_sweep(p, out, progress=quiet())
    other = replace(
        p, base=replace(p.base, chunked_prefill=True, workload=replace(p.base.workload, num_requests=41))
    )
    with pytest.raises(OtherSettings) as refused:
        run_sweep(other, out, resume=True, progress=quiet())
    (folder,) = (out / "cells").iterdir()
    assert str(refused.value) == (
        f"--resume: {folder} ran other settings (chunked_prefill, workload); "
        "use another --out, or --overwrite"
    )


def test_resume_and_overwrite_together_are_refused_before_the_folder_is_made(tmp_path):
    with pytest.raises(KvbenchError) as refused:
        run_sweep(plan(), tmp_path / "s", resume=True, overwrite=True, progress=quiet())
    assert str(refused.value) == "--resume and --overwrite contradict each other: pick one"
    assert not (tmp_path / "s").exists()


def test_a_resume_clears_the_temporary_copies_a_killed_sweep_left(tmp_path):
    """A sweep killed mid-write leaves a table's temporary file beside sweep.csv and a cell's
    temporary folder in cells/: the resume removes both (a file unlinked, a folder with what it
    holds) and leaves a user's own file where it was."""
    p = plan(rates=(1.0, 2.0))
    out = tmp_path / "s"
    run_sweep(p, out, progress=quiet())
    table = temp_path(out / "sweep.csv", "dead")
    table.write_text("cell_id,ro")
    cell = temp_path(
        out / "cells" / "paged__trace-sharegpt-paper__rate-4__bs-16__kv-4__seed-0__rep-0", "dead"
    )
    cell.mkdir()
    (cell / "config.json").write_text("{}")
    (out / "cells" / "notes.txt").write_text("mine")
    assert run_sweep(p, out, resume=True, progress=quiet()).resumed == 2
    assert not [p.name for folder in (out, out / "cells") for p in folder.iterdir() if is_temp(p.name)]
    assert (out / "cells" / "notes.txt").read_text() == "mine"


def test_sweep_json_records_the_command_version_time_and_how_the_cells_ran(tmp_path):
    """sweep.json is the sweep's record: the command, kvbench's version, when (UTC), simulated or
    real, the repeats' seed stride (a resume compares it), whether failed cells were recorded,
    where cells ran and how many were planned (a baseline and two rates)."""
    p = plan(rates=(1.0, 2.0), sustained=SustainedOptions(), continue_on_error=True)
    before = datetime.now(UTC).replace(microsecond=0)
    run_sweep(p, tmp_path / "s", progress=quiet())
    after = datetime.now(UTC)
    saved = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert (saved["command"], saved["kvbench"]) == (sys.argv, __version__)
    created = datetime.fromisoformat(saved["created_utc"])
    assert created.utcoffset() == timedelta(0) and before <= created <= after
    assert (saved["mode"], saved["repeat_seed_stride"], saved["continue_on_error"]) == (
        "simulated",
        REPEAT_SEED_STRIDE,
        True,
    )
    assert (saved["executor"], saved["cells_planned"]) == ("local", 3)


def test_a_real_sweeps_folder_resumed_as_a_simulation_is_refused(tmp_path):
    """sweep.json says a sweep ran real cells (a tiny model on the CPU here): resumed without
    --real, its grid would mix simulated cells with real ones, so it is refused, naming both."""
    axes = Axes(("paged",), ("fixed:prompt=4,output=4",), (1.0,), (16,), (0.002,), (0,), 1)
    base = RunConfig("paged", model="tiny-opt", workload=WorkloadSpec(num_requests=2))
    real = SweepPlan(axes, base, run=CellRun(real=True), sustained=SustainedOptions(threshold_s=1.0))
    out = tmp_path / "s"
    assert run_sweep(real, out, progress=quiet()).rows[0]["mode"] == "real"
    assert json.loads((out / "sweep.json").read_text())["mode"] == "real"
    with pytest.raises(OtherSettings) as refused:
        run_sweep(replace(real, run=CellRun()), out, resume=True, progress=quiet())
    assert str(refused.value) == (
        f"--resume: {out} ran other settings (--real/--simulate: real there, simulated now); "
        "use another --out, or --overwrite"
    )


def test_a_single_repeat_sweep_has_no_mean_or_interval_columns(tmp_path):
    """A mean and 95 % interval over one repeat say nothing: sweep.csv has the cell and metric
    columns only, and so do the rows the sweep returns; with repeats, the six key metrics' follow."""
    one = run_sweep(plan(rates=(1.0,)), tmp_path / "one", progress=quiet())
    header = (tmp_path / "one" / "sweep.csv").read_text().splitlines()[0].split(",")
    columns = [*CELL_COLUMNS, *metric_columns(plan().base)]
    assert header == columns
    assert [key for row in one.rows for key in row if key.endswith(("_mean", "_ci95"))] == []
    run_sweep(plan(rates=(1.0,), repeats=2), tmp_path / "two", progress=quiet())
    header = (tmp_path / "two" / "sweep.csv").read_text().splitlines()[0].split(",")
    assert header == [*columns, *(f"{m}_{stat}" for m in CI_METRICS for stat in ("mean", "ci95"))]


def test_the_default_progress_total_counts_the_bisection_rounds_up_front(tmp_path, capsys):
    """Without a progress given, the sweep's own counts the grid and `bisect` rounds per group:
    orca-max's two rates and two midpoints read 1/4 to 4/4, never past the total."""
    sustained = SustainedOptions(threshold_s=0.05, bisect=2)
    p = plan(engines=("orca-max",), rates=(0.5, 2.0), num_requests=60, kv=(12.0,), sustained=sustained)
    result = run_sweep(p, tmp_path / "s")
    assert [row["role"] for row in result.rows] == [GRID, GRID, BISECT, BISECT]
    counts = re.findall(r"\] (\d+/\d+) cells", capsys.readouterr().err)
    assert counts == ["1/4", "2/4", "3/4", "4/4"]


def test_a_durations_request_count_may_take_a_trace_files_every_row_and_no_more(tmp_path):
    """--duration on a 30-row file (re-timed by Poisson arrivals): 3 req/s x 10 s takes all 30
    rows, 3.1 req/s would need 31 and is refused, naming the count, the file and what to change;
    fewer requests would judge the rate on a shorter overload."""
    trace = tmp_path / "rows.csv"
    trace.write_text(
        "request_id,arrival_s,prompt_len,output_len\n" + "".join(f"{i},{i}.0,{4 + i},2\n" for i in range(30))
    )
    base = RunConfig("paged", workload=WorkloadSpec(arrivals="poisson"))

    def config(rate: float) -> RunConfig:
        return cell_config(base, Cell(GRID, "paged", str(trace), rate, 16, None, 0), duration_s=10.0)

    assert config(3.0).workload.num_requests == 30 and config(0.5).workload.num_requests == 20
    with pytest.raises(KvbenchError) as refused:
        config(3.1)
    assert str(refused.value) == (
        f"--duration 10 at 3.1 req/s: 31 requests (rate x duration, at least 20), and {trace} gives 30; "
        "give a shorter --duration or lower --rates"
    )


def test_a_resume_whose_search_goes_elsewhere_ends_with_its_own_rows_only(tmp_path):
    """Static under 0.1 s/token fails 0.5 req/s in one repeat (bisecting down to 0.25, 0.375)
    and passes it over two (bisecting up to 1.25, 0.875). Resumed with a second repeat, the sweep
    keeps the first search's rows while it runs (a stop would otherwise lose their wall times),
    but its final sweep.csv lists the cells of its own search only, as a sweep run whole does."""
    sustained = SustainedOptions(threshold_s=0.1, bisect=2)
    one, two = (
        plan(
            engines=("static",), rates=(0.5, 2.0), num_requests=60, kv=(12.0,), repeats=r, sustained=sustained
        )
        for r in (1, 2)
    )
    out = tmp_path / "s"
    first = run_sweep(one, out, progress=quiet())
    assert [row["rate"] for row in first.rows if row["role"] == BISECT] == [0.25, 0.375]
    run_sweep(two, out, resume=True, progress=quiet())
    whole = run_sweep(two, tmp_path / "whole", progress=quiet())
    assert [row["rate"] for row in whole.rows if row["role"] == BISECT] == [1.25, 1.25, 0.875, 0.875]
    assert list(read_table(out / "sweep.csv")) == [row["cell_id"] for row in whole.rows]


def test_a_sweep_without_rates_finds_no_sustained_rate(tmp_path):
    """Cells at a trace's own times have no rate to bisect: no sustained.csv, with a latency
    bound given or not (none: no baselines either)."""
    for name, sustained in (("bound", SustainedOptions(threshold_s=0.1)), ("none", SustainedOptions())):
        p = plan(rates=(None,), num_requests=20, sustained=sustained)
        result = run_sweep(p, tmp_path / name, progress=quiet())
        assert result.sustained == [] and [row["role"] for row in result.rows] == [GRID]
        assert not (tmp_path / name / "sustained.csv").exists()


def test_a_previous_sweep_csv_is_read_as_utf8_whatever_the_locale(tmp_path):
    """A resumed sweep reads its previous sweep.csv back as kvbench wrote it, UTF-8, also under a
    C locale without Python's UTF-8 mode (an error cell naming a non-ASCII path would otherwise
    stop the resume, or come back garbled and be written back double-encoded). Read here, and in
    a process under that locale, which runs whatever kvbench this one imports."""
    import os
    import subprocess
    from pathlib import Path

    path = tmp_path / "sweep.csv"
    write_table(path, [{"cell_id": "c", "status": "failed", "error": "/m/caf\u00e9: no such file"}],
                ["cell_id", "status", "error"])  # fmt: skip
    assert read_table(path)["c"]["error"] == "/m/caf\u00e9: no such file"
    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys; from pathlib import Path; from kvbench.sweep.files import read_table;"
        "print(ascii(read_table(Path(sys.argv[1]))['c']['error']))"
    )
    env = {
        **os.environ,
        "LC_ALL": "C",
        "LANG": "C",
        "PYTHONUTF8": "0",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(root)]).strip(os.pathsep),
    }
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout.decode().strip() == ascii("/m/caf\u00e9: no such file")
