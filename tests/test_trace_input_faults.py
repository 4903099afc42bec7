"""Trace files that were once read into a silently wrong trace, or crashed a command: each is now
refused in one line naming the file, the line (or Parquet row) and the column, with the value as
the file wrote it; `kvbench` itself exits with code 2.

Files are written into `tmp_path` and read through `read_trace` or the CLI in this process.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.support import error_of, write
from tests.test_bad_flags import assert_one_error, kvbench
from workloads.columns import MAX_ARRIVAL_S
from workloads.tracefile import read_trace

KVBENCH_CSV = "request_id,arrival_s,prompt_len,output_len"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens"


def mooncake(timestamp, input_length: int = 600) -> str:
    """One Mooncake row; `timestamp` as JSON writes it (NaN included)."""
    row = {"timestamp": timestamp, "input_length": input_length, "output_length": 4, "hash_ids": [1, 2]}
    return json.dumps(row)


@pytest.fixture
def pa():
    return pytest.importorskip("pyarrow")


def parquet_with(pa, tmp_path: Path, **extra) -> Path:
    import pyarrow.parquet

    columns = {"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_len": [2, 2], "output_len": [1, 1]}
    path = tmp_path / "t.parquet"
    pyarrow.parquet.write_table(pa.table({**columns, **extra}), path)
    return path


# arrival times past MAX_ARRIVAL_S


@pytest.mark.parametrize(
    ("command", "late", "shown"),
    [
        (("trace", "stats"), "1700000000000000", "1700000000000000"),  # 1.7e15 s: steps vanish
        (("trace", "stats"), "1e20", "1e+20"),  # once a RuntimeWarning from the 1 s buckets
        (("trace", "plot"), "1.7e308", "1.7e+308"),  # once a traceback from numpy's arange
    ],
)
def test_arrivals_past_the_bound_are_one_error(tmp_path, capsys, monkeypatch, command, late, shown):
    path = write(tmp_path / "far.csv", KVBENCH_CSV, "0,0,10,10", f"1,{late},10,10")
    extra = ("--out", str(tmp_path / "plot.png")) if command[1] == "plot" else ()
    code, out, err = kvbench(capsys, monkeypatch, *command, str(path), *extra)
    line = assert_one_error(code, out, err, str(path), "line 3, column arrival_s", "1,000,000,000 s")
    assert line.endswith(f"got {shown}")
    assert not (tmp_path / "plot.png").exists()


def test_simulate_refuses_a_trace_whose_steps_would_round_to_zero(tmp_path, capsys, monkeypatch):
    """At 1.7e15 s float64 resolves 0.25 s: the run once reported 0-second latencies."""
    path = write(tmp_path / "far.csv", KVBENCH_CSV, "0,0,10,10", "1,1700000000000000,10,10")
    args = ("simulate", "--engine", "paged", "--out", str(tmp_path / "run"), "--trace", str(path))
    assert_one_error(*kvbench(capsys, monkeypatch, *args), str(path), "line 3, column arrival_s")
    assert not (tmp_path / "run").exists()


def test_the_last_arrival_allowed_still_resolves_a_step(tmp_path, capsys, monkeypatch):
    """Just under the bound, a request's latencies match the same request's at t = 0 to a
    microsecond: the bound keeps the simulator's clock exact enough to add a step."""
    late = MAX_ARRIVAL_S - 0.5
    path = write(tmp_path / "edge.csv", KVBENCH_CSV, "0,0,10,10", f"1,{late!r},10,10")
    run = tmp_path / "run"
    code, _, err = kvbench(capsys, monkeypatch, "simulate", "--engine", "paged", "--out", str(run),
                             "--trace", str(path))  # fmt: skip
    assert code == 0, err
    with open(run / "requests.csv", newline="", encoding="utf-8") as f:
        early, last = csv.DictReader(f)
    assert float(last["arrival_s"]) == late
    for metric in ("ttft_s", "tpot_s", "e2el_s"):
        assert float(early[metric]) > 0
        assert float(last[metric]) == pytest.approx(float(early[metric]), abs=1e-6)
    one_more = write(tmp_path / "over.csv", KVBENCH_CSV, "0,0,10,10", f"1,{MAX_ARRIVAL_S + 1},10,10")
    assert "line 3, column arrival_s: must be at most 1,000,000,000 s" in error_of(one_more)


def test_drawn_or_stretched_arrivals_past_the_bound_name_the_flag_that_put_them_there(
    tmp_path, capsys, monkeypatch
):
    """A rate's expected span may pass the flag check while its drawn arrivals land past the
    bound (seed 1 here), and --time-scale may stretch a file's times past it: each is one line
    naming that flag, not a line of a file the user never wrote."""
    made = ("trace", "make", "sharegpt-paper", "--rate", "1e-6", "--num-requests", "1000")
    assert kvbench(capsys, monkeypatch, *made, "--seed", "0", "--out", str(tmp_path / "s0.jsonl"))[0] == 0
    drawn = kvbench(capsys, monkeypatch, *made, "--seed", "1", "--out", str(tmp_path / "s1.jsonl"))
    assert_one_error(
        *drawn, "--rate 1e-06 with 1000 requests: arrivals reach", "must be at most 1,000,000,000 s"
    )
    path = write(tmp_path / "t.csv", KVBENCH_CSV, "0,0,10,10", f"1,{MAX_ARRIVAL_S},10,10")
    args = ("simulate", "--engine", "paged", "--trace", str(path), "--time-scale", "0.001")
    stretched = kvbench(capsys, monkeypatch, *args, "--out", str(tmp_path / "run"))
    assert_one_error(*stretched, f"--time-scale 0.001: {path} replayed: arrivals reach 1,000,000,000,000 s")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0.jsonl", "t.csv"]


def test_jsonl_and_parquet_arrivals_past_the_bound_are_refused(tmp_path, pa):
    jsonl = tmp_path / "far.jsonl"
    header = json.dumps({"format": "kvbench-trace", "version": 1})
    write(jsonl, header, json.dumps({"request_id": 0, "arrival_s": 2e9, "prompt_len": 3, "output_len": 4}))
    assert "line 2, column arrival_s: must be at most" in error_of(jsonl)
    parquet = parquet_with(pa, tmp_path, arrival_s=[0.0, 3e9])
    assert "row 2, column arrival_s: must be at most" in error_of(parquet)


# Azure TIMESTAMP cells that numpy reads as something else


@pytest.mark.parametrize(
    ("cell", "why"),
    [
        ("1700000000", "an epoch second, once read as the year 1,700,000,000"),
        ("2023", "a bare year, once read as 2023-01-01"),
        ("2023-11-16", "a date without a time"),
        ("now", "numpy's current time"),
        ("0001-01-01 00:00:00", "before 1678: int64 nanoseconds once wrapped it to 1754"),
        ("2262-04-12 00:00:00", "after 2261: once wrapped to 1677"),
    ],
)
def test_azure_timestamps_must_be_dates_and_times(tmp_path, cell, why):
    path = write(tmp_path / "az.csv", AZURE, "2023-11-16 18:15:46.6805900,374,4", f"{cell},374,4")
    message = error_of(path)
    assert f"line 3, column TIMESTAMP: not a date and time, got {cell!r}" in message, why
    assert "YYYY-MM-DD HH:MM:SS.fraction" in message


def test_azure_epoch_seconds_in_every_row_are_refused_on_the_first(tmp_path):
    """The whole column as epoch seconds once loaded as a 31,622,400 s (one leap year) trace."""
    path = write(tmp_path / "epoch.csv", AZURE, "1700000000,374,4", "1700000001,374,4")
    assert "line 2, column TIMESTAMP: not a date and time, got '1700000000'" in error_of(path)


def test_azure_timestamps_in_iso_forms_still_load(tmp_path):
    rows = ["2023-11-16T18:15:46Z,5,6", " 2023-11-16 18:15:47.5 ,7,8", "2023-11-16 18:16,9,1"]
    trace = read_trace(write(tmp_path / "iso.csv", AZURE, *rows))
    assert [r.arrival_s for r in trace.requests] == [0.0, 1.5, 14.0]


# Azure and Mooncake stamps checked as written, before they are shifted to start at 0


def test_mooncake_nan_timestamp_is_named_on_its_own_line(tmp_path):
    path = write(tmp_path / "nan.jsonl", mooncake(0), mooncake(1), mooncake(float("nan")))
    message = error_of(path)
    assert "line 3, column timestamp: must be a finite time, got nan" in message


def test_mooncake_infinite_timestamp_on_the_first_line(tmp_path):
    path = write(tmp_path / "inf.jsonl", mooncake(float("inf")), mooncake(1))
    assert "line 1, column timestamp: must be a finite time, got inf" in error_of(path)


def test_mooncake_decrease_shows_the_timestamp_as_written(tmp_path):
    path = write(tmp_path / "back.jsonl", mooncake(1000), mooncake(1020), mooncake(1019))
    message = error_of(path)
    assert message.endswith("line 3, column timestamp: arrival times must not decrease, got 1019")


def test_azure_decrease_shows_the_cell_as_written(tmp_path):
    rows = ["2023-11-16 18:15:46.0,1,1", "2023-11-16 18:15:47.0,1,1", "2023-11-16 18:15:45.0,1,1"]
    message = error_of(write(tmp_path / "back.csv", AZURE, *rows))
    assert message.endswith(
        "line 4, column TIMESTAMP: arrival times must not decrease, got '2023-11-16 18:15:45.0'"
    )


def test_real_trace_spans_past_the_bound_name_the_cell(tmp_path):
    azure = write(tmp_path / "span.csv", AZURE, "1990-01-01 00:00:00,1,1", "2023-01-01 00:00:00,1,1")
    assert error_of(azure).endswith(
        "line 3, column TIMESTAMP: must be at most 1,000,000,000 s after the first row's (about 31.7 years): "
        "later, float64 time cannot resolve a step, got '2023-01-01 00:00:00'"
    )
    path = write(tmp_path / "span.jsonl", mooncake(5), mooncake(10**12 + 6))
    assert error_of(path).endswith(f"line 2, column timestamp: must be at most 1,000,000,000 s after the "
                                   f"first row's (about 31.7 years): later, float64 time cannot resolve a "
                                   f"step, got {10**12 + 6}")  # fmt: skip


def test_mooncake_int64_extremes_do_not_overflow_the_checks(tmp_path):
    """A subtraction of int64 stamps would wrap; the order and span checks compare instead."""
    path = write(tmp_path / "wide.jsonl", mooncake(2**63 - 1), mooncake(-(2**63)))
    assert "line 2, column timestamp: arrival times must not decrease" in error_of(path)
    path = write(tmp_path / "wide2.jsonl", mooncake(-(2**63)), mooncake(2**63 - 1))
    assert "line 2, column timestamp: must be at most" in error_of(path)


# block_hashes need hash_block_size


def test_jsonl_block_hashes_without_hash_block_size_are_refused(tmp_path):
    """The prefix cache ignored them: 0 hit tokens, where hash_block_size 16 gives 48."""
    request = {"request_id": 0, "arrival_s": 0.0, "prompt_len": 64, "output_len": 10}
    rows = [json.dumps(request), json.dumps({**request, "request_id": 1, "block_hashes": [1, 2, 3, 4]})]
    path = write(tmp_path / "bh.jsonl", json.dumps({"format": "kvbench-trace", "version": 1}), *rows)
    assert "line 3, column block_hashes: needs the header's hash_block_size" in error_of(path)
    sized = json.dumps({"format": "kvbench-trace", "version": 1, "hash_block_size": 16})
    trace = read_trace(write(tmp_path / "sized.jsonl", sized, *rows))
    assert (trace.hash_block_size, trace.requests[1].block_hashes) == (16, (1, 2, 3, 4))


def test_header_less_csv_block_hashes_are_refused(tmp_path, capsys, monkeypatch):
    path = write(tmp_path / "bh.csv", f"{KVBENCH_CSV},block_hashes", "0,0.0,64,10,1 2 3 4", "1,5.0,64,10,")
    args = ("simulate", "--engine", "paged-prefix", "--out", str(tmp_path / "run"), "--trace", str(path))
    assert_one_error(*kvbench(capsys, monkeypatch, *args), str(path), "line 2, column block_hashes")


# Parquet


@pytest.mark.parametrize("column", ["prompt_ids", "block_hashes"])
def test_parquet_null_inside_a_list_is_refused(tmp_path, pa, column):
    """prompt_ids once crashed with a TypeError; block_hashes once loaded with a None hash."""
    path = parquet_with(pa, tmp_path, **{column: pa.array([[1, 2], [1, None]], pa.list_(pa.int64()))})
    assert f"row 2, column {column}: must be a list of integers, got [1, None]" in error_of(path)


def test_parquet_null_list_is_still_the_default(tmp_path, pa):
    path = parquet_with(pa, tmp_path, prompt_ids=pa.array([None, [5, 6]], pa.list_(pa.int64())))
    trace = read_trace(path)
    assert [r.prompt_ids for r in trace.requests] == [None, (5, 6)]


def test_unreadable_parquet_is_one_line(tmp_path, capsys, monkeypatch, pa):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1" + bytes(64) + b"PAR1")
    assert "not a readable Parquet file (" in error_of(path)  # error_of: one line
    code, out, err = kvbench(capsys, monkeypatch, "trace", "stats", str(path))
    assert_one_error(code, out, err, str(path), "not a readable Parquet file")


@pytest.mark.parametrize(
    ("header", "key"),
    [({"format": "kvbench-trace", "version": 2}, "version"), ({"format": "other", "version": 1}, "format"),
     ({"format": "kvbench-trace", "version": 1, "hash_block_size": 0}, "hash_block_size")],
)  # fmt: skip
def test_a_bad_parquet_header_names_the_schema_metadata_not_a_line(tmp_path, pa, header, key):
    """A Parquet file has no lines: its header lives in the schema metadata, which its error names
    (it once said "line 1", a line no editor could find)."""
    import pyarrow.parquet

    path = parquet_with(pa, tmp_path)
    table = pyarrow.parquet.read_table(path)
    pyarrow.parquet.write_table(table.replace_schema_metadata({"kvbench-trace": json.dumps(header)}), path)
    line = error_of(path)
    assert f"schema metadata 'kvbench-trace', key {key}:" in line and "line" not in line
