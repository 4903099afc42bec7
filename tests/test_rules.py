"""Each engine's defining rules, tested directly: admission, release, reservation and fit.

Every timeline here runs the real `Engine` and scheduler over the real allocator with a
`CostModelRunner` whose constants make every step last exactly 1 s (and a copied slot 0.25 s),
so admission, first-token and finish times are exact. The arena is roomy: memory never decides
who runs, so only the scheduling rule can produce the expected times (a test whose arena holds
half the requests would pass for a broken rule, memory alone enforcing the timeline).
"""

from __future__ import annotations

import pytest

from engines import ENGINES, EngineOptions
from engines.arena import BuddyArena, FirstFitArena
from engines.contiguous import (
    ContiguousAllocator,
    MaxReservation,
    OracleReservation,
    Pow2Reservation,
)
from engines.paged import PagedAllocator
from engines.scheduler import IterationScheduler, SchedulerConfig
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.engine import Engine
from kvbench.requests import Request, Trace
from kvbench.sequence import SeqStatus, sequence_for

ONE_SECOND = CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.0, per_copy_slot_s=0.25)
ROOMY = 4096  # slots: every request of these traces fits many times over
STATIC = ("static", "paged-static")
ITERATION = tuple(name for name in ENGINES if name not in STATIC)


def trace(*rows: tuple[float, int, int], **sharing) -> Trace:
    """Requests `(arrival_s, prompt_len, output_len)`, ids in order; `sharing` applies to all."""
    return Trace("rules", tuple(Request(i, a, p, o, **sharing) for i, (a, p, o) in enumerate(rows)))


def run(engine: str, requests: Trace, *, coalesce: bool = True, **config):
    options = EngineOptions(
        num_slots=ROOMY, max_len=64, block_size=4, watermark=0.0, scheduler=SchedulerConfig(**config)
    )
    sched = ENGINES[engine].build(options)
    result = Engine(sched, CostModelRunner(ONE_SECOND), coalesce=coalesce).run(requests)
    assert all(seq.status is SeqStatus.FINISHED for seq in result.sequences)
    return result


def times(result) -> list[tuple[float, float, float]]:
    """(admitted, first token, finish) of every request, in id order."""
    return [(s.admitted_s, s.first_token_s, s.finish_s) for s in result.sequences]


# r0 runs alone from t=0; r1 and r2 arrive at 1.5 s, while r0 is still decoding
THREE = trace((0.0, 4, 4), (1.5, 4, 2), (1.5, 4, 3))


@pytest.mark.parametrize("engine", ITERATION)
@pytest.mark.parametrize("coalesce", [True, False])
def test_iteration_level_admits_at_the_next_step_and_prefills_alone(engine, coalesce):
    # 0-1 prefill r0 | 1-2 decode r0 (r1, r2 arrive at 1.5) | 2-3 prefill r1+r2 alone, r0 waits
    # | 3-4 decode all (r1 done) | 4-5 decode r0, r2 (both done)
    assert times(run(engine, THREE, coalesce=coalesce)) == [(0.0, 1.0, 5.0), (2.0, 3.0, 4.0), (2.0, 3.0, 5.0)]


@pytest.mark.parametrize("engine", STATIC)
@pytest.mark.parametrize("coalesce", [True, False])
def test_static_admits_only_once_its_whole_batch_has_finished(engine, coalesce):
    # r0 alone until 4.0 although the arena could hold hundreds; then r1 and r2 as one batch
    assert times(run(engine, THREE, coalesce=coalesce)) == [(0.0, 1.0, 4.0), (4.0, 5.0, 6.0), (4.0, 5.0, 7.0)]


def test_static_does_not_fill_the_seat_of_a_finished_member():
    # r0 finishes at 2.0 and r1 at 4.0; r2 (arrived at 0.5) waits for r1, not for r0's seat
    requests = trace((0.0, 4, 2), (0.0, 4, 4), (0.5, 4, 2))
    for engine in STATIC:
        result = run(engine, requests, coalesce=False)
        assert times(result)[2] == (4.0, 5.0, 6.0)
        if engine == "static":  # both extents held until 4; then r2's alone: none leaked
            assert held_by_step(result) == [128, 128, 128, 128, 64, 64]


def test_a_group_waits_until_all_its_outputs_have_seats():
    """Two parallel samples need two of --max-num-seqs 2 seats: they wait for r0 to finish,
    although one seat is free (and memory is plentiful)."""
    requests = Trace("rules", (Request(0, 0.0, 4, 3), Request(1, 0.0, 4, 2, n=2)))
    for engine in ITERATION:
        result = run(engine, requests, max_num_seqs=2)
        assert times(result)[1][0] == 3.0, engine
        assert result.peak_running == 2


@pytest.mark.parametrize("engine", ITERATION)
def test_each_step_feeds_and_attends_what_its_kind_says(engine):
    """Rows of the timeline above: a prefill feeds the new prompts (4 tokens each) and attends
    them; a decode feeds one token per running request and attends every computed token."""
    result = run(engine, THREE, coalesce=False)
    rows = [(row.kind, row.batch_size, row.num_tokens, row.context_tokens) for row in result.steps]
    assert rows == [
        ("prefill", 1, 4, 4),
        ("decode", 1, 1, 5),
        ("prefill", 2, 8, 8),
        ("decode", 3, 3, 6 + 5 + 5),
        ("decode", 2, 2, 7 + 6),
    ]


def held_by_step(result) -> list[int]:
    """Slots owned by requests after each step (step by step: one row per step)."""
    assert all(row.num_steps == 1 for row in result.steps)
    return [result.num_slots - row.free - row.external_frag - row.mapped_idle for row in result.steps]


RELEASES = [
    # max-length extents (64 slots each): r1's goes back after 3-4, the step it finished in
    ("orca-max", [64, 64, 192, 192, 128]),
    # prompt 4 + output rounded to a power of two - 1 (7, 5, 7), each granted 8 by the buddy
    ("orca-pow2", [8, 8, 24, 24, 16]),
    ("orca-oracle", [8, 8, 24, 24, 16]),
    # blocks of 4 as the tokens need them; r1's two blocks return after 3-4
    ("paged", [4, 8, 16, 24, 16]),
    ("paged-prefix", [4, 8, 16, 24, 16]),
    # one KV group (every layer full attention): blocks as paged's
    ("hybrid", [4, 8, 16, 24, 16]),
    ("jenga", [4, 8, 16, 24, 16]),
    ("hybrid-prefix", [4, 8, 16, 24, 16]),  # nothing cached to share: held as hybrid's
    ("jenga-prefix", [4, 8, 16, 24, 16]),
    # pages of 4 as the tokens need them; r1's two go back mapped idle (deferred reclamation)
    ("vmm", [4, 8, 16, 24, 16]),
    # static: r0's extent is held through 3-4, then r1's is held after it finished (6-7)
    ("static", [64, 64, 64, 64, 128, 128, 128]),
    ("paged-static", [4, 8, 8, 8, 8, 16, 16]),
]


@pytest.mark.parametrize(("engine", "held"), RELEASES)
def test_memory_is_released_when_the_engine_says(engine, held):
    """Iteration-level engines free a request's memory the step it finishes; static batches
    hold every member's until the whole batch has finished."""
    result = run(engine, THREE, coalesce=False)
    assert held_by_step(result) == held
    idle = [row.mapped_idle for row in result.steps]
    assert idle == ([0, 0, 0, 0, 8] if engine == "vmm" else [0] * len(held))


def test_every_engine_has_its_release_rule_tested():
    tested = {name for name, _ in RELEASES}
    assert tested == set(ENGINES)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_max_num_seqs_caps_the_running_requests(engine):
    requests = trace((0.0, 4, 2), (0.0, 4, 3), (0.0, 4, 2))
    result = run(engine, requests, max_num_seqs=2)
    if engine in STATIC:  # a batch of two; the third only when both have finished (3.0)
        assert times(result) == [(0.0, 1.0, 2.0), (0.0, 1.0, 3.0), (3.0, 4.0, 5.0)]
    else:  # the third takes r0's seat at the step after r0 finished, prefilled alone
        assert times(result) == [(0.0, 1.0, 2.0), (0.0, 1.0, 4.0), (2.0, 3.0, 4.0)]
    assert result.peak_running == 2


@pytest.mark.parametrize("engine", ITERATION)
def test_max_num_batched_tokens_caps_a_prefill_step(engine):
    # prompts of 4 under a cap of 8: r0 and r1 prefill together, r2 alone in the next step
    requests = trace((0.0, 4, 2), (0.0, 4, 2), (0.0, 4, 2))
    result = run(engine, requests, max_num_batched_tokens=8)
    assert times(result) == [(0.0, 1.0, 3.0), (0.0, 1.0, 3.0), (1.0, 2.0, 3.0)]


# --- reservations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output_len", "reserved"),
    [(1, 10), (2, 11), (3, 13), (25, 41), (32, 41), (33, 73), (200, 100)],
)
def test_pow2_reserves_the_prompt_plus_the_output_rounded_up_to_a_power_of_two(output_len, reserved):
    """Prompt 10: the output's next power of two, minus the never-stored last token; at most
    the model's maximum length (100 here: output 200 would otherwise ask for 265)."""
    assert Pow2Reservation(100).slots(Request(0, 0.0, 10, output_len)) == reserved


def test_pow2_cap_decides_what_fits():
    # prompt 10 + output 30: 10 + 32 - 1 = 41 uncapped, 40 under a cap of 40: fits 40 slots
    request = Request(0, 0.0, 10, 30)
    capped = ContiguousAllocator(FirstFitArena(40), Pow2Reservation(40))
    assert capped.can_ever_hold(request)
    assert not ContiguousAllocator(FirstFitArena(40), Pow2Reservation(80)).can_ever_hold(request)


def test_max_and_oracle_reserve_what_they_say():
    request = Request(0, 0.0, 10, 7)
    assert MaxReservation(64).slots(request) == 64
    assert OracleReservation().slots(request) == 16 == request.kv_len


# --- what fits: beams and samples ------------------------------------------------------------


@pytest.mark.parametrize(
    "allocator",
    [
        lambda: ContiguousAllocator(BuddyArena(64), MaxReservation(16)),  # 4 extents of 16
        lambda: ContiguousAllocator(BuddyArena(64), OracleReservation()),  # kv_len 15 -> 16
        lambda: ContiguousAllocator(FirstFitArena(63), OracleReservation()),  # 4 x 15, 3 spare
    ],
)
@pytest.mark.parametrize("sharing", ["n", "beam_width"])
def test_contiguous_can_ever_hold_counts_every_output(allocator, sharing):
    """A contiguous engine reserves one extent per output at admission: n samples and k beams
    fit an empty arena only if that many extents do."""
    alloc = allocator()
    assert alloc.can_ever_hold(Request(0, 0.0, 8, 8, **{sharing: 4}))
    assert not alloc.can_ever_hold(Request(0, 0.0, 8, 8, **{sharing: 5}))


def test_paged_can_ever_hold_counts_every_beam():
    """k beams run together and may share nothing by their end: k x blocks of the final length
    must fit under the watermark. Parallel samples run alone once forked (one preempted sample
    does not stop the others), so n does not multiply."""
    alloc = PagedAllocator(64, 4, watermark=0.0)  # 16 blocks; kv_len 15 needs 4
    assert alloc.can_ever_hold(Request(0, 0.0, 8, 8, beam_width=4))
    assert not alloc.can_ever_hold(Request(0, 0.0, 8, 8, beam_width=5))
    assert alloc.can_ever_hold(Request(0, 0.0, 8, 8, n=5))
    watermarked = PagedAllocator(64, 4, watermark=0.25)  # 4 blocks kept free: 12 usable
    assert watermarked.can_ever_hold(Request(0, 0.0, 8, 8, beam_width=3))
    assert not watermarked.can_ever_hold(Request(0, 0.0, 8, 8, beam_width=4))
    assert not watermarked.can_ever_hold(Request(0, 0.0, 40, 10))  # 49 slots: 13 blocks


def test_buddy_can_fit_many_counts_the_splits_of_every_free_block():
    arena = BuddyArena(64)
    arena.alloc(16)  # free: 16 at 16, 32 at 32
    assert arena.can_fit_many(16, 3) and not arena.can_fit_many(16, 4)
    assert arena.can_fit_many(9, 3) and not arena.can_fit_many(9, 4)  # 9 is granted 16
    assert arena.can_fit_many(17, 1) and not arena.can_fit_many(17, 2)
    assert arena.can_fit_many(4, 12) and not arena.can_fit_many(4, 13)
    uneven = BuddyArena(48)  # 32 + 16, never merged
    assert uneven.can_fit_many(16, 3) and not uneven.can_fit_many(16, 4)
    assert not uneven.can_fit_many(33, 1)


def test_first_fit_can_fit_many_counts_whole_extents_per_run():
    arena = FirstFitArena(50)
    first = arena.alloc(10)
    arena.alloc(10)
    third = arena.alloc(10)
    arena.release(first)
    arena.release(third)  # free runs: [0, 10) and [20, 50): 10 and 30 slots
    assert arena.free_runs() == [(0, 10), (20, 30)]
    assert arena.can_fit_many(10, 4) and not arena.can_fit_many(10, 5)
    assert arena.can_fit_many(8, 4) and not arena.can_fit_many(8, 5)  # 1 + 3, not 40 // 8
    assert not arena.can_fit_many(31, 1)


@pytest.mark.parametrize("fit", [BuddyArena, FirstFitArena])
@pytest.mark.parametrize("sharing", ["n", "beam_width"])
def test_a_group_is_admitted_only_if_every_output_fits(fit, sharing):
    alloc = ContiguousAllocator(fit(64), MaxReservation(16))
    alloc.allocate(sequence_for(Request(9, 0.0, 4, 4)))  # one extent of 16 taken: 3 left
    assert alloc.can_allocate(sequence_for(Request(0, 0.0, 4, 4, **{sharing: 3})))
    assert not alloc.can_allocate(sequence_for(Request(1, 0.0, 4, 4, **{sharing: 4})))


# --- copy-on-write -----------------------------------------------------------------------------


def test_the_first_write_into_a_shared_block_copies_it():
    """Two parallel samples share the leader's blocks after its prefill (6 tokens: blocks of 4,
    the second half full); the first decode writes position 6 into the shared second block,
    so one sample copies it first. The copy (4 slots x 0.25 s) makes that step 2 s long."""
    requests = trace((0.0, 6, 3), n=2)
    for engine in ("paged", "paged-prefix"):
        result = run(engine, requests, coalesce=False)
        (leader,) = result.sequences
        assert [member.finish_s for member in leader.group.members] == [4.0, 4.0]
        assert [row.duration_s for row in result.steps] == [1.0, 2.0, 1.0]


def test_copy_on_write_through_the_batched_append_path():
    """`append_all` (every decode step's fast path) must copy shared blocks before a write, or
    hand the step back to the per-sequence path that does."""
    alloc = PagedAllocator(64, 4, watermark=0.0)
    sched = IterationScheduler(alloc, SchedulerConfig())
    leader = sequence_for(Request(0, 0.0, 6, 3, n=2))
    sched.add(leader)
    prefill = sched.schedule()
    leader.advance(1, 1.0, 0.0)
    sched.branch(prefill, None)
    child = leader.group.members[1]
    assert alloc.addressing(leader).blocks == alloc.addressing(child).blocks == (0, 1)
    decode = sched.schedule()
    assert not decode.is_prefill and decode.block_copies == ((1, 2),)
    tables = {alloc.addressing(seq).blocks for seq in (leader, child)}
    assert tables == {(0, 1), (0, 2)}  # the first block still shared, the second now apart
    assert decode.copied_slots == 4
    alloc.check_integrity()
