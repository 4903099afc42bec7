"""Every metric kvbench reports, computed by hand from its definition on a hand-made timeline.

The definitions are those of docs/FOUNDATION.md and the docstrings of `kvbench.metrics.summary` and
`kvbench.metrics.occupancy`: TTFT = first token - arrival; E2EL = finish - arrival; TPOT =
(E2EL - TTFT) / (output - 1); ITL = gaps between consecutive tokens, pooled over the run;
queueing = admission - arrival; normalized latency = mean of E2EL / output; goodput = requests
meeting every SLO per second of makespan; batched requests and occupancy time-weighted over the
busy steps and over the saturated ones (a request waited when the step was scheduled).
Timelines run the real engine with 1 s steps, so every expected value is exact arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engines import ENGINES, EngineOptions
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.engine import Engine
from kvbench.metrics.latency import ItlTable
from kvbench.metrics.occupancy import Footprint, Growth, segment_integral
from kvbench.metrics.summary import Slo, latency_summary, prefix_cache_summary, request_record, summarize
from kvbench.requests import Request, Trace
from kvbench.sequence import Sequence, sequence_for

ONE_SECOND = CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.0)


def run_engine(engine: str, num_slots: int, *rows: tuple[float, int, int], max_len: int = 64):
    """The real engine over requests `(arrival_s, prompt_len, output_len)`; its run and records."""
    trace = Trace("hand", tuple(Request(i, a, p, o) for i, (a, p, o) in enumerate(rows)))
    sched = ENGINES[engine].build(EngineOptions(num_slots=num_slots, max_len=max_len))
    run = Engine(sched, CostModelRunner(ONE_SECOND)).run(trace)
    return run, [request_record(seq) for seq in run.sequences]


def test_request_metrics_from_their_timestamps():
    """Arrival 1, admitted 2, tokens at 3, 4, 5.5, 6; prompt 5 and output 4 differ so that a
    metric divided by the wrong length cannot pass."""
    seq = Sequence(Request(7, 1.0, 5, 4))
    seq.advance(1, 3.0, 2.0)
    seq.advance(3, 6.0, 3.0, ends=np.array([4.0, 5.5, 6.0]))
    r = request_record(seq)
    assert (r.arrival_s, r.admitted_s, r.first_token_s, r.finish_s) == (1.0, 2.0, 3.0, 6.0)
    assert r.queueing_s == 1.0  # admission - arrival, not first token - arrival
    assert r.ttft_s == 2.0  # first token - arrival, not - admission
    assert r.e2el_s == 5.0
    assert r.tpot_s == 1.0  # (5 - 2) / (4 - 1)
    assert r.normalized_latency_s == 1.25  # E2EL / output, not / prompt, kv_len or total
    assert r.max_itl_s == 1.5  # gaps 1, 1.5, 0.5
    assert (r.num_preemptions, r.num_outputs, r.prompt_len, r.output_len) == (0, 1, 5, 4)
    assert r.request_id == 7


def test_a_one_token_request_has_no_tpot_and_no_itl():
    seq = Sequence(Request(0, 0.5, 3, 1))
    seq.advance(1, 2.0, 1.0)
    r = request_record(seq)
    assert (r.queueing_s, r.ttft_s, r.e2el_s, r.normalized_latency_s) == (0.5, 1.5, 1.5, 1.5)
    assert math.isnan(r.tpot_s) and math.isnan(r.max_itl_s)


def test_a_request_with_several_outputs_finishes_with_its_last():
    """Parallel samples: one row, E2EL and TPOT to the last sample's last token, its first token
    and admission the leader's; every sample's tokens count as output."""
    leader = sequence_for(Request(0, 0.0, 4, 3, n=2))
    other = leader.group.members[1]
    leader.advance(1, 1.0, 0.0)
    other.copy_progress(leader)
    leader.advance(2, 3.0, 1.0, ends=np.array([2.0, 3.0]))
    other.advance(2, 5.0, 1.0, ends=np.array([4.0, 5.0]))
    r = request_record(leader)
    assert (r.admitted_s, r.first_token_s, r.finish_s, r.e2el_s, r.ttft_s) == (0.0, 1.0, 5.0, 5.0, 1.0)
    assert r.tpot_s == 2.0 and r.num_outputs == 2 and r.normalized_latency_s == 5.0 / 3


def test_preemptions_and_outputs_of_groups():
    """Parallel samples return n outputs and count every sample's preemptions; a beam search
    returns one output, and its beams are preempted together (counted once, the leader's)."""
    for beam in (False, True):
        leader = sequence_for(Request(0, 0.0, 4, 2, **({"beam_width": 2} if beam else {"n": 2})))
        other = leader.group.members[1]
        leader.advance(1, 1.0, 0.0)
        other.copy_progress(leader)
        other.preempt()
        other.num_computed = 4
        for seq in (leader, other):
            seq.advance(1, 2.0, 1.0)
        if beam:
            leader.num_preemptions = 1  # preempted with its group
        r = request_record(leader)
        assert (r.num_outputs, r.num_preemptions) == ((1, 1) if beam else (2, 1))


def test_itl_pools_gaps_where_tpot_averages_requests():
    """A: tokens at 1, 2, 3 (gaps 1, 1); B: tokens at 1, 5 (gap 4). Mean TPOT weighs requests,
    (1 + 4) / 2; mean ITL weighs gaps, (1 + 1 + 4) / 3."""
    a, b = Sequence(Request(0, 0.0, 4, 3)), Sequence(Request(1, 0.0, 4, 2))
    a.advance(1, 1.0, 0.0)
    a.advance(2, 3.0, 1.0, ends=np.array([2.0, 3.0]))
    b.advance(1, 1.0, 0.0)
    b.advance(1, 5.0, 4.0)
    done = [request_record(a), request_record(b)]
    s = latency_summary(done, ItlTable.of([a, b]), makespan=5.0)
    assert s["mean_tpot_s"] == 2.5 and s["mean_itl_s"] == 2.0
    assert s["mean_ttft_s"] == 1.0 and s["mean_e2el_s"] == 4.0 and s["mean_queueing_s"] == 0.0
    assert s["normalized_latency_s"] == (3.0 / 3 + 5.0 / 2) / 2


def test_itl_pools_every_gap_of_a_step_shared_by_a_batch():
    """a and b decode the same three steps (one shared `ends` array): each gap inside those
    steps is a gap of both, so it counts twice in the pool."""
    a, b = Sequence(Request(0, 0.0, 4, 4)), Sequence(Request(1, 0.0, 4, 4))
    shared = np.array([2.0, 4.0, 4.5])
    a.advance(1, 1.0, 0.0, ends=np.array([1.0]))
    b.advance(1, 1.5, 1.0, ends=np.array([1.5]))
    a.advance(3, 4.5, 1.5, ends=shared)
    b.advance(3, 4.5, 1.5, ends=shared)
    gaps = [1.0, 2.0, 0.5, 0.5, 2.0, 0.5]  # a's, then b's
    table = ItlTable.of([a, b])
    assert sorted(table.expanded()) == sorted(gaps)
    s = latency_summary([request_record(a), request_record(b)], table, makespan=4.5)
    assert s["mean_itl_s"] == pytest.approx(sum(gaps) / 6) and s["median_itl_s"] == 0.75


# orca-max, a roomy arena: r0 alone, r1 and r2 (arriving at 1.5) prefilled at 2-3 alone, then
# 3-4 all three decode (r1 done), 4-5 r0 and r2 decode (both done)
THREE = ((0.0, 4, 4), (1.5, 4, 2), (1.5, 4, 3))


def test_latencies_throughput_and_goodput_of_a_run():
    run, done = run_engine("orca-max", 1024, *THREE)
    assert [(r.admitted_s, r.first_token_s, r.finish_s) for r in done] == [
        (0.0, 1.0, 5.0), (2.0, 3.0, 4.0), (2.0, 3.0, 5.0),
    ]  # fmt: skip
    assert [r.queueing_s for r in done] == [0.0, 0.5, 0.5]
    assert [r.ttft_s for r in done] == [1.0, 1.5, 1.5]
    assert [r.e2el_s for r in done] == [5.0, 2.5, 3.5]
    assert [r.tpot_s for r in done] == [4.0 / 3, 1.0, 1.0]
    assert [r.max_itl_s for r in done] == [2.0, 1.0, 1.0]  # r0 waited out the others' prefill
    slo = Slo(ttft_s=1.2)
    s = summarize(run, done, slo=slo)
    assert s["makespan_s"] == 5.0 and s["busy_s"] == 5.0 and s["num_steps"] == 5
    assert s["request_throughput"] == 3 / 5
    assert s["output_token_throughput"] == 9 / 5 and s["total_token_throughput"] == 21 / 5
    assert s["mean_queueing_s"] == pytest.approx(1 / 3)
    assert s["normalized_latency_s"] == pytest.approx((5 / 4 + 2.5 / 2 + 3.5 / 3) / 3)
    # ITL pooled: r0's gaps 1, 2, 1; r1's 1; r2's 1, 1
    assert s["mean_itl_s"] == pytest.approx(7 / 6) and s["p50_itl_s"] == 1.0
    assert (s["good_requests"], s["goodput"], s["goodput_fraction"]) == (1, 1 / 5, 1 / 3)
    assert summarize(run, done, slo=Slo(tpot_s=1.0))["good_requests"] == 2  # on the bound meets it
    assert (s["num_requests"], s["completed"], s["num_slots"], s["percentiles"]) == (3, 3, 1024, [50, 90, 99])
    assert (s["num_preemptions"], s["preempted_requests"], s["slo"]) == (0, 0, {"ttft_s": 1.2})
    assert s["sharing_saved_fraction"] == s["sharing_saved_fraction_saturated"] == 0.0
    both = summarize(run, done, slo=Slo(ttft_s=2.0, e2el_s=3.0))
    assert (both["good_requests"], both["goodput"]) == (1, 1 / 5)  # only r1 meets both
    # batched requests: 1, 1, then 3 (r0 is resident during the prefill it sits out), 3, 2
    assert s["mean_batched_requests"] == 10 / 5 and s["peak_batched_requests"] == 3
    # nobody waited when a step was scheduled: no saturated time
    assert s["saturated_s"] == 0.0 and s["mean_batched_requests_saturated"] is None
    assert s["occupancy_saturated"] == {}


def test_static_occupancy_and_batching_busy_and_while_waiting():
    """Static, max-length extents of 64 in 256 slots. r0 (prompt 4, output 4: 7 slots) runs
    0-4; r1, r2 arrive at 1.5 and wait through 2-4 (saturated); they run 4-7, and r1, done at
    6, is held through 6-7: its 5 computed slots are then internal fragmentation."""
    run, done = run_engine("static", 256, *THREE)
    assert [(r.admitted_s, r.finish_s) for r in done] == [(0.0, 4.0), (4.0, 6.0), (4.0, 7.0)]
    s = summarize(run, done)
    # slot-seconds per step (1 s each): tokens computed, target (what will be filled), asked
    tokens = [4, 5, 6, 7, 8, 10, 6]  # 6-7: r2's 6, r1's 5 are dead
    target = [7, 7, 7, 7, 11, 11, 6]
    asked = [64, 64, 64, 64, 128, 128, 128]
    capacity = 256 * 7
    assert s["busy_s"] == 7.0 and s["saturated_s"] == 2.0
    assert s["occupancy"] == pytest.approx(
        {
            "token_states": sum(tokens) / capacity,
            "outside_window": 0,
            "reservation": (sum(target) - sum(tokens)) / capacity,
            "internal_frag": (sum(asked) - sum(target)) / capacity,
            "allocator_overhead": 0.0,
            "mapped_idle": 0.0,
            "external_frag": 0.0,
            "free": (capacity - sum(asked)) / capacity,
        },
        abs=1e-12,
    )
    waiting = slice(2, 4)  # steps 2-3 and 3-4
    capacity = 256 * 2
    assert s["occupancy_saturated"] == pytest.approx(
        {
            "token_states": sum(tokens[waiting]) / capacity,
            "outside_window": 0,
            "reservation": (sum(target[waiting]) - sum(tokens[waiting])) / capacity,
            "internal_frag": (sum(asked[waiting]) - sum(target[waiting])) / capacity,
            "allocator_overhead": 0.0,
            "mapped_idle": 0.0,
            "external_frag": 0.0,
            "free": (capacity - sum(asked[waiting])) / capacity,
        },
        abs=1e-12,
    )
    # running requests per step: r0 alone 4 s; r1 and r2 2 s; r2 alone (r1 held, not running) 1 s
    assert s["mean_batched_requests"] == pytest.approx((4 * 1 + 2 * 2 + 1) / 7)
    assert s["mean_batched_requests_saturated"] == 1.0


def test_oracle_overhead_and_external_fragmentation():
    """Oracle in a 16-slot buddy arena: r0 asks 7 slots, is granted 8 (1 of overhead); r1 (13
    slots, granted 16) waits 0-4 and the 8 free slots, too small for it, are external
    fragmentation; then r1 runs 4-8 alone with 3 slots of overhead."""
    run, done = run_engine("orca-oracle", 16, (0.0, 4, 4), (0.0, 10, 4))
    assert [(r.admitted_s, r.finish_s) for r in done] == [(0.0, 4.0), (4.0, 8.0)]
    s = summarize(run, done)
    tokens, target, granted, external = 4 + 5 + 6 + 7, 4 * 7, 4 * 8, 4 * 8  # 0-4
    busy = {
        "token_states": tokens + 10 + 11 + 12 + 13,
        "outside_window": 0,
        "reservation": target - tokens + 4 * 13 - (10 + 11 + 12 + 13),
        "internal_frag": 0,
        "allocator_overhead": granted - target + 4 * (16 - 13),
        "mapped_idle": 0,
        "external_frag": external,
        "free": 0,
    }
    assert s["occupancy"] == pytest.approx({k: v / (16 * 8) for k, v in busy.items()}, abs=1e-12)
    waiting = {
        "token_states": tokens,
        "outside_window": 0,
        "reservation": target - tokens,
        "internal_frag": 0,
        "allocator_overhead": granted - target,
        "mapped_idle": 0,
        "external_frag": external,
        "free": 0,
    }
    assert s["occupancy_saturated"] == pytest.approx({k: v / (16 * 4) for k, v in waiting.items()}, abs=1e-12)
    assert s["saturated_s"] == 4.0 and s["mean_batched_requests_saturated"] == 1.0


def test_makespan_runs_from_the_first_arrival():
    run, done = run_engine("orca-max", 1024, (1.0, 4, 2), (1.0, 4, 3))  # idle until 1.0
    s = summarize(run, done)
    assert [r.finish_s for r in done] == [3.0, 4.0]
    assert s["makespan_s"] == 3.0 and s["busy_s"] == 3.0 and s["request_throughput"] == 2 / 3


def test_preempted_requests_and_preemptions_of_a_run():
    """Paged, 4 blocks of 2 slots, two requests needing 3 blocks each by their end: the newer
    is preempted once (when the older needs its third block) and recomputed."""
    trace = Trace("hand", (Request(0, 0.0, 2, 4), Request(1, 0.0, 2, 4)))
    options = EngineOptions(num_slots=8, max_len=64, block_size=2, watermark=0.0)
    run = Engine(ENGINES["paged"].build(options), CostModelRunner(ONE_SECOND)).run(trace)
    done = [request_record(seq) for seq in run.sequences]
    assert [r.num_preemptions for r in done] == [0, 1]
    s = summarize(run, done)
    assert (s["num_preemptions"], s["preempted_requests"]) == (1, 1)


def test_every_sample_counts_as_output():
    """Two parallel samples of 3 tokens each: 6 output tokens, one request."""
    trace = Trace("hand", (Request(0, 0.0, 6, 3, n=2),))
    options = EngineOptions(num_slots=1024, max_len=64, block_size=4, watermark=0.0)
    run = Engine(ENGINES["paged"].build(options), CostModelRunner(ONE_SECOND)).run(trace)
    done = [request_record(seq) for seq in run.sequences]
    s = summarize(run, done)
    assert done[0].num_outputs == 2 and s["makespan_s"] == 3.0
    assert s["output_token_throughput"] == 6 / 3 and s["request_throughput"] == 1 / 3
    # slots saved over slots held without sharing, time-weighted: 0-1 the prompt's 2 blocks
    # (8 slots held, 8 saved once forked), 1-2 and 2-3 the first block still shared (12, 4)
    assert s["sharing_saved_fraction"] == pytest.approx((8 + 4 + 4) / ((8 + 12 + 12) + (8 + 4 + 4)))


def test_prefix_cache_hit_rate_is_hit_tokens_over_prompt_tokens():
    seqs = [Sequence(Request(i, 0.0, p, 2)) for i, p in enumerate((40, 24))]
    seqs[0].num_cached_tokens = 32
    for seq in seqs:
        seq.advance(2, 1.0, 0.0)
    done = [request_record(seq) for seq in seqs]
    assert prefix_cache_summary(done) == {"prefix_hit_tokens": 32, "prefix_cache_hit_rate": 32 / 64}
    assert prefix_cache_summary([]) == {"prefix_hit_tokens": 0, "prefix_cache_hit_rate": 0.0}


def test_occupancy_integral_of_a_segment_by_hand():
    """Three decode steps of 1, 2 and 4 s; 2 tokens computed per step; 4 slots grown (2 of
    them below the final lengths) before steps 1 and 2. Each step's footprint is the end's
    less what was computed and grown after it; the integral weighs it by its duration."""
    end = Footprint(tokens=10, target=12, asked=16, granted=16, external=3, idle=5)
    growth = Growth(asked=np.array([0, 4, 4]), target=np.array([0, 2, 2]))
    got = segment_integral(end, np.array([1.0, 2.0, 4.0]), 2, growth)
    steps = [  # (tokens, target, asked) during each step, and its duration
        (6, 8, 8, 1.0),
        (8, 10, 12, 2.0),
        (10, 12, 16, 4.0),
    ]
    tokens, target, asked = (sum(step[i] * step[3] for step in steps) for i in range(3))
    assert got == Footprint(tokens, target, asked, asked, external=3 * 7, idle=5 * 7)
    assert (tokens, target, asked) == (62, 76, 96)
    # one step: the end's footprint times its duration; sums add field by field
    assert segment_integral(end, np.array([2.0]), 2, None) == Footprint(20, 24, 32, 32, 6, 10)
    assert end + end == end.scaled(2.0)
