"""kvbench's trace format: exact round trips through JSONL, CSV and Parquet; atomic writes;
bad files rejected with one line naming the file, the line and the column."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.errors import KvbenchError
from kvbench.requests import Request, Trace
from tests.support import error_of, examples, write
from workloads.columns import MAX_ARRIVAL_S
from workloads.tracefile import read_trace, write_trace

HAVE_PYARROW = importlib.util.find_spec("pyarrow") is not None
SUFFIXES = [
    ".jsonl",
    ".csv",
    pytest.param(".parquet", marks=pytest.mark.skipif(not HAVE_PYARROW, reason="no pyarrow")),
]
HEADER = {
    "format": "kvbench-trace",
    "version": 1,
    "name": "t",
    "source": "s",
    "hash_block_size": None,
    "meta": {},
}

INT64 = st.integers(-(2**63), 2**63 - 1)
TOKEN_IDS = st.integers(0, 2**63 - 1)  # any id the format holds: tokenizers make none below 0
TEXT = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)  # "" cannot go to CSV
JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)


@st.composite
def requests(draw: st.DrawFn, request_id: int, arrival_s: float, hashed: bool) -> Request:
    prompt_len = draw(st.integers(1, 20))
    group = draw(st.none() | TEXT)
    return Request(
        request_id=request_id,
        arrival_s=arrival_s,
        prompt_len=prompt_len,
        output_len=draw(st.integers(1, 10**6)),
        prompt_ids=draw(st.none() | st.tuples(*[TOKEN_IDS] * prompt_len)),
        prefix_group=group,
        prefix_len=0 if group is None else draw(st.integers(0, prompt_len)),  # a prefix is its group's
        block_hashes=draw(st.none() | st.lists(INT64, max_size=4).map(tuple)) if hashed else None,
        conversation_id=draw(st.none() | TEXT),
        turn=draw(st.none() | st.integers(0, 1000)),
        n=draw(st.integers(1, 8)),
        beam_width=draw(st.integers(1, 8)),
    )


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    count = draw(st.integers(1, 6))
    ids = draw(st.lists(st.integers(0, 2**53), min_size=count, max_size=count, unique=True))
    times = sorted(
        draw(st.lists(st.floats(0, MAX_ARRIVAL_S).map(lambda x: x + 0.0), min_size=count, max_size=count))
    )
    block = draw(st.none() | st.integers(1, 4096))  # block_hashes need it
    return Trace(
        name=draw(st.text(st.characters(exclude_categories=("Cs",)), max_size=10)),
        requests=tuple(draw(requests(rid, t, block is not None)) for rid, t in zip(ids, times, strict=True)),
        source=draw(st.text(st.characters(exclude_categories=("Cs",)), max_size=10)),
        hash_block_size=block,
        meta=draw(st.dictionaries(TEXT, JSON_VALUES, max_size=3)),
    )


def round_trip(trace: Trace, suffix: str) -> Trace:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"trace{suffix}"
        write_trace(trace, path)
        return read_trace(path)


@pytest.mark.parametrize("suffix", SUFFIXES)
@settings(max_examples=examples(60))
@given(trace=traces())
def test_every_field_round_trips_exactly(suffix, trace):
    back = round_trip(trace, suffix)
    assert back == trace  # name, source, hash_block_size and every field of every request
    assert back.meta == trace.meta


def plain_trace(count: int = 3) -> Trace:
    reqs = tuple(Request(i, 0.5 * i, 10 + i, 5) for i in range(count))
    return Trace("plain", reqs, source="unit test", meta={"timestamps": True})


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_only_used_optional_fields_are_written(tmp_path, suffix):
    trace = plain_trace()
    trace = Trace(trace.name, (*trace.requests[:2], Request(2, 1.0, 12, 5, turn=0)), trace.source)
    path = write_trace(trace, tmp_path / f"t{suffix}")
    assert read_trace(path) == trace
    if suffix == ".csv":
        lines = path.read_text().splitlines()
        assert json.loads(lines[0].removeprefix("# ")) == {**HEADER, "name": "plain", "source": "unit test"}
        assert lines[1:] == [
            "request_id,arrival_s,prompt_len,output_len,turn",
            "0,0.0,10,5,",
            "1,0.5,11,5,",
            "2,1.0,12,5,0",
        ]
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines()[1:]]
        assert [sorted(row) for row in rows[:2]] == [
            sorted(["request_id", "arrival_s", "prompt_len", "output_len"])
        ] * 2
        assert rows[2]["turn"] == 0


def test_header_less_kvbench_csv_and_jsonl_are_read(tmp_path):
    (tmp_path / "a.csv").write_text("request_id,arrival_s,prompt_len,output_len\n7,0.25,3,4\n")
    (tmp_path / "b.jsonl").write_text(
        '{"request_id": 7, "arrival_s": 0.25, "prompt_len": 3, "output_len": 4}\n'
    )
    for name in ("a.csv", "b.jsonl"):
        trace = read_trace(tmp_path / name)
        assert trace.requests == (Request(7, 0.25, 3, 4),)
        assert trace.name == Path(name).stem and trace.source == str(tmp_path / name)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_atomic_write_leaves_no_temporary_files(tmp_path, suffix):
    path = tmp_path / f"t{suffix}"
    write_trace(plain_trace(), path)
    write_trace(plain_trace(5), path)  # replaces it
    assert sorted(os.listdir(tmp_path)) == [path.name]
    assert len(read_trace(path)) == 5
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path, suffix):
    path = tmp_path / f"t{suffix}"
    write_trace(plain_trace(), path)
    before = path.read_bytes()
    broken = Trace("x", (Request(0, 0.0, 1, 1), Request(1, float("nan"), 1, 1)))
    unjsonable = Trace("x", plain_trace().requests, meta={"bad": object()})
    for trace in (broken, unjsonable):
        with pytest.raises(KvbenchError):
            write_trace(trace, path)
        assert path.read_bytes() == before
        assert sorted(os.listdir(tmp_path)) == [path.name]


def test_unknown_suffix_is_refused(tmp_path):
    with pytest.raises(KvbenchError, match=r"t\.txt: unknown trace file suffix '\.txt'"):
        write_trace(plain_trace(), tmp_path / "t.txt")
    assert os.listdir(tmp_path) == []


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(KvbenchError, match="pip install pyarrow") as error:
        write_trace(plain_trace(), tmp_path / "t.parquet")
    assert "\n" not in str(error.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_unknown_version(tmp_path, suffix):
    header = json.dumps({**HEADER, "version": 2})
    first = header if suffix == ".jsonl" else "# " + header
    path = write(tmp_path / f"v2{suffix}", first, "whatever comes next")
    message = error_of(path)
    assert "line 1, column version" in message and "version 2" in message


def test_duplicate_request_id_csv(tmp_path):
    rows = ["request_id,arrival_s,prompt_len,output_len", "0,0.0,3,4", "1,0.5,3,4", "0,0.7,3,4"]
    path = write(tmp_path / "dup.csv", "# " + json.dumps(HEADER), *rows)
    assert "line 5, column request_id: request ids must be unique, got 0" in error_of(path)


def test_duplicate_request_id_jsonl(tmp_path):
    row = '{{"request_id": {}, "arrival_s": {}, "prompt_len": 3, "output_len": 4}}'
    path = write(tmp_path / "dup.jsonl", json.dumps(HEADER), row.format(4, 0.0), "", row.format(4, 1.0))
    assert "line 4, column request_id: request ids must be unique, got 4" in error_of(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_empty_file(tmp_path, suffix):
    path = write(tmp_path / f"empty{suffix}")
    assert error_of(path) == f"{path}: the file is empty"
    assert error_of(write(path, "", "  ")) == f"{path}: the file is empty"


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_header_without_requests(tmp_path, suffix):
    first = json.dumps(HEADER) if suffix == ".jsonl" else "# " + json.dumps(HEADER)
    rest = () if suffix == ".jsonl" else ("request_id,arrival_s,prompt_len,output_len",)
    assert "the trace has no requests" in error_of(write(tmp_path / f"h{suffix}", first, *rest))


def test_truncated_jsonl_line(tmp_path):
    good = '{"request_id": 0, "arrival_s": 0.0, "prompt_len": 3, "output_len": 4}'
    cut = '{"request_id": 1, "arrival_s": 0.'
    with pytest.raises(json.JSONDecodeError) as decode:
        json.loads(cut)
    path = write(tmp_path / "cut.jsonl", json.dumps(HEADER), good, cut)
    assert f"line 3, column {decode.value.colno}: invalid JSON" in error_of(path)


def test_non_numeric_and_blank_cells_csv(tmp_path):
    rows = ["request_id,arrival_s,prompt_len,output_len", "0,0.0,3,4", "1,0.5,x3,4"]
    assert "line 3, column prompt_len: not a number, got 'x3'" in error_of(write(tmp_path / "a.csv", *rows))
    rows[2] = "1,0.5,3,"
    assert "line 3, column output_len: empty cell" in error_of(write(tmp_path / "b.csv", *rows))


def test_wrong_cell_count_csv(tmp_path):
    rows = ["request_id,arrival_s,prompt_len,output_len", "0,0.0,3,4", "", "1,0.5,3"]
    assert "line 4: expected 4 cells" in error_of(write(tmp_path / "w.csv", *rows))


def test_unknown_column_and_field(tmp_path):
    rows = ["request_id,arrival_s,prompt_len,output_len,prefix_grup", "0,0.0,3,4,a"]
    assert "line 1, column prefix_grup: unknown column" in error_of(write(tmp_path / "u.csv", *rows))
    row = '{"request_id": 0, "arrival_s": 0.0, "prompt_len": 3, "output_len": 4, "nn": 2}'
    assert "line 2, column nn: unknown field" in error_of(
        write(tmp_path / "u.jsonl", json.dumps(HEADER), row)
    )


def test_bad_json_types_are_named(tmp_path):
    good = '{"request_id": 0, "arrival_s": 0.0, "prompt_len": 3, "output_len": 4}'
    row = '{"request_id": 1, "arrival_s": 0.0, "prompt_len": "3", "output_len": 4}'
    assert "line 2, column prompt_len: must be a number, got '3'" in error_of(
        write(tmp_path / "a.jsonl", good, row)
    )
    row = '{"request_id": 0, "arrival_s": 0.0, "prompt_len": 3}'
    assert "line 1: no field 'output_len'" in error_of(write(tmp_path / "b.jsonl", row))
    assert "line 3, column output_len: missing" in error_of(
        write(tmp_path / "c.jsonl", json.dumps(HEADER), good, row)
    )


def test_lines_stay_true_after_multi_line_quoted_cells(tmp_path):
    trace = Trace("q", (Request(0, 0.0, 3, 4, prefix_group='a,"b"\nc\r\nd'), Request(1, 1.0, 3, 4)))
    path = write_trace(trace, tmp_path / "q.csv")
    assert read_trace(path) == trace
    with open(path, "a", newline="") as out:
        out.write("2,0.5,3,4,\n")  # line 7: header 1-2, row 3-5, row 6
    assert "line 7, column arrival_s: arrival times must not decrease" in error_of(path)


def test_unclosed_quote_is_an_error_not_a_swallowed_row(tmp_path):
    rows = ["request_id,arrival_s,prompt_len,output_len,prefix_group", '0,0.0,3,4,"abc', "1,0.5,3,4,x"]
    assert "line 3: bad CSV quoting" in error_of(write(tmp_path / "q.csv", *rows))


@pytest.mark.skipif(not HAVE_PYARROW, reason="no pyarrow")
def test_parquet_errors_name_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {
        "request_id": [0, 1, 1],
        "arrival_s": [0.0, 1.0, 2.0],
        "prompt_len": [3, 3, 3],
        "output_len": [4, 4, 4],
    }
    pq.write_table(pa.table(columns), tmp_path / "dup.parquet")  # no header: read as a plain kvbench table
    assert "row 3, column request_id: request ids must be unique" in error_of(tmp_path / "dup.parquet")
    pq.write_table(pa.table({**columns, "prompt_len": ["3", "3", "3"]}), tmp_path / "str.parquet")
    assert "column prompt_len: unexpected type string" in error_of(tmp_path / "str.parquet")


def test_reading_restores_the_garbage_collector(tmp_path):
    import gc

    path = write_trace(plain_trace(), tmp_path / "t.csv")
    read_trace(path)
    assert gc.isenabled()
    gc.disable()
    try:
        read_trace(path)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
