"""A sweep's cells, rows and axes, pinned value by value where the sweep's own tests read them
only through a finished sweep (mutation testing, scope `sweep`: docs/MUTATION.md).

What these pin: how long a cell's trace is (requests = rate x duration, at least 20; a
baseline's count; a preset's rate), every column of a sweep.csv row and the saturated share in
it, the one-line refusal of each axis flag (named, even for an empty item), the folder-safe
trace token, and the time a deadline leaves.
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import replace

import pytest

from kvbench.config import RunConfig, Slo
from kvbench.errors import KvbenchError
from kvbench.sweep.deadline import Deadline
from kvbench.sweep.files import cell_row, metric_columns, read_table, write_table
from kvbench.sweep.grid import (
    BASELINE,
    BISECT,
    GRID,
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
from kvbench.sweep.plan import SustainedOptions
from kvbench.sweep.progress import Progress
from kvbench.sweep.run import run_sweep
from tests.test_sweep import plan
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
    loaded = Cell(GRID, "orca-max", "alpaca-paper", 2.01, 32, 6.0, 3)
    config = cell_config(base, loaded, duration_s=10.0)
    assert (config.engine, config.block_size, config.kv_cache_gib) == ("orca-max", 32, 6.0)
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
