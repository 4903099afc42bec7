"""Tests written against the mutants that survived the metrics scope's mutation run
(docs/MUTATION.md, results/mutation/metrics/): each pins a value or a refusal a user sees
(a metric, a trace row refused, a column read) that the direct tests of
`tests/test_definitions.py` and `tests/test_trace_validation.py` left open.

Timelines run the real engine, scheduler and allocator; records come from kvbench's own
record builders; traces from `workloads.columns.to_trace` and `read_trace`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvbench.errors import KvbenchError
from workloads.columns import Columns, Where, to_trace


def columns(**fields) -> Columns:
    """Three valid rows (arrivals 0, 1, 2; prompt 4; output 3), `fields` replacing columns."""
    base = {
        "arrival_s": np.array([0.0, 1.0, 2.0]),
        "prompt_len": np.array([4, 4, 4]),
        "output_len": np.array([3, 3, 3]),
    }
    return Columns(**{**base, **fields})


def refusal(cols: Columns, where: str | Where = "spec:x") -> str:
    with pytest.raises(KvbenchError) as error:
        to_trace(cols, "t", where)
    return str(error.value)


# the whole line a user reads: where, which rule, and the value found (whole floats as integers)
MESSAGES = [
    ({"arrival_s": np.array([-2.0, 1.0, 2.0])}, "line 1, column arrival_s: must be a time >= 0, got -2"),
    (
        {"arrival_s": np.array([0.0, 3.5, 2.0])},
        "line 3, column arrival_s: arrival times must not decrease, got 2",
    ),
    ({"prompt_len": np.array([4.0, 3.5, 4.0])}, "line 2, column prompt_len: must be a whole number, got 3.5"),
    ({"prompt_len": np.array([4.0, math.nan, 4.0])}, "line 2, column prompt_len: must be a number, got nan"),
    ({"prompt_len": np.array([4, 0, 4])}, "line 2, column prompt_len: must be >= 1, got 0"),
    ({"prompt_len": np.array([4.0, 0.0, 4.0])}, "line 2, column prompt_len: must be >= 1, got 0"),
    ({"output_len": np.array([3, 3, 0])}, "line 3, column output_len: must be >= 1, got 0"),
    (
        {"output_len": np.array([3.0, 2.0**53 + 2, 3.0])},
        "line 2, column output_len: must be at most 2**53 unless written as an integer, got 9007199254740994",
    ),
    ({"request_id": np.array([7, 3, 7])}, "line 3, column request_id: request ids must be unique, got 7"),
    ({"request_id": np.array([0, -1, 2])}, "line 2, column request_id: must be >= 0, got -1"),
    (
        {"prefix_len": np.array([0.0, 5.0, 0.0])},
        "line 2, column prefix_len: must not exceed prompt_len, got 5",
    ),
    ({"prefix_len": np.array([0, -1, 0])}, "line 2, column prefix_len: must be >= 0, got -1"),
    ({"turn": np.array([0.0, -1.0, math.nan])}, "line 2, column turn: must be >= 0, got -1"),
    ({"n": np.array([1, 0, 1])}, "line 2, column n: must be >= 1, got 0"),
    ({"n": np.array([1.0, math.nan, 0.0])}, "line 3, column n: must be >= 1, got 0"),
    ({"beam_width": np.array([1.5, 1.0, 1.0])}, "line 1, column beam_width: must be a whole number, got 1.5"),
    (
        {"prompt_ids": [None, (1, 2, 3, 4, 5), None]},
        "line 2, column prompt_ids: length must equal prompt_len, got 5",
    ),
    ({"prompt_ids": [None, (), None]}, "line 2, column prompt_ids: length must equal prompt_len, got 0"),
    (
        {"prompt_ids": [None, (1, 2**64, 3, 4), None]},
        "line 2, column prompt_ids: token ids must be 64-bit integers, got 18446744073709551616",
    ),
    (
        {"prompt_ids": [(1, 2, 3, 4), (5, -3, -4, 1), (-1, 2, 3, 4)]},
        "line 2, column prompt_ids: token ids must be >= 0, got -3",  # the first row, its first id
    ),
]


@pytest.mark.parametrize(("fields", "message"), MESSAGES, ids=lambda v: str(v)[:40])
def test_each_refusal_names_its_rule_and_the_value_found(fields, message):
    assert refusal(columns(**fields)) == f"spec:x: {message}"


def test_a_file_without_lines_names_rows_and_its_own_column_names():
    """Parquet has rows, not lines; a loader's own column names (Azure's TIMESTAMP) are what the
    user finds in the file; a loader's line numbers are used as given."""
    cols = columns(arrival_s=np.array([0.0, -1.0, 2.0]), lines=np.array([10, 12, 15]))
    where = Where("f.parquet", "row", {"arrival_s": "TIMESTAMP"})
    assert refusal(cols, where) == "f.parquet: row 12, column TIMESTAMP: must be a time >= 0, got -1"
    assert refusal(columns(n=np.array([1, 0, 1])), where) == "f.parquet: row 2, column n: must be >= 1, got 0"


def test_a_repeated_id_is_refused_at_its_later_row():
    """20 rows, the id of row 7 repeated at row 14: the error names line 14, the repeat, whatever
    the order of the ids (an unstable sort of the ids would name line 7, the original)."""
    ids = np.random.default_rng(0).permutation(20)
    ids[13] = ids[6]
    cols = Columns(np.arange(20.0), np.full(20, 4), np.full(20, 3), request_id=ids)
    assert refusal(cols) == f"spec:x: line 14, column request_id: request ids must be unique, got {ids[6]}"


def test_the_largest_values_that_are_still_accepted():
    """2**53 written as a float names one integer and is read; token ids up to 2**63 - 1."""
    trace = to_trace(
        columns(output_len=np.array([3.0, 2.0**53, 3.0]), prompt_ids=[None, (0, 1, 2, 2**63 - 1), None]),
        "t",
        "spec:x",
    )
    assert trace.requests[1].output_len == 2**53 and trace.requests[1].prompt_ids == (0, 1, 2, 2**63 - 1)
    ids = np.array([2**62 + 1, 2**62 + 3, 2**62 + 5])  # integers stay exact past 2**53
    assert [r.request_id for r in to_trace(columns(request_id=ids), "t", "spec:x").requests] == ids.tolist()
