"""Rules of kvbench.results' readers (load, shape, checks) that a mutation run of those modules
found unpinned: the whole one-line refusal (file, key or column, line, the value found, cut to 40
characters) where the tests matched a few words of it or met none, what an outside engine's run
may leave null or empty and a simulated run may not, NaN accepted exactly where kvbench writes
it, a TPOT missing for a two-token output, the line a broken CSV line is reported at, which
folders `runs_below` finds, the labels `label_runs` gives folders that share a name, `as_runs`
and `settings`, a sweep's `column` and `strings`, and a reproduction's figure tables.

Every run folder is a tiny simulated run that kvbench's own writer (`simulate` + `write_result`)
puts in tmp_path, then damaged by hand; every expected message is written out whole.
docs/MUTATION.md says why such tests exist; the mutants they kill, and those that are
equivalent, are in results/mutation/results-load/.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvbench
from kvbench.config import RunConfig
from kvbench.results.load import Run, as_runs, label_runs, load_run, read_csv, runs_below, settings
from kvbench.simulate import simulate, write_result
from tests.support import refusal
from workloads.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    """4 ShareGPT requests on paged: 4 completed, 3 of them preempted, every latency defined."""
    folder = tmp_path_factory.mktemp("simulated") / "paged"
    workload = WorkloadSpec("sharegpt-paper", num_requests=4, rate=4.0, seed=0)
    write_result(simulate(RunConfig(engine="paged", workload=workload, kv_cache_gib=1.0)), folder)
    return folder


@pytest.fixture
def run(simulated, tmp_path) -> Path:
    """A fresh copy of the simulated run, to damage."""
    return Path(shutil.copytree(simulated, tmp_path / "paged"))


def edit_json(path: Path, change) -> Path:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))  # NaN as Python's json writes it
    return path


def set_keys(path: Path, **values) -> Path:
    return edit_json(path, lambda data: data.update(values))


def edit_rows(path: Path, change) -> Path:
    """Rewrite the CSV at `path` with `change(rows)` applied to its rows (dicts of strings)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header, rows = list(reader.fieldnames or ()), list(reader)
    changed = change(rows)
    rows = rows if changed is None else changed
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, header)
        writer.writeheader()
        writer.writerows(rows)
    return path


def set_cell(path: Path, row: int, column: str, value: str) -> Path:
    def change(rows):
        rows[row][column] = value

    return edit_rows(path, change)


def set_column(path: Path, column: str, value: str) -> Path:
    def change(rows):
        for row in rows:
            row[column] = value

    return edit_rows(path, change)


def external(run: Path) -> Path:
    """The run as an outside engine's: `external: true`, what it does not observe null."""
    return set_keys(
        run / "summary.json", external=True, num_steps=None, num_slots=None, kv_budget_source=None
    )


# ---- summary.json: types (shape) and values (checks) -------------------------------------------


SUMMARY_REFUSED = {  # name: (keys set in summary.json, the refusal after "<path>: ")
    "text key a number": ({"dtype": 5}, "'dtype' must be a string, got 5"),
    "shares not numbers": (
        {"occupancy": {"free": "all"}},
        '\'occupancy\' must be an object of numbers, got {"free": "all"}',
    ),
    "percentiles not numbers": (
        {"percentiles": [50, "p90"]},
        "'percentiles' must be a list of numbers, got [50, \"p90\"]",
    ),
    "metric a word": ({"makespan_s": "fast"}, "'makespan_s' must be a number, got \"fast\""),
    "listed metric a word": ({"goodput": "lots"}, "'goodput' must be a number, got \"lots\""),
    "num_ key a word": ({"num_gpus": "two"}, "'num_gpus' must be a number, got \"two\""),
    "long value cut to 40": (
        {"dtype": list(range(30))},
        "'dtype' must be a string, got " + json.dumps(list(range(30)))[:40],
    ),
    "num_ key negative": ({"num_gpus": -1}, "'num_gpus' must be a whole number >= 0, got -1"),
    "optional count null": ({"good_requests": None}, "'good_requests' must be a whole number >= 0, got null"),
    "count cut to 40": (
        {"tensor_parallel": list(range(30))},
        "'tensor_parallel' must be a whole number >= 0, got " + json.dumps(list(range(30)))[:40],
    ),
    "preempted above completed": (
        {"preempted_requests": 5},
        "'preempted_requests' is 5, more than 'completed' (4)",
    ),
    "good above completed": ({"good_requests": 5}, "'good_requests' is 5, more than 'completed' (4)"),
    "NaN in a list": ({"extra": [1.0, math.nan]}, "'extra[1]' must be a finite number, got NaN"),
    "normalized latency NaN": (
        {"normalized_latency_s": math.nan},
        "'normalized_latency_s' must be a finite number, got NaN",
    ),
    "null when not external": ({"num_slots": None}, "'num_slots' is null: kvbench writes a value there"),
    "null when external is false": (
        {"external": False, "num_slots": None},
        "'num_slots' is null: kvbench writes a value there",
    ),
}


@pytest.mark.parametrize("case", SUMMARY_REFUSED)
def test_a_wrong_summary_value_is_refused_naming_the_key_and_the_value(run, case):
    """Each type or value kvbench never writes is one line: the summary.json, the key, what it
    must be and the value found (its JSON, cut to 40 characters); keys after one the shape check
    does not know (`comment`, first here) are checked too."""
    values, message = SUMMARY_REFUSED[case]
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({"comment": "edited by hand", **summary, **values}))
    assert refusal(load_run, run) == f"{run / 'summary.json'}: {message}"
    assert refusal(kvbench.load_runs, run) == f"{run / 'summary.json'}: {message}"


def test_a_whole_distribution_of_nan_is_refused_where_requests_completed(run):
    """TTFT is defined for every completed request: all of its keys NaN with 4 completed is a
    damaged file, not a run where nothing completed."""
    summary = json.loads((run / "summary.json").read_text())
    set_keys(run / "summary.json", **{key: math.nan for key in summary if key.endswith("_ttft_s")})
    assert refusal(load_run, run) == f"{run / 'summary.json'}: 'mean_ttft_s' must be a finite number, got NaN"


SUMMARY_ACCEPTED = {  # name: keys set in summary.json that kvbench writes (or readers must pass)
    "a text key null": {"device": None},
    "a metric null": {"energy_j": None},
    "a key no check knows": {"comment": "edited by hand"},
    "energy NaN": {"energy_j": math.nan},
    "an NVML key NaN": {"nvml_power_w": math.nan},
    "preempted equal to completed": {"preempted_requests": 4},
    "good equal to completed": {"good_requests": 4},
}


@pytest.mark.parametrize("case", SUMMARY_ACCEPTED)
def test_a_summary_value_kvbench_writes_loads(run, case):
    """null where a reader takes it as not measured, keys no check knows, NaN where a collector
    could not read its counter, a count equal to `completed`: the run loads as written."""
    set_keys(run / "summary.json", **SUMMARY_ACCEPTED[case])
    loaded = load_run(run)
    for key, value in SUMMARY_ACCEPTED[case].items():
        assert loaded.summary[key] == value or (value != value and math.isnan(loaded.summary[key]))


def test_a_run_where_nothing_completed_loads_with_its_nan_latencies(run):
    """No request completed: every latency statistic, the normalized latency and the goodput
    fraction are NaN (kvbench writes them so) and requests.csv has only its header."""

    def nothing_completed(summary):
        for key in summary:
            if key.endswith(("_ttft_s", "_tpot_s", "_itl_s", "_e2el_s", "_queueing_s")):
                summary[key] = math.nan
        summary.update(
            completed=0, preempted_requests=0, normalized_latency_s=math.nan, goodput_fraction=math.nan
        )

    edit_json(run / "summary.json", nothing_completed)
    edit_rows(run / "requests.csv", lambda rows: [])
    loaded = load_run(run)
    assert loaded.summary["completed"] == 0 and math.isnan(loaded.summary["p99_ttft_s"])
    assert math.isnan(loaded.summary["normalized_latency_s"]) and len(loaded.requests) == 0


def test_an_outside_engines_run_may_leave_unobserved_values_null_and_columns_empty(run):
    """`external: true` (a run of vLLM or SGLang observed from outside): num_steps, num_slots and
    kv_budget_source null, and the step and request count columns it does not observe empty; a
    column it does fill is still checked. The same folder without `external` is refused."""
    external(run)
    set_column(run / "steps.csv", "swapped_blocks", "")
    set_column(run / "requests.csv", "num_preemptions", "")
    loaded = load_run(run)
    assert loaded.summary["num_slots"] is None and loaded.steps["swapped_blocks"].isna().all()
    assert loaded.requests["num_preemptions"].isna().all()
    set_cell(run / "requests.csv", 0, "prefix_hit_tokens", "1.5")
    assert refusal(load_run, run) == (
        f"{run / 'requests.csv'}: column 'prefix_hit_tokens', line 2: '1.5' is not a whole number"
    )
    set_keys(run / "summary.json", external=False)
    assert (
        refusal(load_run, run)
        == f"{run / 'summary.json'}: 'kv_budget_source' is null: kvbench writes a value there"
    )


def test_empty_count_columns_are_refused_in_a_simulated_run(run):
    """A run kvbench simulated fills every count column: one left empty is a damaged file."""
    set_column(run / "steps.csv", "swapped_blocks", "")
    assert refusal(load_run, run) == (
        f"{run / 'steps.csv'}: column 'swapped_blocks', line 2: an empty cell (or nan) is not a whole number"
    )
    set_column(run / "steps.csv", "swapped_blocks", "0")
    set_column(run / "requests.csv", "prefix_hit_tokens", "")
    assert refusal(load_run, run) == (
        f"{run / 'requests.csv'}: column 'prefix_hit_tokens', line 2: "
        "an empty cell (or nan) is not a whole number"
    )


# ---- steps.csv and requests.csv ----------------------------------------------------------------


TABLE_REFUSED = {  # name: (damage, the file, the refusal after "<path>: ")
    "step duration empty": (
        lambda run: set_cell(run / "steps.csv", 1, "duration_s", ""),
        "steps.csv",
        "column 'duration_s', line 3: an empty cell (or nan) is not a finite number",
    ),
    "step start inf": (
        lambda run: set_cell(run / "steps.csv", 0, "start_s", "inf"),
        "steps.csv",
        "column 'start_s', line 2: 'inf' is not a finite number",
    ),
    "step count not whole": (
        lambda run: set_cell(run / "steps.csv", 2, "batch_size", "1.5"),
        "steps.csv",
        "column 'batch_size', line 4: '1.5' is not a whole number",
    ),
    "steps without kind": (
        lambda run: _drop_column(run / "steps.csv", "kind"),
        "steps.csv",
        "no 'kind' column: not a steps table kvbench wrote",
    ),
    "steps short of num_steps": (
        lambda run: edit_rows(run / "steps.csv", lambda rows: rows[:3]),
        "steps.csv",
        "3 rows of 3 steps, but summary.json's 'num_steps' is 1703",
    ),
    "steps header only": (
        lambda run: edit_rows(run / "steps.csv", lambda rows: []),
        "steps.csv",
        "no rows, but summary.json's 'num_steps' is 1703",
    ),
    "requests without ttft": (
        lambda run: _drop_column(run / "requests.csv", "ttft_s"),
        "requests.csv",
        "no 'ttft_s' column: not a requests table kvbench wrote",
    ),
    "request arrival empty": (
        lambda run: set_cell(run / "requests.csv", 2, "arrival_s", ""),
        "requests.csv",
        "column 'arrival_s', line 4: an empty cell (or nan) is not a finite number",
    ),
    "two-token output without TPOT": (
        lambda run: set_cell(set_cell(run / "requests.csv", 1, "output_len", "2"), 1, "tpot_s", ""),
        "requests.csv",
        "column 'tpot_s', line 3: an empty cell (or nan) is not a finite number "
        "(the output has more than one token)",
    ),
    "requests short of completed": (
        lambda run: edit_rows(run / "requests.csv", lambda rows: rows[:3]),
        "requests.csv",
        "3 rows, but summary.json's 'completed' is 4",
    ),
    "requests header only": (
        lambda run: edit_rows(run / "requests.csv", lambda rows: []),
        "requests.csv",
        "no rows, but summary.json's 'completed' is 4",
    ),
}


def _drop_column(path: Path, column: str) -> Path:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    index = rows[0].index(column)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([cell for i, cell in enumerate(row) if i != index] for row in rows)
    return path


@pytest.mark.parametrize("case", TABLE_REFUSED)
def test_a_damaged_table_is_refused_naming_the_column_line_and_cell(run, case):
    """The whole line: the table, the column and line (or the rows against summary.json's count)
    and the cell as written, or "an empty cell (or nan)"."""
    damage, name, message = TABLE_REFUSED[case]
    damage(run)
    assert refusal(load_run, run) == f"{run / name}: {message}"


def test_a_one_token_output_may_have_no_tpot(run):
    """TPOT is undefined for a one-token output (kvbench writes NaN): that row loads."""
    set_cell(set_cell(run / "requests.csv", 1, "output_len", "1"), 1, "tpot_s", "nan")
    assert math.isnan(load_run(run).requests["tpot_s"][1])


def test_a_run_without_its_tables_loads_with_empty_ones(run):
    """A sweep may leave steps.csv and requests.csv out: the run loads with empty tables."""
    (run / "steps.csv").unlink()
    (run / "requests.csv").unlink()
    loaded = load_run(run)
    assert loaded.steps.empty and loaded.requests.empty and loaded.summary["completed"] == 4


def test_a_folder_without_a_summary_is_not_a_results_folder(tmp_path):
    """No summary.json (or an empty one): the one line says what the folder is not."""
    assert (
        refusal(load_run, tmp_path)
        == f"{tmp_path}: not a kvbench results folder (no summary.json or sweep.csv)"
    )
    assert refusal(kvbench.load_runs, tmp_path) == (
        f"{tmp_path}: not a kvbench results folder (no summary.json or sweep.csv)"
    )


# ---- config.json -------------------------------------------------------------------------------


CONFIG_REFUSED = {  # name: (change to config.json, the refusal after "<path>: ")
    "rate a word": (
        lambda config: config["workload"].update(rate="fast"),
        "'rate' must be a number, got \"fast\"",
    ),
    "kv_cache_gib a word": (
        lambda config: config.update(kv_cache_gib="2"),
        "'kv_cache_gib' must be a number, got \"2\"",
    ),
    "block size cut to 40": (
        lambda config: config.update(block_size="x" * 60),
        "'block_size' must be a number, got " + json.dumps("x" * 60)[:40],
    ),
    "workload not an object": (
        lambda config: config.update(workload=list(range(30))),
        "'workload' must be an object, got " + json.dumps(list(range(30)))[:40],
    ),
}


@pytest.mark.parametrize("case", CONFIG_REFUSED)
def test_a_wrong_config_setting_is_refused_naming_the_key_and_the_value(run, case):
    """rate (in the workload), block_size and kv_cache_gib must be numbers, the workload an
    object; the line names config.json, the key and the value (cut to 40 characters)."""
    change, message = CONFIG_REFUSED[case]
    edit_json(run / "config.json", change)
    assert refusal(load_run, run) == f"{run / 'config.json'}: {message}"


def test_a_config_without_a_workload_loads(run):
    """An older config.json may lack the workload: the run loads, with no rate."""
    edit_json(run / "config.json", lambda config: config.pop("workload"))
    loaded = load_run(run)
    assert loaded.rate is None and "workload" not in loaded.config


# ---- CSV files: empty tables, broken lines -----------------------------------------------------


def test_a_header_only_table_has_float_columns(tmp_path):
    """A table with a header and no rows reads as empty float64 columns, not object ones."""
    path = tmp_path / "steps.csv"
    path.write_text("step,duration_s,kind\n")
    frame = read_csv(path, text=("kind",))
    assert list(frame.columns) == ["step", "duration_s", "kind"] and len(frame) == 0
    assert frame["step"].dtype == np.float64 and frame["duration_s"].dtype == np.float64


def test_a_line_csv_cannot_read_is_refused_naming_that_line(tmp_path):
    """A cell past csv's field limit (a runaway quote reads the rest of the file as one cell):
    the line it is on is named, on the first data line and after it."""
    path = tmp_path / "steps.csv"
    huge = "x" * 140_000
    path.write_text(f"step,kind\n0,{huge}\n")
    assert refusal(read_csv, path) == f"{path}: line 2: not CSV (field larger than field limit (131072))"
    path.write_text(f"step,kind\n0,decode\n1,{huge}\n")
    assert refusal(read_csv, path) == f"{path}: line 3: not CSV (field larger than field limit (131072))"


# ---- folders: runs_below, label_runs, as_runs, load_runs, settings -------------------------------


def test_runs_below_finds_run_folders_and_skips_hidden_and_partial_ones(simulated, tmp_path):
    """A run folder needs summary.json and config.json (and steps.csv where `steps`); a folder
    with a summary.json only is not one, nor is one inside a hidden folder (a run being written)."""
    shutil.copytree(simulated, tmp_path / "a")
    shutil.copytree(simulated, tmp_path / "b")
    (tmp_path / "b" / "steps.csv").unlink()
    shutil.copytree(simulated, tmp_path / ".writing" / "c")
    (tmp_path / "half").mkdir()
    shutil.copy(simulated / "summary.json", tmp_path / "half")
    assert runs_below(tmp_path) == [tmp_path / "a", tmp_path / "b"]
    assert runs_below(tmp_path, steps=True) == [tmp_path / "a"]
    assert runs_below(tmp_path / "b") == [tmp_path / "b"] and runs_below(tmp_path / "b", steps=True) == []
    assert runs_below(tmp_path / "a", steps=True) == [tmp_path / "a"]


def test_label_runs_lengthens_only_as_far_as_names_collide(tmp_path):
    """Folder names where they differ; parents added one at a time until every label differs;
    a folder named twice keeps its whole path."""
    a, b, c = tmp_path / "a" / "x" / "run", tmp_path / "b" / "x" / "run", tmp_path / "c" / "run"
    assert label_runs([tmp_path / "one", tmp_path / "two"]) == ["one", "two"]
    assert label_runs([tmp_path / "p" / "run", tmp_path / "q" / "run"]) == ["p/run", "q/run"]
    assert label_runs([a, b, c]) == ["a/x/run", "b/x/run", f"{tmp_path.name}/c/run"]
    whole = "/".join(a.resolve().parts)
    assert label_runs([a, a]) == [whole, whole]
    assert label_runs([]) == []


def test_as_runs_loads_paths_with_their_labels_and_keeps_loaded_runs(simulated, tmp_path):
    """Paths are loaded, labelled among the paths given; a Run passes through as it is."""
    first, second = tmp_path / "p" / "run", tmp_path / "q" / "run"
    shutil.copytree(simulated, first)
    shutil.copytree(simulated, second)
    loaded = load_run(simulated, "mine")
    runs = as_runs([loaded, first, str(second)])
    assert runs[0] is loaded and all(isinstance(r, Run) for r in runs)
    assert [r.label for r in runs] == ["mine", "p/run", "q/run"]
    assert [r.path for r in runs[1:]] == [first, second] and runs[1].summary == loaded.summary


def test_load_runs_refuses_a_folder_without_runs_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    assert refusal(kvbench.load_runs, [tmp_path / "empty"]) == (
        f"{tmp_path / 'empty'}: not a kvbench results folder (no summary.json or sweep.csv)"
    )


def test_settings_name_the_workload_source_trace_and_leave_out_nested_values():
    """The workload's `source` is the row's `trace`; lists and objects are left out, and so is a
    null workload (read as none); the comparison's settings come first."""
    workload = {"source": "sharegpt-paper", "rate": 2.0, "prefix": None, "window": [0, 1]}
    config = {
        "seed": 1,
        "engine": "paged",
        "slo": {"ttft_s": 1.0},
        "percentiles": [50.0],
        "workload": workload,
    }
    row = settings(config)
    assert row == {"engine": "paged", "trace": "sharegpt-paper", "rate": 2.0, "seed": 1, "prefix": None}
    assert list(row) == ["engine", "trace", "rate", "seed", "prefix"]
    assert settings({"engine": "paged", "workload": None}) == {"engine": "paged"}  # no workload: no column


# ---- sweeps ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "kvbench", "sweep", "--engines", "paged,orca-max", "--rates", "2,8",
         "--kv-cache-gib", "1", "--num-requests", "4", "--model", "opt-125m", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_sweeps_columns_and_strings_read_as_written(swept, tmp_path):
    """`column`: floats, or the default for a column the sweep did not write; `strings`: numbers
    printed plainly, words as written, the default where a cell is empty or the column absent;
    an empty text column (no cell failed) is text, not NaN."""
    sweep = kvbench.load_sweep(swept)
    assert sweep.path == swept and sweep.num_cells == 6
    assert sweep.folders == tuple(sorted((swept / "cells").iterdir()))
    assert sweep.cells["error"].tolist() == [""] * 6
    rates = sweep.column("rate")
    assert rates.dtype == np.float64 and rates.tolist() == [0.001, 0.001, 2.0, 8.0, 2.0, 8.0]
    seeds = sweep.column("seed")  # written as integers, read as floats
    assert seeds.dtype == np.float64 and seeds.tolist() == [0.0] * 6
    missing = sweep.column("no_such", default=-1.0)
    assert missing.dtype == np.float64 and missing.tolist() == [-1.0] * 6
    assert math.isnan(sweep.column("no_such")[0])
    printed = sweep.strings("rate")
    assert printed.dtype == object and printed.tolist() == ["0.001", "0.001", "2", "8", "2", "8"]
    errors = sweep.strings("error", default="none")
    assert errors.dtype == object and errors.tolist() == ["none"] * 6
    assert sweep.strings("error").tolist() == [""] * 6  # the default default: empty
    engines = sweep.strings("engine")
    assert engines.dtype == object and engines.tolist() == [
        "paged",
        "orca-max",
        "paged",
        "paged",
        "orca-max",
        "orca-max",
    ]
    absent = sweep.strings("no_such", default="?")
    assert absent.dtype == object and absent.tolist() == ["?"] * 6
    cut = Path(shutil.copytree(swept, tmp_path / "cut", ignore=shutil.ignore_patterns("cells")))
    edit_rows(cut / "sweep.csv", lambda rows: [rows[0], dict(rows[1], rate="", error="failed")])
    cut_sweep = kvbench.load_sweep(cut)
    assert cut_sweep.folders == () and cut_sweep.strings("rate", default="-").tolist() == ["0.001", "-"]
    assert cut_sweep.strings("error", default="ok").tolist() == ["ok", "failed"]


def test_a_table_cut_inside_a_quoted_cell_is_refused_naming_it(swept, tmp_path):
    """A cell holding a comma is quoted (sustained.csv's `how` and `threshold_source`): a write
    killed inside the last one leaves a quote never closed, which csv reads to the end of the file
    and pandas refuses; the line names the file and what pandas found."""
    sweep = Path(shutil.copytree(swept, tmp_path / "sweep", ignore=shutil.ignore_patterns("cells")))
    path = edit_rows(sweep / "sustained.csv", lambda rows: [dict(rows[0], how="under 2, at every rate")])
    text = path.read_text()
    path.write_text(text[: text.index('"under 2') + 8])
    assert refusal(kvbench.load_sweep, sweep) == (
        f"{path}: not CSV (Error tokenizing data. C error: EOF inside string starting at row 1)"
    )


def test_a_sweep_without_its_table_or_columns_is_refused_naming_it(tmp_path):
    assert refusal(kvbench.load_sweep, tmp_path) == (
        f"{tmp_path}: not a kvbench results folder (no summary.json or sweep.csv)"
    )
    (tmp_path / "sweep.csv").write_text("rate,wall_s\n2,1.0\n")
    assert refusal(kvbench.load_sweep, tmp_path) == (
        f"{tmp_path / 'sweep.csv'}: no engine column: not a sweep kvbench wrote"
    )
    (tmp_path / "sweep.csv").write_text("engine,rate\npaged,2\n")
    assert refusal(kvbench.load_sweep, tmp_path) == (
        f"{tmp_path / 'sweep.csv'}: no status column: not a sweep kvbench wrote"
    )


# ---- a reproduction's figure tables -------------------------------------------------------------

FIGURE_HEADER = "figure,engine,workload,metric,kvbench,paper,ratio"


def test_figure_tables_load_as_one_table_of_floats_in_figure_order(tmp_path):
    """Every `<figure>/figure.csv` below the folder, in name order (a hidden one skipped), one
    row per number, indexed 0..n-1; kvbench, paper and ratio floats even where a figure's are
    all whole numbers; the text columns text even where they look like numbers."""
    (tmp_path / "fig2").mkdir()
    (tmp_path / "fig2" / "figure.csv").write_text(f"{FIGURE_HEADER}\nfig2,paged,1024,batch,3,4,0.75\n")
    (tmp_path / "fig10").mkdir()
    (tmp_path / "fig10" / "figure.csv").write_text(
        f"{FIGURE_HEADER}\nfig10,paged,sharegpt,rate,2,,\nfig10,orca-max,sharegpt,rate,1,2,0.5\n"
    )
    (tmp_path / ".fig3").mkdir()
    (tmp_path / ".fig3" / "figure.csv").write_text(f"{FIGURE_HEADER}\nfig3,paged,x,y,1,1,1\n")
    frame = kvbench.load_figures(tmp_path)
    assert frame.index.tolist() == [0, 1, 2]
    assert frame["figure"].tolist() == ["fig10", "fig10", "fig2"]
    assert frame["workload"].tolist() == ["sharegpt", "sharegpt", "1024"]
    for name in ("kvbench", "paper", "ratio"):
        assert frame[name].dtype == np.float64, name
    assert frame["kvbench"].tolist() == [2.0, 1.0, 3.0]
    assert np.array_equal(frame["paper"].to_numpy(), [math.nan, 2.0, 4.0], equal_nan=True)
    (tmp_path / "fig2" / "figure.csv").write_text(
        "figure,engine,workload,metric,kvbench,ratio\nfig2,paged,a,b,lots,1\n"
    )
    assert refusal(kvbench.load_figures, tmp_path) == (
        f"{tmp_path / 'fig2' / 'figure.csv'}: column 'kvbench', line 2: 'lots' is not a number"
    )
    (tmp_path / "fig2" / "figure.csv").write_text("figure,engine,workload,metric,ratio\nfig2,paged,a,b,1\n")
    assert refusal(kvbench.load_figures, tmp_path) == (
        f"{tmp_path / 'fig2' / 'figure.csv'}: no kvbench column: not a figure table kvbench wrote"
    )
    (tmp_path / "fig2" / "figure.csv").write_text("figure,engine,workload,metric,kvbench\nfig2,paged,a,b,1\n")
    assert refusal(kvbench.load_figures, tmp_path) == (
        f"{tmp_path / 'fig2' / 'figure.csv'}: no paper column: not a figure table kvbench wrote"
    )
    (tmp_path / "fig2" / "figure.csv").write_text(
        "figure,engine,workload,metric,kvbench,paper\nfig2,paged,a,b,1,2\n"
    )
    without_ratio = kvbench.load_figures(tmp_path)  # ratio is optional
    assert without_ratio["kvbench"].tolist() == [2.0, 1.0, 1.0]
    (tmp_path / "whole" / "fig1").mkdir(parents=True)  # every number whole: still floats
    (tmp_path / "whole" / "fig1" / "figure.csv").write_text(f"{FIGURE_HEADER}\nfig1,paged,a,b,1,2,1\n")
    whole = kvbench.load_figures(tmp_path / "whole")
    assert [whole[name].dtype for name in ("kvbench", "paper", "ratio")] == [np.float64] * 3
    assert refusal(kvbench.load_figures, tmp_path / "fig2") == (
        f"{tmp_path / 'fig2'}: not a kvbench reproduce folder (no <figure>/figure.csv)"
    )
