"""Every rule of the trace schema (workloads/tracefile.py's table), each broken by one row.

A trace is checked once, column by column (`workloads.columns.to_trace`), whatever file it came
from; each case below breaks exactly one rule in the second request of an otherwise valid
file and expects the one-line error naming the file, that request's line and the column.
Nothing may be silently repaired: a fractional length is refused, not truncated.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvbench.errors import KvbenchError
from kvbench.requests import Request
from workloads.columns import Columns, to_trace
from workloads.tracefile import read_trace

GOOD = {"request_id": 1, "arrival_s": 0.5, "prompt_len": 4, "output_len": 3}

# (column, bad value, what the rule says); the value goes in the second request (line 3) but
# for a negative arrival, which goes in the first
BROKEN = [
    ("arrival_s", -0.5, "arrival times are >= 0"),
    ("arrival_s", 0.25, "arrival times never decrease (the first request arrives at 0.5)"),
    ("arrival_s", math.inf, "arrival times are finite"),
    ("prompt_len", 0, "prompt_len >= 1"),
    ("prompt_len", 4.5, "prompt_len is whole, not truncated"),
    ("output_len", 0, "output_len >= 1"),
    ("output_len", 2.5, "output_len is whole, not truncated"),
    ("request_id", -1, "request_id >= 0"),
    ("request_id", 0, "request_id unique (the first request has id 0)"),
    ("request_id", 1.5, "request_id is whole"),
    ("prefix_len", 5, "prefix_len <= prompt_len (4)"),
    ("prefix_len", -1, "prefix_len >= 0"),
    ("prefix_len", 1.5, "prefix_len is whole"),
    ("prefix_len", 2, "prefix_len needs the prefix_group that shares it (none: nothing reads it)"),
    ("turn", -1, "turn >= 0"),
    ("turn", 0.5, "turn is whole"),
    ("n", 0, "n >= 1"),
    ("n", 1.5, "n is whole"),
    ("beam_width", 0, "beam_width >= 1"),
    ("beam_width", 2.5, "beam_width is whole"),
    ("prompt_ids", [1, 2, 3], "as many prompt_ids as prompt_len (4)"),
    ("prompt_ids", [1, 2, 3, 4, 5], "as many prompt_ids as prompt_len (4)"),
    ("prompt_ids", [1, 2**64, 3, 4], "token ids are 64-bit integers"),
    ("prompt_ids", [1, -2, 3, 4], "token ids are >= 0"),
]


def rows_with(column: str, value) -> tuple[list[dict], int]:
    """Two requests, the second breaking the rule; and the line the error must name. A
    negative arrival goes first (after a valid one it would be refused as a decrease)."""
    first = {"request_id": 0, "arrival_s": 0.5, "prompt_len": 4, "output_len": 3}
    if column == "arrival_s" and value < 0:
        return [{**first, "arrival_s": value}, GOOD], 2
    return [first, {**GOOD, column: value}], 3


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    header = {"format": "kvbench-trace", "version": 1, "name": "t", "source": "", "hash_block_size": None}
    path.write_text("".join(json.dumps(row) + "\n" for row in [{**header, "meta": {}}, *rows]))
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value) -> str:
        if value is None:
            return ""
        return " ".join(map(str, value)) if isinstance(value, list) else repr(value)

    lines = [",".join(columns)] + [",".join(cell(row.get(c)) for c in columns) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("writer", [write_csv, write_jsonl], ids=["csv", "jsonl"])
@pytest.mark.parametrize(("column", "value", "rule"), BROKEN, ids=lambda v: str(v)[:24])
def test_a_row_breaking_a_rule_is_refused_naming_file_line_and_column(tmp_path, writer, column, value, rule):
    suffix = ".csv" if writer is write_csv else ".jsonl"
    rows, line = rows_with(column, value)
    path = writer(tmp_path / f"trace{suffix}", rows)
    with pytest.raises(KvbenchError) as error:
        read_trace(path)
    message = str(error.value)
    assert "\n" not in message, rule
    assert message.startswith(f"{path}: line {line}, column {column}: "), (rule, message)


@pytest.mark.parametrize("writer", [write_csv, write_jsonl], ids=["csv", "jsonl"])
def test_the_same_rows_without_the_break_are_read(tmp_path, writer):
    """The valid neighbours of every broken row above: each refusal is the rule's, not the file's."""
    suffix = ".csv" if writer is write_csv else ".jsonl"
    good = {**GOOD, "prefix_group": "g", "prefix_len": 4, "turn": 0, "n": 2, "beam_width": 1,
            "prompt_ids": [0, 1, 2, 3]}  # fmt: skip
    rows = [{"request_id": 0, "arrival_s": 0.5, "prompt_len": 4, "output_len": 3}, good]
    trace = read_trace(writer(tmp_path / f"trace{suffix}", rows))
    second = trace.requests[1]
    assert (second.request_id, second.arrival_s, second.prompt_len, second.output_len) == (1, 0.5, 4, 3)
    assert (second.prefix_len, second.turn, second.n, second.prompt_ids) == (4, 0, 2, (0, 1, 2, 3))


def columns(**fields) -> Columns:
    base = {
        "arrival_s": np.array([0.0, 1.0, 2.0]),
        "prompt_len": np.array([4, 4, 4]),
        "output_len": np.array([3, 3, 3]),
    }
    return Columns(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "column", "row"),
    [
        ({"arrival_s": np.array([-2.0, 1.0, 2.0])}, "arrival_s", 1),
        ({"arrival_s": np.array([0.0, math.nan, 2.0])}, "arrival_s", 2),
        ({"arrival_s": np.array([0.0, 3.0, 2.0])}, "arrival_s", 3),
        ({"prompt_len": np.array([4.0, 4.0, 3.5])}, "prompt_len", 3),
        ({"prompt_len": np.array([4.0, math.nan, 3.0])}, "prompt_len", 2),
        ({"output_len": np.array([3.0, 0.5, 3.0])}, "output_len", 2),
        ({"prefix_len": np.array([0.0, 5.0, 0.0])}, "prefix_len", 2),
        ({"prompt_ids": [None, (1, 2, 3, 4, 5), None]}, "prompt_ids", 2),
        ({"request_id": np.array([0, 7, 7])}, "request_id", 3),
    ],
)
def test_columns_from_any_loader_are_checked_alike(fields, column, row):
    """Loaders without line numbers (generators, datasets) are named by their 1-based row."""
    with pytest.raises(KvbenchError) as error:
        to_trace(columns(**fields), "t", "spec:x")
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"spec:x: line {row}, column {column}: "), message


def test_a_fractional_length_is_never_truncated():
    with pytest.raises(KvbenchError, match="output_len"):
        to_trace(columns(output_len=np.array([3.0, 3.0, 2.9999])), "t", "spec:x")
    trace = to_trace(columns(output_len=np.array([3.0, 3.0, 2.0])), "t", "spec:x")
    assert [r.output_len for r in trace.requests] == [3, 3, 2]


def test_an_empty_trace_is_refused():
    empty = Columns(np.array([]), np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    with pytest.raises(KvbenchError, match="no requests"):
        to_trace(empty, "t", "spec:x")


def test_columns_become_requests_field_by_field():
    """Every field reaches its Request, blanks (NaN) take the documented defaults, and the
    smallest valid values (a one-token prompt and output, turn 0) are accepted."""
    cols = Columns(
        arrival_s=np.array([0.0, 1.0]),
        prompt_len=np.array([1, 4]),
        output_len=np.array([1, 2]),
        request_id=np.array([5, 3]),
        prefix_len=np.array([math.nan, 2.0]),
        turn=np.array([math.nan, 0.0]),
        n=np.array([math.nan, 2.0]),
        beam_width=np.array([3.0, math.nan]),
        prefix_group=[None, "g"],
        conversation_id=["c", None],
        prompt_ids=[(7,), None],
        block_hashes=[None, (11, 12)],
        extra={"k": 1},
    )
    trace = to_trace(cols, "t", "spec:x", hash_block_size=2)
    assert trace.requests == (
        Request(5, 0.0, 1, 1, (7,), None, 0, None, "c", None, 1, 3),
        Request(3, 1.0, 4, 2, None, "g", 2, (11, 12), None, 0, 2, 1),
    )
    assert (trace.name, trace.source, trace.hash_block_size, trace.meta) == ("t", "spec:x", 2, {"k": 1})
