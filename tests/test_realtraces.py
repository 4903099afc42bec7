"""Public traces: the shared samples load with SOURCES.md's counts and statistics; malformed
Azure / vidur / Mooncake files are refused with one line naming the file, line and column."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support import error_of, write
from workloads.tracefile import read_trace

# the shared copies: KVBENCH_TRACE_DIR where set (as kvbench itself reads it; a copy of the tree
# elsewhere, such as mutation testing's, finds them so), else ../shared/traces beside the clone
SHARED = Path(os.environ.get("KVBENCH_TRACE_DIR") or Path(__file__).resolve().parents[2] / "shared/traces")
AZURE = "azure2023/AzureLLMInferenceTrace_conv.csv"
VIDUR = "vidur/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
ETALON = "etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
MOONCAKE = "mooncake/conversation_trace.jsonl"

# SOURCES.md: rows; prompt and output (mean, p50, p90, p99, max, min); duration (s) or None
EXPECTED = {
    AZURE: (19_366, (1155, 1020, 2734, 4142, 14050, 2), (211, 129, 424, 601, 1000, 7), 3502),
    VIDUR: (28_257, (2588, 2730, 3702, 3933, 4054, 1), (291, 167, 372, 3271, 4056, 5), None),
    ETALON: (30_731, (2340, 1730, 5696, 7434, 8141, 1), (439, 415, 834, 998, 1024, 2), None),
    MOONCAKE: (12_031, (12035, 6909, 27367, 85400, 126195, 891), (343, 350, 597, 1119, 2000, 1), 3537),
}


@pytest.fixture
def shared():
    """Reads a shared trace in the test that asks for it (each takes well under 0.1 s). Not read
    once for the module: mutation testing runs, for a mutant, only the tests it saw reach the
    mutated function, and a module-wide read credits every loader to the first test alone."""
    if not SHARED.is_dir():
        pytest.skip(f"shared traces not present at {SHARED}")
    return lambda name: read_trace(SHARED / name)


def summary(values: np.ndarray) -> tuple[int, ...]:
    """As SOURCES.md rounds them: mean, p50, p90, p99 (numpy's linear interpolation), max, min."""
    pcts = [round(float(np.percentile(values, q))) for q in (50, 90, 99)]
    return (round(float(values.mean())), *pcts, int(values.max()), int(values.min()))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shared_traces_match_sources_md(shared, name):
    trace = shared(name)
    rows, prompt, output, duration = EXPECTED[name]
    assert len(trace) == rows
    assert summary(np.array([r.prompt_len for r in trace.requests])) == prompt
    assert summary(np.array([r.output_len for r in trace.requests])) == output
    assert [r.request_id for r in trace.requests] == list(range(rows))
    arrival = np.array([r.arrival_s for r in trace.requests])  # (N,)
    assert arrival[0] == 0.0 and (np.diff(arrival) >= 0).all()
    assert trace.meta["timestamps"] is (duration is not None)
    if duration is None:  # lengths only: the caller must generate arrivals
        assert (arrival == 0).all()
    else:
        assert round(arrival[-1]) == duration


def test_azure_arrival_statistics(shared):
    azure = shared(AZURE)
    arrival = np.array([r.arrival_s for r in azure.requests])
    gaps = np.diff(arrival)
    assert (len(arrival) - 1) / arrival[-1] == pytest.approx(5.53, abs=0.005)
    assert gaps.std() / gaps.mean() == pytest.approx(1.09, abs=0.005)
    assert np.bincount(arrival.astype(int)).max() == 16
    # row 2 - row 1: 18:15:50.9951690 - 18:15:46.6805900, to the 100 ns the file resolves
    assert arrival[1] == pytest.approx(4.314579, abs=1e-9)
    assert azure.meta["start"] == "2023-11-16T18:15:46.680590000"


def test_mooncake_hashes_and_prefix_reuse(shared):
    trace = shared(MOONCAKE)
    assert trace.hash_block_size == 512
    assert all(len(r.block_hashes) == math.ceil(r.prompt_len / 512) for r in trace.requests)
    hashes = [h for r in trace.requests for h in r.block_hashes]
    assert (len(hashes), len(set(hashes))) == (288_500, 182_790)
    arrival = np.array([r.arrival_s for r in trace.requests])
    assert (len(arrival) - 1) / arrival[-1] == pytest.approx(3.40, abs=0.005)
    assert np.bincount(arrival.astype(int)).max() == 28


def test_mooncake_loads_fast():
    path = SHARED / MOONCAKE
    if not path.is_file():
        pytest.skip(f"{path} not present")
    # CPU time, not wall time: other jobs on a loaded machine do not count (measured on the 2-core
    # CI box at load 15: 0.25 s of CPU, 3.7-4.3 s of wall time); the bound is the point here
    start = time.process_time()
    read_trace(path)
    assert time.process_time() - start < 2.0


def mooncake_row(timestamp: int, input_length: int = 600, output_length: int = 10) -> str:
    hashes = list(range(math.ceil(input_length / 512))) if input_length > 0 else []
    row = {"timestamp": timestamp, "input_length": input_length, "output_length": output_length}
    return json.dumps({**row, "hash_ids": hashes})


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def test_small_files_of_each_format_load(tmp_path):
    azure = read_trace(
        write(tmp_path / "a.csv", AZURE_HEADER, "2023-11-16 18:15:46.5,5,6", "2023-11-16 18:15:48,7,8")
    )
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in azure.requests] == [(0.0, 5, 6), (1.5, 7, 8)]
    vidur = read_trace(
        write(tmp_path / "v.csv", "num_decode_tokens,x,num_prefill_tokens", "4,a,9", "", "2,b,3")
    )
    assert [(r.prompt_len, r.output_len) for r in vidur.requests] == [(9, 4), (3, 2)]
    mooncake = read_trace(
        write(tmp_path / "m.jsonl", mooncake_row(1000), mooncake_row(1000), mooncake_row(1250))
    )
    assert [r.arrival_s for r in mooncake.requests] == [0.0, 0.0, 0.25]  # equal times are legal
    assert mooncake.requests[0].block_hashes == (0, 1)


def test_missing_column(tmp_path):
    path = write(tmp_path / "trace.csv", "TIMESTAMP,ContextTokens", "2023-11-16 18:15:46.6805900,374")
    message = error_of(path)
    assert "line 1: no column 'GeneratedTokens'" in message
    assert "(Azure trace columns: TIMESTAMP, ContextTokens, GeneratedTokens)" in message


def test_misnamed_column(tmp_path):
    path = write(tmp_path / "trace.csv", "num_prefill_tokens,num_decode_token", "5,6")
    message = error_of(path)
    assert "line 1: no column 'num_decode_tokens', found 'num_decode_token'" in message
    assert "vidur/etalon stats columns" in message


def test_unknown_format_lists_the_known_ones(tmp_path):
    message = error_of(write(tmp_path / "x.csv", "foo,bar", "1,2"))
    assert "line 1: unknown trace format, found columns foo, bar" in message
    for known in ("kvbench-trace CSV", "Azure trace", "vidur/etalon stats", "Mooncake trace"):
        assert known in message


def test_non_numeric_length(tmp_path):
    rows = [AZURE_HEADER, "2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,3a96,109"]
    assert "line 3, column ContextTokens: not a number, got '3a96'" in error_of(
        write(tmp_path / "az.csv", *rows)
    )


def test_bad_timestamp(tmp_path):
    rows = [AZURE_HEADER, "2023-11-16 18:15:46.6805900,374,44", "yesterday,396,109"]
    assert "line 3, column TIMESTAMP: not a date and time, got 'yesterday'" in error_of(
        write(tmp_path / "t.csv", *rows)
    )


def test_negative_length(tmp_path):
    rows = ["num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio", "10,5,15,2.0", "12,-3,9,-4.0"]
    assert "line 3, column num_decode_tokens: must be >= 1, got -3" in error_of(
        write(tmp_path / "v.csv", *rows)
    )


def test_zero_output_length(tmp_path):
    path = write(tmp_path / "m.jsonl", mooncake_row(0), mooncake_row(5, output_length=0))
    assert "line 2, column output_length: must be >= 1, got 0" in error_of(path)


def test_decreasing_timestamps_azure(tmp_path):
    rows = [
        AZURE_HEADER,
        "2023-11-16 18:15:46.6,374,44",
        "2023-11-16 18:15:47.1,396,109",
        "2023-11-16 18:15:47.0,1,1",
    ]
    assert "line 4, column TIMESTAMP: arrival times must not decrease" in error_of(
        write(tmp_path / "d.csv", *rows)
    )


def test_decreasing_timestamps_mooncake(tmp_path):
    path = write(tmp_path / "d.jsonl", mooncake_row(0), mooncake_row(20), "", mooncake_row(19))
    assert "line 4, column timestamp: arrival times must not decrease" in error_of(path)


def test_truncated_json_line(tmp_path):
    cut = mooncake_row(30)[:25]
    with pytest.raises(json.JSONDecodeError) as decode:
        json.loads(cut)
    path = write(tmp_path / "cut.jsonl", mooncake_row(0), mooncake_row(10), cut)
    assert f"line 3, column {decode.value.colno}: invalid JSON" in error_of(path)


def test_missing_mooncake_field(tmp_path):
    row = json.dumps({"timestamp": 5, "input_length": 600, "hash_ids": [1, 2]})
    assert "line 2, column output_length: missing" in error_of(
        write(tmp_path / "m.jsonl", mooncake_row(0), row)
    )


def test_wrong_hash_count(tmp_path):
    row = json.dumps({"timestamp": 5, "input_length": 1025, "output_length": 3, "hash_ids": [1, 2]})
    message = error_of(write(tmp_path / "m.jsonl", mooncake_row(0), row))
    assert "line 2, column hash_ids: expected ceil(1025 / 512) = 3 hashes, got 2" in message


@pytest.mark.parametrize("name", ["trace.csv", "trace.jsonl"])
def test_empty_file(tmp_path, name):
    path = write(tmp_path / name)
    assert error_of(path) == f"{path}: the file is empty"


def test_header_only_is_not_a_trace(tmp_path):
    assert error_of(write(tmp_path / "h.csv", AZURE_HEADER)).endswith("the trace has no requests")
