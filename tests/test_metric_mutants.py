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

from engines import ENGINES, EngineOptions
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.engine import Engine
from kvbench.errors import KvbenchError
from kvbench.metrics.latency import ItlTable, distribution
from kvbench.metrics.occupancy import CATEGORIES, Footprint, Growth, KVSnapshot, categories, segment_integral
from kvbench.metrics.summary import (
    Slo,
    check_metric_options,
    parse_percentiles,
    parse_slo,
    request_record,
    summarize,
)
from kvbench.requests import Request, Trace
from kvbench.sequence import Sequence
from workloads.columns import Columns, Where, check_vocabulary, columns_of, to_trace


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
    (
        {"prompt_ids": [(1, 2, 3, -(2**63)), (1, 2, 3, 2**63 - 1), (1, 2**64, 3, 4)]},  # int64's ends pass
        "line 3, column prompt_ids: token ids must be 64-bit integers, got 18446744073709551616",
    ),
    (
        {"prompt_ids": [(1, 2, 3, 4), (-5, 2, 3, 4), None]},  # a row's first id, right after a row's end
        "line 2, column prompt_ids: token ids must be >= 0, got -5",
    ),
    (
        {"prompt_ids": [None, (1, -(2**62) - 1, 3, 4), None]},
        "line 2, column prompt_ids: token ids must be >= 0, got -4611686018427387905",  # exact past 2**53
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


def test_token_ids_a_model_cannot_embed_are_refused_naming_the_request():
    """Ids 0..vocab-1 pass; the first id outside names its request by its own id (rows without
    ids skipped), and the trace by its source, else its name."""
    rows = [((1, 2, 3, 9), 0), (None, 1), ((10, 2, 3, 4), 2), ((5, -1, 3, 4), 3)]
    trace = Trace(
        "t", tuple(Request(7 + i, float(i), 4, 2, prompt_ids=ids) for ids, i in rows), source="f.csv"
    )
    with pytest.raises(KvbenchError) as error:
        check_vocabulary(trace, 10, "tiny")
    assert str(error.value) == (
        "f.csv: request_id 9, column prompt_ids: token id 10 is outside --model tiny's vocabulary"
        " of 10 ids (0..9)"
    )
    unnamed = Trace("t", (Request(0, 0.0, 2, 2, prompt_ids=(0, -1)),))
    with pytest.raises(KvbenchError, match=r"^t: request_id 0, column prompt_ids: token id -1 is outside"):
        check_vocabulary(unnamed, 10, "tiny")
    check_vocabulary(Trace("t", trace.requests[:2]), 10, "tiny")  # 9 is the last id of a vocabulary of 10
    check_vocabulary(Trace("t", (Request(0, 0.0, 2, 2),)), 10, "tiny")  # no ids at all
    check_vocabulary(Trace("t", ()), 10, "tiny")  # no requests: nothing to refuse


def test_a_trace_back_in_columns_builds_the_same_trace():
    """`columns_of` then `to_trace`: every field of every request, and the loader's notes; fields
    that hold only their default stay out of the columns."""
    trace = Trace(
        "t",
        (
            Request(2**62 + 1, 0.0, 4, 2, (1, 2, 3, 4), "g", 2, (11,), "c", 0, 2, 1),  # an id past 2**53
            Request(3, 1.5, 3, 1, None, None, 0, None, None, None, 1, 3),
        ),
        source="f.csv",
        hash_block_size=2,
        meta={"k": 1},
    )
    cols = columns_of(trace)
    again = to_trace(cols, trace.name, trace.source, hash_block_size=trace.hash_block_size)
    assert again == trace and again.meta == {"k": 1}
    plain = columns_of(Trace("t", (Request(0, 0.0, 4, 2), Request(1, 1.0, 4, 2))))
    assert (plain.prefix_len, plain.turn, plain.n, plain.beam_width) == (None, None, None, None)
    assert (plain.prefix_group, plain.conversation_id, plain.prompt_ids, plain.block_hashes) == (None,) * 4
    assert plain.request_id.tolist() == [0, 1] and plain.output_len.tolist() == [2, 2]


def test_taking_rows_moves_every_field_alike():
    cols = Columns(
        arrival_s=np.array([0.0, 1.0, 2.0]),
        prompt_len=np.array([4, 5, 6]),
        output_len=np.array([1, 2, 3]),
        turn=np.array([0.0, math.nan, 1.0]),
        prompt_ids=[None, (1, 2, 3, 4, 5), None],
        extra={"k": 1},
    )
    taken = cols.take(np.array([2, 0]))
    assert taken.prompt_len.tolist() == [6, 4] and taken.output_len.tolist() == [3, 1]
    assert taken.turn.tolist() == [1.0, 0.0] and taken.prompt_ids == [None, None]
    assert taken.arrival_s.tolist() == [2.0, 0.0] and taken.extra == {"k": 1} and taken.request_id is None
    assert cols.take(np.array([1])).prompt_ids == [(1, 2, 3, 4, 5)]


def test_an_instants_categories_in_whole_slots_sum_to_the_arena():
    """Fractional slots (a page granting part of a slot) round down in every category; `free`
    takes the remainder, so the snapshot still sums to the arena."""
    fp = Footprint(tokens=3.5, target=5.0, asked=8.0, granted=9.75, external=2.0, idle=1.5)
    snap = KVSnapshot.of(fp, 20)
    assert snap.as_dict() == {
        "token_states": 3,
        "outside_window": 0,
        "reservation": 1,
        "internal_frag": 3,
        "allocator_overhead": 1,
        "mapped_idle": 1,
        "external_frag": 2,
        "free": 9,
    }
    assert list(snap.as_dict()) == list(CATEGORIES) and snap.num_slots == 20
    assert sum(snap.as_dict().values()) == 20


def _run(trace: Trace, cost: CostModel):
    sched = ENGINES["orca-max"].build(EngineOptions(num_slots=64, max_len=64))
    run = Engine(sched, CostModelRunner(cost)).run(trace)
    return run, [request_record(seq) for seq in run.sequences]


def test_a_run_that_completed_nothing_reports_zero_rates_and_undefined_latencies():
    """No request: rates are 0 per second, every latency statistic is undefined (NaN, not an
    error), goodput 0 with no share of nothing, and no occupancy at all."""
    run, done = _run(Trace("t", ()), CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.0))
    s = summarize(run, done, slo=Slo(ttft_s=1.0))
    assert (s["num_requests"], s["completed"], s["makespan_s"], s["busy_s"], s["num_steps"]) == (
        0,
        0,
        0.0,
        0.0,
        0,
    )
    assert (s["request_throughput"], s["output_token_throughput"], s["total_token_throughput"]) == (
        0.0,
        0.0,
        0.0,
    )
    assert (s["mean_batched_requests"], s["mean_batched_requests_saturated"]) == (0.0, None)
    assert (
        math.isnan(s["normalized_latency_s"]) and math.isnan(s["p99_itl_s"]) and math.isnan(s["mean_ttft_s"])
    )
    assert (s["good_requests"], s["goodput"]) == (0, 0.0) and math.isnan(s["goodput_fraction"])
    assert (s["occupancy"], s["occupancy_saturated"], s["sharing_saved_fraction"]) == ({}, {}, 0.0)
    assert (s["prefix_hit_tokens"], s["prefix_cache_hit_rate"], s["num_preemptions"]) == (0, 0.0, 0)


def test_a_run_of_zero_seconds_reports_zero_rates_not_a_division_by_zero():
    """A cost model whose steps take no time: the request finishes as it arrives (at 1 s), the
    makespan is 0, and so are the rates and the time-weighted batch size."""
    run, done = _run(
        Trace("t", (Request(0, 1.0, 4, 2),)), CostModel(fixed_s=0.0, per_token_s=0.0, per_kv_token_s=0.0)
    )
    s = summarize(run, done, slo=Slo(ttft_s=1.0))
    assert (s["makespan_s"], s["busy_s"], s["num_steps"]) == (0.0, 0.0, 2)
    assert (s["request_throughput"], s["output_token_throughput"], s["total_token_throughput"]) == (
        0.0,
        0.0,
        0.0,
    )
    assert (s["mean_batched_requests"], s["normalized_latency_s"]) == (0.0, 0.0)
    assert (s["good_requests"], s["goodput"], s["goodput_fraction"]) == (1, 0.0, 1.0)


def test_metric_options_refused_with_their_whole_line():
    with pytest.raises(KvbenchError) as error:
        check_metric_options((), Slo())
    assert str(error.value) == "--percentiles needs at least one value in (0, 100]"
    assert parse_percentiles("0.5,1,100") == (0.5, 1.0, 100.0)  # any p > 0, below 1 too
    for text, message in [
        ("ttft", "--slo: expected metric=seconds (ttft, tpot, e2el), got 'ttft'"),
        ("ttft=0.5=1", "--slo ttft: '0.5=1' is not a number of seconds"),  # split at the first '='
        ("ttft=1, itl=2", "--slo: unknown metric 'itl'; choose from ttft, tpot, e2el"),
        ("e2el=0", "--slo e2el must be a positive number of seconds, got 0.0"),
    ]:
        with pytest.raises(KvbenchError) as error:
            parse_slo(text)
        assert str(error.value) == message


def test_the_itl_table_of_sequences_that_never_ran_has_no_gaps():
    """No step ran: no gaps (the ITL statistics are then undefined), and each sequence's longest
    gap is undefined (NaN), one per sequence."""
    table = ItlTable.of([Sequence(Request(0, 0.0, 4, 2)), Sequence(Request(1, 0.0, 4, 3))])
    assert (len(table.values), len(table.counts), table.num_gaps) == (0, 0, 0)
    assert len(table.maxima) == 2 and all(math.isnan(m) for m in table.maxima.tolist())
    assert len(ItlTable.of([]).maxima) == 0


def test_a_request_still_running_has_no_record():
    """Admitted, first token out, not finished: the record builder refuses it rather than
    writing a row with a missing finish time."""
    seq = Sequence(Request(0, 0.0, 4, 3))
    seq.advance(1, 1.0, 0.0)
    assert seq.first_token_s == 1.0 and seq.admitted_s == 0.0 and seq.finish_s is None
    with pytest.raises(AssertionError):
        request_record(seq)


def test_undefined_values_leave_the_pool_with_their_counts():
    """Value NaN counted 5 times, 1 once, 3 three times: the pool is 1 3 3 3 (not 1 3)."""
    d = distribution("x", [math.nan, 1.0, 3.0], [25], counts=np.array([5, 1, 3]))
    assert (d["mean_x"], d["median_x"], d["p25_x"]) == (2.5, 3.0, 2.5)  # rank 0.75: 1 + 0.75 x 2
    assert d["std_x"] == pytest.approx(math.sqrt(0.75))


def test_mapped_idle_slots_are_neither_free_nor_held_by_a_sequence():
    """Every category of one footprint by hand, in a 30-slot arena: 4 idle mapped slots and 2 of
    external fragmentation come out of `free`, which keeps 30 - 9 - 4 - 2."""
    fp = Footprint(tokens=3, target=5, asked=8, granted=9, external=2, idle=4)
    assert categories(fp, 30) == {
        "token_states": 3,
        "outside_window": 0,
        "reservation": 2,
        "internal_frag": 3,
        "allocator_overhead": 1,
        "mapped_idle": 4,
        "external_frag": 2,
        "free": 15,
    }


def test_a_segment_granting_fractions_of_a_slot_integrates_what_it_granted():
    """Pages of a fractional number of slots (`engines.vmm`): step j grants `granted[j]`, not the
    whole slots it asked. Steps of 1, 2 and 4 s; 4.5 slots granted before steps 1 and 2 (4 asked):
    granted during the steps 7, 11.5, 16, so 7 x 1 + 11.5 x 2 + 16 x 4."""
    end = Footprint(tokens=10, target=12, asked=16, granted=16, external=0, idle=0)
    growth = Growth(asked=np.array([0, 4, 4]), target=np.array([0, 2, 2]), granted=np.array([0.0, 4.5, 4.5]))
    got = segment_integral(end, np.array([1.0, 2.0, 4.0]), 2, growth)
    assert (got.granted, got.asked) == (7 * 1 + 11.5 * 2 + 16 * 4, 8 * 1 + 12 * 2 + 16 * 4)


def test_each_sequences_longest_gap_inside_and_into_its_segments():
    """a: prefilled at 1, then a segment of two steps at 1.5 and 4.5 (gap 0.5 into it, 3 inside
    it): longest 3. b: all three tokens in one segment (gaps 1, 2): longest 2. c never ran: NaN,
    listed last so that its missing segments cannot borrow a neighbour's."""
    a, b, c = (Sequence(Request(i, 0.0, 4, n)) for i, n in ((0, 3), (1, 3), (2, 2)))
    a.advance(1, 1.0, 0.0, ends=np.array([1.0]))
    a.advance(2, 4.5, 1.0, ends=np.array([1.5, 4.5]))
    b.advance(3, 4.0, 0.0, ends=np.array([1.0, 2.0, 4.0]))
    table = ItlTable.of([a, b, c])
    assert table.maxima[:2].tolist() == [3.0, 2.0] and math.isnan(table.maxima[2])
    assert sorted(table.expanded().tolist()) == [0.5, 1.0, 2.0, 3.0]


def test_numbers_of_either_kind_give_float_seconds_and_int_lengths():
    """A loader may hand whole arrival times as integers and lengths as floats (a CSV cell "3.0"):
    requests still hold float seconds and int token counts, as a trace file writes them back."""
    trace = to_trace(Columns(np.array([0, 2]), np.array([4.0, 5.0]), np.array([3.0, 1.0])), "t", "spec:x")
    assert [(type(r.arrival_s), type(r.prompt_len), type(r.output_len)) for r in trace.requests] == [
        (float, int, int)
    ] * 2
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in trace.requests] == [(0.0, 4, 3), (2.0, 5, 1)]
