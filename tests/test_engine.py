"""The engine loop with real allocators and schedulers: lifecycle, policies, exactness."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engines import ENGINES, EngineOptions
from engines.arena import BuddyArena
from engines.contiguous import ContiguousAllocator, MaxReservation
from engines.paged import PagedAllocator
from engines.scheduler import Batch, IterationScheduler, RequestScheduler, SchedulerConfig
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.engine import Engine
from kvbench.errors import KvbenchError
from kvbench.metrics.occupancy import categories
from kvbench.requests import Request, Trace
from kvbench.sequence import SeqStatus, Sequence
from workloads import make_trace

ONE_SECOND_STEPS = CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.0)
ROOFLINE_LIKE = CostModel(fixed_s=0.02, per_token_s=1e-4, per_kv_token_s=5e-7)


def trace_of(*lengths: tuple[int, int], arrivals: list[float] | None = None) -> Trace:
    arrivals = arrivals or [0.0] * len(lengths)
    return Trace(
        "hand",
        tuple(Request(i, a, p, o) for i, ((p, o), a) in enumerate(zip(lengths, arrivals, strict=True))),
    )


def by_id(run):
    return {seq.seq_id: seq for seq in run.sequences}


def contiguous_max(num_slots: int, max_len: int) -> ContiguousAllocator:
    return ContiguousAllocator(BuddyArena(num_slots), MaxReservation(max_len))


def test_static_admits_nothing_until_its_batch_drains():
    trace = trace_of((4, 2), (4, 5), (4, 3), (4, 3))  # two fit at a time (16 slots each of 32)
    sched = RequestScheduler(contiguous_max(32, 16), SchedulerConfig())
    run = Engine(sched, CostModelRunner(ONE_SECOND_STEPS)).run(trace)
    seqs = by_id(run)
    assert seqs[0].finish_s == 2.0  # prefill at t=0..1, one decode
    assert seqs[1].finish_s == 5.0  # four decodes after its prefill
    # r0's memory is held until r1 finishes; the next batch starts only then
    assert seqs[2].admitted_s == seqs[3].admitted_s == 5.0
    assert all(seq.status is SeqStatus.FINISHED for seq in run.sequences)


def test_continuous_admits_as_soon_as_memory_frees():
    trace = trace_of((4, 2), (4, 5), (4, 3), (4, 3))
    sched = IterationScheduler(contiguous_max(32, 16), SchedulerConfig())
    seqs = by_id(Engine(sched, CostModelRunner(ONE_SECOND_STEPS)).run(trace))
    assert seqs[0].finish_s == 2.0
    assert seqs[2].admitted_s == 2.0  # takes r0's extent at the very next step
    assert seqs[3].admitted_s > seqs[2].admitted_s  # r3 waits for the next free extent


def test_paged_preempts_the_newest_and_resumes_it_by_recompute():
    # 4 blocks of 2 slots; each request needs 3 blocks by its end, both start together
    sched = IterationScheduler(PagedAllocator(8, 2, watermark=0.0), SchedulerConfig())
    run = Engine(sched, CostModelRunner(ONE_SECOND_STEPS)).run(trace_of((2, 4), (2, 4)))
    seqs = by_id(run)
    assert (seqs[0].num_preemptions, seqs[1].num_preemptions) == (0, 1)
    assert seqs[0].finish_s == 4.0  # never interrupted: prefill + 3 decodes
    assert seqs[1].finish_s == 5.0  # recomputes prompt + 3 tokens in one prefill, then done
    assert [seq.num_generated for seq in run.sequences] == [4, 4]
    preempted_rows = [row for row in run.steps if row.num_preempted]
    assert [row.step for row in preempted_rows] == [3]  # the step where r0 needed a third block


@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_request_finishes_with_exactly_its_output_length(engine):
    trace = make_trace("sharegpt-paper", 150, rate=20.0, seed=3)
    sched = ENGINES[engine].build(EngineOptions(num_slots=6000, max_len=2048))
    run = Engine(sched, CostModelRunner(ROOFLINE_LIKE)).run(trace)
    for seq in run.sequences:
        assert seq.status is SeqStatus.FINISHED
        assert seq.num_generated == seq.request.output_len
        assert seq.num_computed == seq.request.kv_len
        assert seq.request.arrival_s <= seq.admitted_s < seq.first_token_s <= seq.finish_s
    sched.allocator.check_integrity()
    empty = sched.allocator.footprint()
    assert (empty.tokens, empty.asked, empty.granted) == (0, 0, 0)
    assert not sched.has_work()
    # every row's categories partition the arena
    for row in run.steps:
        total = sum(getattr(row, name) for name in categories(empty, 0))
        assert total == 6000


def _comparable(run):
    return [(s.seq_id, s.admitted_s, s.first_token_s, s.finish_s, s.num_preemptions) for s in run.sequences]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_coalesced_segments_equal_step_by_step(engine):
    """Skipping identical decode steps changes nothing: times, preemptions, integrals."""
    trace = make_trace("sharegpt-paper", 120, rate=4.0, seed=11)
    runs = []
    for coalesce in (False, True):
        sched = ENGINES[engine].build(EngineOptions(num_slots=5000, max_len=2048, block_size=8))
        runs.append(Engine(sched, CostModelRunner(ROOFLINE_LIKE), coalesce=coalesce).run(trace))
    slow, fast = runs
    assert len(fast.steps) < len(slow.steps)  # it did skip
    assert sum(r.num_steps for r in fast.steps) == len(slow.steps)
    for a, b in zip(_comparable(slow), _comparable(fast), strict=True):
        assert a[0] == b[0] and a[4] == b[4]
        assert a[1:4] == pytest.approx(b[1:4], rel=1e-9, abs=1e-9)
    for totals in ("busy", "saturated"):
        x, y = getattr(slow, totals), getattr(fast, totals)
        assert x.seconds == pytest.approx(y.seconds, rel=1e-9)
        assert x.running_seconds == pytest.approx(y.running_seconds, rel=1e-9)
        for name in ("tokens", "target", "asked", "granted", "external"):
            assert getattr(x.footprint, name) == pytest.approx(getattr(y.footprint, name), rel=1e-9, abs=1e-6)
    assert slow.peak_running == fast.peak_running


def test_rows_at_segment_ends_match_the_step_by_step_rows():
    trace = make_trace("alpaca-paper", 200, rate=50.0, seed=5)
    runs = []
    for coalesce in (False, True):
        sched = ENGINES["paged"].build(EngineOptions(num_slots=2000, max_len=2048))
        runs.append(Engine(sched, CostModelRunner(ROOFLINE_LIKE), coalesce=coalesce).run(trace))
    slow, fast = runs
    by_last_step = {row.step: row for row in slow.steps}
    for row in fast.steps:
        twin = by_last_step[row.step + row.num_steps - 1]
        assert (twin.token_states, twin.reservation, twin.free) == (
            row.token_states,
            row.reservation,
            row.free,
        )
        assert (twin.num_waiting, twin.num_running, twin.num_preempted) == (
            row.num_waiting,
            row.num_running,
            row.num_preempted,
        )


def test_idle_gaps_are_skipped_and_not_counted_as_busy():
    trace = trace_of((4, 3), (4, 3), arrivals=[0.0, 100.0])
    sched = IterationScheduler(contiguous_max(64, 16), SchedulerConfig())
    run = Engine(sched, CostModelRunner(ONE_SECOND_STEPS)).run(trace)
    seqs = by_id(run)
    assert seqs[1].admitted_s == 100.0 and seqs[1].finish_s == 103.0
    assert run.busy.seconds == 6.0  # 3 steps each; the 97 s gap is idle


def test_arrival_during_a_segment_is_admitted_at_the_next_step_boundary():
    trace = trace_of((4, 10), (4, 2), arrivals=[0.0, 2.5])
    sched = IterationScheduler(contiguous_max(64, 16), SchedulerConfig())
    run = Engine(sched, CostModelRunner(ONE_SECOND_STEPS)).run(trace)
    assert by_id(run)[1].admitted_s == 3.0


def test_a_request_that_can_never_fit_is_refused_up_front():
    sched = IterationScheduler(contiguous_max(1000, 2048), SchedulerConfig())
    with pytest.raises(KvbenchError, match="cannot fit the KV arena of 1000 slots"):
        Engine(sched, CostModelRunner(ONE_SECOND_STEPS)).run(trace_of((4, 4)))


def test_cost_model_runner_stops_at_the_first_step_reaching_the_next_arrival():
    runner = CostModelRunner(CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.5))
    seq = Sequence(Request(0, 0.0, 10, 50))
    seq.advance(1, end_s=0.0)  # prefilled: 11 tokens known, 10 computed
    batch = Batch((seq,), is_prefill=False, num_tokens=1, num_context=11, steps_to_finish=49)
    durations = runner.run(batch, 20, 0.0, math.inf).durations
    assert len(durations) == 20
    assert list(durations[:3]) == [1.0 + 0.5 * 11, 1.0 + 0.5 * 12, 1.0 + 0.5 * 13]
    # steps end at 6.5, 13.5, 21.0 s: the first to reach the arrival is the last to run
    assert len(runner.run(batch, 20, 0.0, until_s=13.5).durations) == 2
    assert len(runner.run(batch, 20, 0.0, until_s=13.0).durations) == 2
    assert len(runner.run(batch, 20, 0.0, until_s=6.0).durations) == 1
    assert len(runner.run(batch, 1, 0.0, until_s=1e9).durations) == 1


class CheckingRunner(CostModelRunner):
    """The cost-model runner, asserting scheduler and allocator invariants before each step."""

    def __init__(self, cost: CostModel, scheduler, allocator=None) -> None:
        super().__init__(cost, lookahead=allocator)
        self.scheduler = scheduler
        self.calls = 0

    def run(self, batch, max_steps, start_s, until_s):
        self.scheduler.check_integrity()
        self.scheduler.allocator.check_integrity()
        self.calls += 1
        return super().run(batch, max_steps, start_s, until_s)


@pytest.mark.parametrize("engine", ["paged", "paged-static", "orca-pow2", "static", "vmm"])
@pytest.mark.parametrize("coalesce", [False, True])
def test_invariants_hold_at_every_step_under_heavy_preemption(engine, coalesce):
    trace = make_trace("sharegpt-paper", 80, rate=math.inf, seed=2)
    sched = ENGINES[engine].build(EngineOptions(num_slots=4100, max_len=2048, block_size=4))
    runner = CheckingRunner(ROOFLINE_LIKE, sched)
    run = Engine(sched, runner, coalesce=coalesce).run(trace)
    assert runner.calls == len(run.steps)
    if engine.startswith("paged") or engine == "vmm":
        assert sum(seq.num_preemptions for seq in run.sequences) > 10  # the case is exercised


@pytest.mark.parametrize("coalesce", [False, True])
def test_vmm_mapping_ahead_keeps_the_invariants_under_heavy_preemption(coalesce):
    """Pages reserved ahead (`VirtualAllocator.look_ahead`) and given up to other sequences'
    growth, released with preempted sequences, reclaimed from idle ranges: the allocator's and
    the scheduler's invariants hold before every step, and every request completes."""
    trace = make_trace("sharegpt-paper", 80, rate=math.inf, seed=2)
    sched = ENGINES["vmm"].build(EngineOptions(num_slots=4100, max_len=2048, block_size=4))
    runner = CheckingRunner(ROOFLINE_LIKE, sched, allocator=sched.allocator)
    run = Engine(sched, runner, coalesce=coalesce).run(trace)
    assert runner.calls == len(run.steps)
    assert all(seq.num_generated == seq.request.output_len for seq in run.sequences)
    alloc = sched.allocator
    assert sum(seq.num_preemptions for seq in run.sequences) > 10  # the case is exercised
    assert alloc.ahead_maps > 0 and alloc.ahead_unmaps > 0  # reserved, idle pages reclaimed for it
    if coalesce:  # long segments reserve far enough ahead for other sequences' growth to take it
        assert alloc.ahead_lost > 0
    alloc.check_integrity()


@pytest.mark.parametrize("engine", list(ENGINES))
def test_arrivals_on_step_boundaries_are_admitted_exactly_as_step_by_step(engine):
    """Grid timestamps (a replayed trace) land exactly on step ends; no rounding may shift them."""
    rng = np.random.default_rng(4)
    arrivals = np.round(np.cumsum(rng.integers(0, 8, 120)) * 0.1, 1)  # multiples of one step (0.1 s)
    lengths = zip(rng.integers(4, 200, 120).tolist(), rng.integers(1, 60, 120).tolist(), strict=True)
    trace = trace_of(*lengths, arrivals=arrivals.tolist())
    runs = []
    for coalesce in (False, True):
        sched = ENGINES[engine].build(EngineOptions(num_slots=4100, max_len=2048, block_size=8))
        cost = CostModel(fixed_s=0.1, per_token_s=0.0, per_kv_token_s=0.0)
        runs.append(Engine(sched, CostModelRunner(cost), coalesce=coalesce).run(trace))
    slow, fast = runs
    assert [(s.admitted_s, s.finish_s) for s in slow.sequences] == [
        (s.admitted_s, s.finish_s) for s in fast.sequences
    ]
    assert sum(r.num_steps for r in fast.steps) == len(slow.steps)


def test_static_counts_finished_but_held_slots_as_internal_fragmentation():
    # two requests of 16 reserved slots; r0 finishes after 2 steps and waits for r1 (5 steps)
    trace = trace_of((4, 2), (4, 5))
    sched = RequestScheduler(contiguous_max(32, 16), SchedulerConfig())
    run = Engine(sched, CostModelRunner(ONE_SECOND_STEPS), coalesce=False).run(trace)
    rows = {row.step: row for row in run.steps}
    assert rows[1].token_states == 5 + 5  # r0 finished in this step: its K/V was still read
    assert rows[2].token_states == 6 and rows[2].internal_frag == 16 + (16 - 8)  # r0's 16 slots are dead
    assert rows[2].reservation == 8 - 6  # r1 will still fill 2


@pytest.mark.parametrize("engine", ["paged", "paged-static"])
@pytest.mark.parametrize("host_blocks", [0, 40, 2_000])
def test_swap_preemption_keeps_invariants_and_equals_step_by_step(engine, host_blocks):
    trace = make_trace("sharegpt-paper", 80, rate=math.inf, seed=2)
    runs = []
    for coalesce in (False, True):
        options = EngineOptions(
            num_slots=4100, max_len=2048, block_size=4, host_blocks=host_blocks,
            scheduler=SchedulerConfig(preemption="swap"),
        )  # fmt: skip
        sched = ENGINES[engine].build(options)
        cost = CostModel(0.02, 1e-4, 5e-7, per_swap_block_s=1e-4)
        runs.append(Engine(sched, CheckingRunner(cost, sched), coalesce=coalesce).run(trace))
        assert not sched.has_work() and not sched.allocator._swapped
    slow, fast = runs
    for a, b in zip(_comparable(slow), _comparable(fast), strict=True):
        assert a[0] == b[0] and a[4] == b[4] and a[1:4] == pytest.approx(b[1:4], rel=1e-9)
    for seq in fast.sequences:
        assert seq.num_generated == seq.request.output_len
    swapped = max(row.num_swapped for row in slow.steps)
    assert (swapped > 0) == (host_blocks > 0)  # with no host room, swap falls back to recompute
    assert sum(seq.num_preemptions for seq in slow.sequences) > 10


class AheadRunner(CostModelRunner):
    """The cost model in a real runner's order: slots allocated before the run, trimmed after."""

    allocates_ahead = True

    def run(self, batch, max_steps, start_s, until_s):
        self.allocator.check_integrity()
        return super().run(batch, max_steps, start_s, until_s)


@pytest.mark.parametrize("engine", ["paged", "orca-oracle", "static", "vmm"])
def test_allocating_ahead_then_trimming_equals_allocating_after(engine):
    """Arrivals cut most segments short: every trimmed tail must leave no trace in the results."""
    trace = make_trace("sharegpt-paper", 120, rate=20.0, seed=5)
    runs = []
    for runner_type in (CostModelRunner, AheadRunner):
        sched = ENGINES[engine].build(EngineOptions(num_slots=6000, max_len=2048, block_size=8))
        runner = runner_type(ROOFLINE_LIKE)
        runner.allocator = sched.allocator
        runs.append(Engine(sched, runner).run(trace))
    after, ahead = runs
    assert after.steps == ahead.steps
    assert after.busy == ahead.busy
    assert sum(row.num_steps > 1 for row in ahead.steps) > 20  # multi-step segments were exercised
