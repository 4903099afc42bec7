"""Engine mechanics pinned state by state: what mutation testing of `engines/` found unpinned.

Each test drives the real allocator, arena and scheduler by hand (one call per step, as
`kvbench.engine.Engine` makes them) on a few slots, and asserts the exact state after each
call: which extent or block each sequence holds, who runs, who waits and in what order, and
every field of the batch a step gets. docs/MUTATION.md says why such tests exist; the
mutants they kill, and those that are equivalent, are in results/mutation/engines-core/.
"""

from __future__ import annotations

import math
import random
from collections import deque
from fractions import Fraction

import numpy as np
import pytest

from engines import ENGINES, EngineOptions, get_engine
from engines.allocator import Extent, address_slots
from engines.arena import BuddyArena, FirstFitArena
from engines.batch import Batch, SchedulerConfig
from engines.beam import SyntheticScores, assign_slots, beam_step
from engines.contiguous import ContiguousAllocator, MaxReservation, OracleReservation
from engines.groups import admission_unit, candidates_per_beam, groups_in, seats_taken, unit_start
from engines.paged import PagedAllocator
from engines.preemption import _requeue
from engines.scheduler import IterationScheduler, RequestScheduler
from kvbench.errors import KvbenchError
from kvbench.requests import Request
from kvbench.sequence import SeqStatus, Sequence, sequence_for


def seq(request_id: int, prompt: int, output: int, arrival: float = 0.0, **sharing) -> Sequence:
    return sequence_for(Request(request_id, arrival, prompt, output, **sharing))


def step(sched, batch: Batch, t: float) -> list[Sequence]:
    """Run `batch` as one step from `t` to `t + 1` (as `Engine.run` does); the finished."""
    finished = [s for s in batch.seqs if s.advance(1, t + 1.0, t)]
    if batch.has_groups:
        sched.branch(batch, None)
    sched.update(finished)
    return finished


def fields(batch: Batch) -> tuple:
    return (
        batch.is_prefill,
        batch.num_tokens,
        batch.num_context,
        batch.steps_to_finish,
        batch.block_copies,
        batch.swaps,
        batch.slot_copies,
        batch.copied_slots,
        batch.has_groups,
    )


# ------------------------------------------------------------------ arenas


@pytest.mark.parametrize("make", [BuddyArena, FirstFitArena])
def test_an_arena_names_a_grant_its_caller_does_not_know(make):
    arena = make(16)
    start = arena.alloc(4)
    arena.check_integrity({start: 4})  # the caller's view agrees: no complaint
    with pytest.raises(AssertionError, match="^grants differ$"):
        arena.check_integrity({})


def test_buddy_grants_stay_smallest_then_lowest_through_a_long_seeded_run():
    # 400 seeded grants and releases on 16 slots: long enough for the stale-entry compaction of
    # the free heaps to run while they also hold live blocks
    rng = random.Random(46)
    arena = BuddyArena(rng.choice([16, 32, 64, 128]))
    held: list[int] = []
    for _ in range(400):
        if held and (rng.random() < 0.5 or not arena.can_fit(1)):
            arena.release(held.pop(rng.randrange(len(held))))
            continue
        size = rng.choice([1, 1, 1, 2, 3, 5])
        if not arena.can_fit(size):
            continue
        grant = arena.grant_size(size)
        expected = min((z, s) for s, z in arena.free_blocks() if z >= grant)[1]
        assert arena.alloc(size) == expected
        held.append(expected)


# ------------------------------------------------------------------ contiguous groups


def test_a_contiguous_group_reserves_every_output_and_gives_all_back_with_its_last_member():
    arena = FirstFitArena(100)
    alloc = ContiguousAllocator(arena, OracleReservation())
    leader = seq(0, 4, 3, n=3)  # kv_len 6: three extents of 6 slots
    one, two = leader.group.members[1:]
    other = seq(1, 2, 2, n=2)  # kv_len 3: a second group beside the first
    assert alloc.can_allocate(leader)
    alloc.allocate(leader)
    alloc.allocate(other)
    assert arena.free_runs() == [(24, 76)]
    assert alloc.addressing(leader) == Extent(0, 6, 6)
    assert alloc.addressing(other) == Extent(18, 3, 3)
    fp = alloc.footprint()
    assert (fp.tokens, fp.target, fp.asked, fp.granted) == (0, 24, 24, 24)
    leader.advance(1, 1.0, 0.0)  # the prompt's prefill: 4 slots computed
    one.copy_progress(leader)
    two.copy_progress(leader)
    # members take the pool's extents in the order they were granted
    assert alloc.fork(leader, one) == [(0, 6, 4)]
    assert alloc.fork(leader, two) == [(0, 12, 4)]
    assert alloc.addressing(one) == Extent(6, 6, 6)
    assert alloc.addressing(two) == Extent(12, 6, 6)
    alloc.check_integrity()
    assert alloc.footprint().tokens == 12
    # members leave one by one: the reservation stays until the last one leaves
    for member in (one, leader):
        alloc.free(member)
        alloc.check_integrity()
        assert arena.free_runs() == [(24, 76)]
        fp = alloc.footprint()
        assert (fp.target, fp.asked, fp.granted) == (24, 24, 24)
    alloc.free(two)
    alloc.check_integrity()
    assert arena.free_runs() == [(0, 18), (24, 76)]
    fp = alloc.footprint()
    assert (fp.tokens, fp.target, fp.asked, fp.granted) == (0, 6, 6, 6)
    alloc.free(other.group.leader)  # a group that never forked: its pool goes with the leader
    alloc.check_integrity()
    assert arena.free_runs() == [(0, 100)]
    fp = alloc.footprint()
    assert (fp.tokens, fp.target, fp.asked, fp.granted) == (0, 0, 0, 0)


@pytest.mark.parametrize("make", [BuddyArena, FirstFitArena])
def test_a_contiguous_group_of_two_needs_two_extents_free(make):
    # 8 slots: one extent of 6 (buddy: 8) fits, two do not
    alloc = ContiguousAllocator(make(8 if make is BuddyArena else 11), OracleReservation())
    assert not alloc.can_allocate(seq(0, 4, 3, n=2))
    assert alloc.can_allocate(seq(1, 4, 3))
    alloc = ContiguousAllocator(make(16 if make is BuddyArena else 12), OracleReservation())
    assert alloc.can_allocate(seq(0, 4, 3, n=2))


def test_a_contiguous_allocator_admits_a_whole_group_only_where_every_extent_fits():
    alloc = ContiguousAllocator(FirstFitArena(17), OracleReservation())
    members = seq(0, 4, 3, beam_width=3).group.members  # three extents of 6 slots
    assert not alloc.can_allocate_all(members)
    assert alloc.can_allocate_all(members[:2])
    alloc = ContiguousAllocator(FirstFitArena(18), OracleReservation())
    assert alloc.can_allocate_all(members)
    assert alloc.can_allocate_all(members[:1])
    assert not ContiguousAllocator(FirstFitArena(5), OracleReservation()).can_allocate_all(members[:1])
    with pytest.raises(AssertionError, match="^one request's sequences at a time$"):
        alloc.can_allocate_all([members[0], seq(1, 4, 3)])


def test_a_contiguous_check_names_a_sequence_past_its_reservation():
    alloc = ContiguousAllocator(FirstFitArena(32), MaxReservation(8))
    lone, long = seq(0, 4, 3), seq(1, 4, 6)  # kv_len 6 fits 8 slots; kv_len 9 does not
    alloc.allocate(lone)
    lone.advance(3, 1.0, 0.0)
    assert alloc.append(lone) == []
    alloc.check_integrity()
    lone.advance(3, 2.0, 1.0)  # driven past its output: 9 computed tokens in 8 slots
    with pytest.raises(AssertionError, match="^sequence outgrew its reservation$"):
        alloc.append(lone)
    with pytest.raises(AssertionError, match="^seq 0 overflows its extent$"):
        alloc.check_integrity()
    alloc.free(lone)
    alloc.allocate(long)
    with pytest.raises(AssertionError, match="^seq 1 under-reserved$"):
        alloc.check_integrity()


def test_contiguous_extents_are_never_swapped():
    alloc = ContiguousAllocator(FirstFitArena(16), OracleReservation())
    lone = seq(0, 4, 3)
    alloc.allocate(lone)
    assert (alloc.can_swap_out(lone), alloc.can_swap_in(lone)) == (False, False)
    for move in (alloc.swap_out, alloc.swap_in):
        with pytest.raises(NotImplementedError, match="^contiguous extents are never swapped$"):
            move(lone)


def test_the_addresses_an_arena_spans():
    options = EngineOptions(num_slots=64, max_len=32, block_size=4)
    assert address_slots(ENGINES["paged"].build(options).allocator) == 64
    vmm = ENGINES["vmm"].build(options).allocator
    assert address_slots(vmm) == vmm.virtual_slots == 256 * 32  # a 32-slot range per running sequence


# ------------------------------------------------------------------ engine table


def test_engine_options_reach_the_allocator():
    options = EngineOptions(
        num_slots=64, max_len=32, block_size=4, watermark=0.25, host_blocks=3, hash_block_size=8
    )
    paged = ENGINES["paged"].build(options).allocator
    assert (paged.num_slots, paged.block_size, paged.watermark_blocks, paged.num_host_blocks) == (64, 4, 4, 3)
    prefix = ENGINES["paged-prefix"].build(options).allocator
    assert (prefix.block_size, prefix.watermark_blocks, prefix.num_host_blocks, prefix.hash_block_size) == (
        4,
        4,
        3,
        8,
    )


def test_vmm_options_reach_its_allocator():
    vmm = (
        ENGINES["vmm"].build(EngineOptions(num_slots=64, max_len=32, block_size=4, watermark=0.25)).allocator
    )
    # pages of a block (4 slots), as many as the slots hold, a range per running sequence
    assert (vmm.page_tokens, vmm.num_pages, vmm.max_requests, vmm.watermark_pages) == (4, 16, 256, 4)
    assert vmm.range_slots == 32
    options = EngineOptions(
        num_slots=64,
        max_len=32,
        block_size=4,
        page_tokens=Fraction(1, 2),
        num_pages=10,
        scheduler=SchedulerConfig(max_num_seqs=3),
    )
    vmm = ENGINES["vmm"].build(options).allocator
    assert (vmm.page_tokens, vmm.num_pages, vmm.max_requests, vmm.watermark_pages) == (
        Fraction(1, 2),
        10,
        3,
        0,
    )
    options = EngineOptions(num_slots=64, max_len=32, block_size=4, page_tokens=Fraction(3, 2))
    assert ENGINES["vmm"].build(options).allocator.num_pages == 42  # 64 / 1.5, rounded down


def test_an_unknown_engine_is_refused_naming_the_choices():
    assert get_engine("paged") is ENGINES["paged"]
    with pytest.raises(KvbenchError) as error:
        get_engine("pagd")
    assert str(error.value) == (
        "unknown --engine 'pagd'; choose one of: static, orca-max, orca-pow2, orca-oracle, paged, "
        "paged-static, paged-prefix, vmm, hybrid, jenga, hybrid-prefix, jenga-prefix"
    )


# ------------------------------------------------------------------ recompute preemption


def test_preemption_takes_the_newest_and_requeues_it_in_arrival_order():
    # 3 blocks of 4 slots; three 4-token prompts fill them, and every decode needs a new block
    alloc = PagedAllocator(12, 4, watermark=0.0)
    sched = IterationScheduler(alloc, SchedulerConfig())
    r0, r1, r2 = seq(0, 4, 10), seq(1, 4, 3), seq(2, 4, 3)
    for s in (r0, r1, r2):
        sched.add(s)
    assert sched.has_work()
    prefill = sched.schedule()
    assert prefill.seqs == (r0, r1, r2)
    assert fields(prefill) == (True, 12, 12, 1, (), (), (), 0, False)
    assert sched.settled()
    step(sched, prefill, 0.0)
    decode = sched.schedule()
    # r0 takes the block of r2 (the newest); r1 finds none and gives up its own
    assert decode.seqs == (r0,)
    assert fields(decode) == (False, 1, 5, 9, (), (), (), 0, False)
    assert sched.running == [r0]
    assert list(sched.waiting) == [r1, r2]
    assert sched.num_preempted == 2
    assert [(s.status, s.num_computed, s.num_preemptions) for s in (r1, r2)] == [
        (SeqStatus.PREEMPTED, 0, 1),
        (SeqStatus.PREEMPTED, 0, 1),
    ]
    assert alloc.addressing(r0).blocks == (0, 2)
    assert alloc.num_free_blocks == 1
    sched.check_integrity()
    assert sched.settled()  # r1 needs 2 blocks, 1 is free


# ------------------------------------------------------------------ swap preemption


def test_a_swapped_sequence_comes_back_first_and_then_admission_reopens():
    # 3 blocks of 4 slots, 8 host blocks; r2 arrives while r1 is swapped out
    alloc = PagedAllocator(12, 4, watermark=0.0, host_blocks=8)
    sched = IterationScheduler(alloc, SchedulerConfig(preemption="swap"))
    r0, r1, r2 = seq(0, 4, 3), seq(1, 4, 2), seq(2, 3, 2, arrival=1.5)
    sched.add(r0)
    sched.add(r1)
    prefill = sched.schedule()
    assert prefill.seqs == (r0, r1)
    assert fields(prefill) == (True, 8, 8, 1, (), (), (), 0, False)
    step(sched, prefill, 0.0)
    decode = sched.schedule()  # both need a second block, one is free: r1 goes to host memory
    assert decode.seqs == (r0,)
    assert fields(decode) == (False, 1, 5, 2, (), ((True, 1, 0),), (), 0, False)
    assert (list(sched.swapped), list(sched.waiting), sched.num_preempted) == ([r1], [], 0)
    assert (r1.status, r1.num_computed, r1.num_preemptions) == (SeqStatus.SWAPPED, 4, 1)
    sched.check_integrity()
    assert sched.settled()  # r1 needs 2 blocks to come back, 1 is free
    assert sched.has_work()
    step(sched, decode, 1.0)
    sched.add(r2)
    decode = sched.schedule()  # r1 still cannot come back; r2 may not overtake it
    assert decode.seqs == (r0,)
    assert fields(decode) == (False, 1, 6, 1, (), (), (), 0, False)
    assert sched.settled()
    assert step(sched, decode, 2.0) == [r0]
    decode = sched.schedule()  # r0's blocks are back: r1 swaps in (and takes its next block)
    assert decode.seqs == (r1,)
    assert fields(decode) == (False, 1, 5, 1, (), ((False, 0, 1),), (), 0, False)
    assert (list(sched.swapped), list(sched.waiting)) == ([], [r2])
    assert r1.status is SeqStatus.RUNNING
    assert not sched.settled()  # the last swapped one is back: r2 fits the block left
    sched.check_integrity()
    assert step(sched, decode, 3.0) == [r1]
    prefill = sched.schedule()
    assert prefill.seqs == (r2,)
    assert fields(prefill) == (True, 3, 3, 1, (), (), (), 0, False)
    assert step(sched, prefill, 4.0) == []
    decode = sched.schedule()
    assert fields(decode) == (False, 1, 4, 1, (), (), (), 0, False)
    assert step(sched, decode, 5.0) == [r2]
    assert not sched.has_work()
    assert sched.schedule() is None
    assert alloc.num_free_blocks == 3


# ------------------------------------------------------------------ groups


def run_step(sched, batch: Batch, t: float, branches=None) -> list[Sequence]:
    """`step` as a real runner makes it: a placeholder token per row, then the given branches."""
    tokens = [0] if branches is not None else None
    finished = [s for s in batch.seqs if s.advance(1, t + 1.0, t, tokens)]
    sched.branch(batch, branches)
    sched.update(finished)
    return finished


def test_a_beam_group_forks_prunes_and_reforks_through_contiguous_copies():
    arena = FirstFitArena(100)
    sched = IterationScheduler(ContiguousAllocator(arena, OracleReservation()), SchedulerConfig())
    leader = seq(0, 4, 3, beam_width=2)  # kv_len 6: two extents of 6
    other = leader.group.members[1]
    sched.add(leader)
    prefill = sched.schedule()
    assert prefill.seqs == (leader,)
    assert fields(prefill) == (True, 4, 4, 1, (), (), (), 0, True)
    assert arena.free_runs() == [(12, 88)]
    # the prompt's two best tokens start the two beams: member 1 is forked from the leader
    run_step(sched, prefill, 0.0, {leader: ([11, 12, 13, 14], [-0.5, -1.0, -2.0, -3.0])})
    assert sched.running == [leader, other]
    assert [(b.output_ids, b.score) for b in (leader, other)] == [([11], -0.5), ([12], -1.0)]
    decode = sched.schedule()
    assert decode.seqs == (leader, other)
    assert fields(decode) == (False, 2, 10, 1, (), (), ((0, 6, 4),), 4, True)
    # both best continuations extend the leader: member 1 is pruned and re-forked from it
    branches = {
        leader: ([21, 22, 23, 24], [-0.125, -0.25, -5.0, -6.0]),
        other: ([31, 32, 33, 34], [-0.0625, -0.5, -5.0, -6.0]),
    }
    run_step(sched, decode, 1.0, branches)
    assert [(b.output_ids, b.score) for b in (leader, other)] == [([11, 21], -0.625), ([11, 22], -0.75)]
    assert sched.running == [leader, other]
    decode = sched.schedule()
    assert fields(decode) == (False, 2, 12, 1, (), (), ((0, 6, 5),), 5, True)
    # the last step: member 1's continuation is the best, and becomes the request's output
    branches = {
        leader: ([41, 42, 43, 44], [-3.0, -4.0, -5.0, -6.0]),
        other: ([51, 52, 53, 54], [-0.125, -0.25, -5.0, -6.0]),
    }
    assert run_step(sched, decode, 2.0, branches) == [leader, other]
    outputs = [(b.output_ids, b.score) for b in (leader, other)]
    assert outputs == [([11, 22, 51], -0.875), ([11, 22, 52], -1.0)]
    assert (sched.running, sched.has_work()) == ([], False)
    assert arena.free_runs() == [(0, 100)]


def test_parallel_samples_fork_once_with_their_own_first_token():
    arena = FirstFitArena(100)
    sched = IterationScheduler(ContiguousAllocator(arena, OracleReservation()), SchedulerConfig())
    leader = seq(0, 4, 2, n=3)
    one, two = leader.group.members[1:]
    sched.add(leader)
    prefill = sched.schedule()
    assert fields(prefill) == (True, 4, 4, 1, (), (), (), 0, True)
    run_step(sched, prefill, 0.0, {leader: ([40, 41, 42], None)})
    assert [s.output_ids for s in (leader, one, two)] == [[0], [41], [42]]
    assert sched.running == [leader, one, two]
    decode = sched.schedule()
    assert fields(decode) == (False, 3, 15, 1, (), (), ((0, 5, 4), (0, 10, 4)), 8, True)
    assert run_step(sched, decode, 1.0, {}) == [leader, one, two]
    assert arena.free_runs() == [(0, 100)]


def test_samples_of_a_one_token_output_never_join():
    arena = FirstFitArena(100)
    sched = IterationScheduler(ContiguousAllocator(arena, OracleReservation()), SchedulerConfig())
    leader = seq(0, 4, 1, n=2)
    sched.add(leader)
    prefill = sched.schedule()
    assert step(sched, prefill, 0.0) == [leader]
    assert leader.group.members[1].status is SeqStatus.FINISHED
    assert (sched.running, sched.has_work(), sched.schedule()) == ([], False, None)
    assert arena.free_runs() == [(0, 100)]


def test_a_recomputed_request_runs_before_the_newer_one_that_swapped_back_first():
    # 5 blocks of 4 slots and 1 host block: r3 swaps out, then r2 must be recomputed
    alloc = PagedAllocator(20, 4, watermark=0.0, host_blocks=1)
    sched = IterationScheduler(alloc, SchedulerConfig(preemption="swap"))
    r0, r1, r2, r3 = seq(0, 4, 3), seq(1, 4, 3), seq(2, 4, 3), seq(3, 4, 3)
    for s in (r0, r1, r2, r3):
        sched.add(s)
    step(sched, sched.schedule(), 0.0)
    decode = sched.schedule()
    assert decode.seqs == (r0, r1)
    assert (list(sched.swapped), list(sched.waiting), sched.num_preempted) == ([r3], [r2], 1)
    assert (r2.status, r3.status) == (SeqStatus.PREEMPTED, SeqStatus.SWAPPED)
    step(sched, decode, 1.0)
    assert step(sched, sched.schedule(), 2.0) == [r0, r1]
    decode = sched.schedule()  # r3 swaps back in before r2 may be admitted
    assert decode.seqs == (r3,)
    assert not sched.settled()
    step(sched, decode, 3.0)
    prefill = sched.schedule()
    assert prefill.seqs == (r2,)
    assert fields(prefill) == (True, 5, 5, 1, (), (), (), 0, False)
    assert sched.running == [r2, r3]
    assert sched.num_preempted == 0
    sched.check_integrity()


# ------------------------------------------------------------------ static batches


def test_a_static_batch_holds_its_finished_members_memory_until_the_last_finishes():
    alloc = PagedAllocator(16, 4, watermark=0.0)
    sched = RequestScheduler(alloc, SchedulerConfig(max_num_seqs=2))
    r0, r1, r2 = seq(0, 4, 2), seq(1, 4, 3), seq(2, 4, 2)
    for s in (r0, r1, r2):
        sched.add(s)
    prefill = sched.schedule()
    assert prefill.seqs == (r0, r1)
    assert fields(prefill) == (True, 8, 8, 1, (), (), (), 0, False)
    step(sched, prefill, 0.0)
    decode = sched.schedule()
    assert decode.seqs == (r0, r1)
    assert fields(decode) == (False, 2, 10, 1, (), (), (), 0, False)
    assert step(sched, decode, 1.0) == [r0]
    assert (sched.running, sched.held) == ([r1], [r0])
    decode = sched.schedule()  # r2 waits for the whole batch, and r0's blocks stay taken
    assert decode.seqs == (r1,)
    assert alloc.num_free_blocks == 0
    sched.check_integrity()
    assert step(sched, decode, 2.0) == [r1]
    assert (sched.running, sched.held, alloc.num_free_blocks) == ([], [], 4)
    assert sched.schedule().seqs == (r2,)


def test_a_static_batch_swaps_when_asked():
    alloc = PagedAllocator(12, 4, watermark=0.0, host_blocks=8)
    sched = RequestScheduler(alloc, SchedulerConfig(preemption="swap"))
    r0, r1 = seq(0, 4, 3), seq(1, 4, 2)
    sched.add(r0)
    sched.add(r1)
    step(sched, sched.schedule(), 0.0)
    decode = sched.schedule()
    assert decode.seqs == (r0,)
    assert decode.swaps == ((True, 1, 0),)
    assert list(sched.swapped) == [r1]


# ------------------------------------------------------------------ group bookkeeping


def test_seats_units_and_groups_of_a_queue():
    lone = seq(0, 4, 2)
    samples = seq(1, 4, 2, n=3)
    beams = seq(2, 4, 2, beam_width=2)
    assert [seats_taken(s) for s in (lone, samples, beams)] == [1, 3, 2]
    assert [admission_unit(s) for s in (lone, samples, beams)] == [[lone], [samples], [beams]]
    assert candidates_per_beam(beams.group) == 4
    samples.group.forked = beams.group.forked = True
    # a forked sample comes back alone; a forked beam group comes back whole
    assert [seats_taken(s) for s in (samples.group.members[2], beams)] == [1, 2]
    assert admission_unit(samples.group.members[2]) == [samples.group.members[2]]
    assert admission_unit(beams) == list(beams.group.members)
    running = [
        *beams.group.members,
        lone,
        *samples.group.members[:2],
        *seq(3, 4, 2, beam_width=3).group.members,
    ]
    assert [unit_start(running, i) for i in range(len(running))] == [0, 0, 2, 3, 4, 5, 5, 5]
    assert groups_in(running) == [beams.group, samples.group, running[-1].group]
    assert unit_start(list(beams.group.members), 1) == 0  # a group alone in the batch


def test_synthetic_scores_are_the_log_softmax_of_seeded_normal_logits():
    # logits ~ N(0, 2^2) over 64 tokens, drawn step after step from one stream seeded by the request id
    logits = np.random.default_rng([0x6265616D, 7]).standard_normal((40, 3, 64)) * 2.0
    logprobs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    best = np.argsort(-logits, axis=-1, kind="stable")[..., :6]
    scores = SyntheticScores(7, 3, 6)
    for i in range(40):  # past the first chunk of steps
        beams = 2 + i % 2
        tokens, got = scores.next(beams)
        np.testing.assert_array_equal(tokens, best[i, :beams])
        np.testing.assert_allclose(got, np.take_along_axis(logprobs[i], best[i], axis=-1)[:beams], rtol=1e-12)
    every = SyntheticScores(7, 1, 64).next(1)[0]
    assert sorted(every[0].tolist()) == list(range(64))


def test_a_beam_group_that_runs_out_while_placed_gives_back_its_copies_and_goes_whole():
    # 4 blocks of 4 slots; two beam groups of 3-token prompts share one block each after the fork,
    # and each beam's first decode writes into that shared block: copy-on-write takes a new one
    alloc = PagedAllocator(16, 4, watermark=0.0)
    sched = IterationScheduler(alloc, SchedulerConfig())
    first, second = seq(0, 3, 4, beam_width=2), seq(1, 3, 4, beam_width=3)
    sched.add(first)
    sched.add(second)
    prefill = sched.schedule()
    assert prefill.seqs == (first, second)
    assert fields(prefill) == (True, 6, 6, 1, (), (), (), 0, True)
    step(sched, prefill, 0.0)
    assert sched.running == [*first.group.members, *second.group.members]
    decode = sched.schedule()
    # first's leader copies block 0 into 2, its other beam then writes in place; second's leader
    # copies block 1 into 3, its next beam finds no block: the whole group goes, copy included
    assert decode.seqs == first.group.members
    assert fields(decode) == (False, 2, 8, 1, ((0, 2),), (), (), 4, True)
    assert list(sched.waiting) == list(second.group.members)
    assert sched.num_preempted == 3
    assert [m.num_computed for m in second.group.members] == [0, 0, 0]
    assert alloc.num_free_blocks == 2
    sched.check_integrity()


def test_forks_of_two_groups_in_one_step_are_all_copied_before_the_next():
    arena = FirstFitArena(100)
    sched = IterationScheduler(ContiguousAllocator(arena, OracleReservation()), SchedulerConfig())
    a, b = seq(0, 4, 3, n=2), seq(1, 2, 2, n=2)  # extents of 6 at 0, 6 and of 3 at 12, 15
    sched.add(a)
    sched.add(b)
    prefill = sched.schedule()
    assert fields(prefill) == (True, 6, 6, 1, (), (), (), 0, True)
    step(sched, prefill, 0.0)
    decode = sched.schedule()
    assert decode.seqs == (*a.group.members, *b.group.members)
    assert fields(decode) == (False, 4, 16, 1, (), (), ((0, 6, 4), (12, 15, 2)), 6, True)


# ------------------------------------------------------------------ admission caps


def test_scheduler_caps_default_to_vllm_and_to_a_whole_static_batch():
    alloc = PagedAllocator(64, 4, watermark=0.0)
    iteration = IterationScheduler(alloc, SchedulerConfig())
    assert (iteration.max_num_seqs, iteration.token_cap, iteration.swap) == (256, math.inf, False)
    static = RequestScheduler(alloc, SchedulerConfig())
    assert (static.max_num_seqs, static.token_cap, static.swap) == (math.inf, math.inf, False)
    capped = IterationScheduler(alloc, SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=9))
    assert (capped.max_num_seqs, capped.token_cap) == (3, 9)


def test_the_token_cap_admits_up_to_exactly_its_tokens_and_always_the_first_prompt():
    sched = IterationScheduler(
        PagedAllocator(64, 4, watermark=0.0), SchedulerConfig(max_num_batched_tokens=8)
    )
    r0, r1, r2, r3 = seq(0, 4, 2), seq(1, 4, 2), seq(2, 1, 2), seq(3, 9, 2)
    for s in (r0, r1, r2, r3):
        sched.add(s)
    first = sched.schedule()
    assert first.seqs == (r0, r1)  # 4 + 4 = 8 tokens; r2's one more would pass the cap
    assert fields(first) == (True, 8, 8, 1, (), (), (), 0, False)
    step(sched, first, 0.0)
    second = sched.schedule()
    assert second.seqs == (r2,)  # 1 + 9 > 8
    step(sched, second, 1.0)
    third = sched.schedule()
    assert third.seqs == (r3,)  # alone, a prompt longer than the cap still runs
    assert fields(third) == (True, 9, 9, 1, (), (), (), 0, False)


def test_a_prompt_found_in_the_prefix_cache_is_not_fed_again():
    options = EngineOptions(num_slots=64, max_len=32, block_size=4, watermark=0.0)
    sched = ENGINES["paged-prefix"].build(options)
    ids = tuple(range(1, 10))  # 9 tokens: two full blocks and one more
    r0 = sequence_for(Request(0, 0.0, 9, 2, prompt_ids=ids))
    r1 = sequence_for(Request(1, 0.5, 9, 2, prompt_ids=ids))
    sched.add(r0)
    step(sched, sched.schedule(), 0.0)
    sched.add(r1)
    prefill = sched.schedule()
    assert prefill.seqs == (r1,)
    assert (r1.num_computed, r1.num_cached_tokens) == (8, 8)
    assert fields(prefill) == (True, 1, 9, 1, (), (), (), 0, False)


def test_the_beam_step_breaks_ties_by_beam_then_rank():
    tokens = np.array([[5, 6, 7], [8, 9, 10]])
    logprobs = np.array([[-1.0, -1.0, -2.0], [-0.5, -1.5, -3.0]])
    choices = beam_step([-0.5, -1.0], tokens, logprobs, 4)
    assert [(c.parent, c.token, c.score) for c in choices] == [
        (0, 5, -1.5),
        (0, 6, -1.5),
        (1, 8, -1.5),
        (0, 7, -2.5),
    ]
    assert assign_slots([c.parent for c in choices], 4) == ([0, 2, 1, 3], [2, 3])


def test_simulated_beams_take_the_beam_step_over_the_requests_synthetic_candidates():
    sched = IterationScheduler(PagedAllocator(256, 4, watermark=0.0), SchedulerConfig())
    leader = seq(5, 3, 4, beam_width=3)
    beams = leader.group.members
    sched.add(leader)
    expected = SyntheticScores(5, 3, 6)  # the request's id, its width, 2 candidates per beam
    scores = [0.0]
    batch = sched.schedule()
    for t in range(4):  # the last step finishes the group
        step(sched, batch, float(t))
        tokens, logprobs = expected.next(len(scores))
        best = [c.score for c in beam_step(scores, tokens, logprobs, 3)]
        assert sorted(b.score for b in beams) == sorted(best)
        scores = [b.score for b in beams]  # the next step's beams, in member order
        batch = sched.schedule()
    assert batch is None and beams[0].score == max(scores)
    assert [b.output_ids for b in beams] == [[], [], []]  # a simulation samples no token ids


def test_a_beam_search_of_one_token_ends_with_its_prefill():
    alloc = PagedAllocator(64, 4, watermark=0.0)
    sched = IterationScheduler(alloc, SchedulerConfig())
    leader = seq(0, 4, 1, beam_width=2)
    sched.add(leader)
    assert step(sched, sched.schedule(), 0.0) == [leader]
    assert [b.status for b in leader.group.members] == [SeqStatus.FINISHED] * 2
    assert (sched.running, sched.has_work(), sched.schedule()) == ([], False, None)
    assert alloc.num_free_blocks == 16


def test_a_contiguous_beam_group_copies_the_prompt_into_every_forked_beam():
    arena = FirstFitArena(100)
    sched = IterationScheduler(ContiguousAllocator(arena, OracleReservation()), SchedulerConfig())
    leader = seq(0, 4, 3, beam_width=3)  # three extents of 6
    sched.add(leader)
    candidates = ([11, 12, 13, 14, 15, 16], [-0.5, -1.0, -2.0, -3.0, -4.0, -5.0])
    run_step(sched, sched.schedule(), 0.0, {leader: candidates})
    decode = sched.schedule()
    assert decode.seqs == leader.group.members
    assert fields(decode) == (False, 3, 15, 1, (), (), ((0, 6, 4), (0, 12, 4)), 8, True)


def test_sequences_swapped_out_together_come_back_together():
    # 4 blocks of 4 slots: r3 then r2 go to host memory; once r0 and r1 finish both come back
    alloc = PagedAllocator(16, 4, watermark=0.0, host_blocks=8)
    sched = IterationScheduler(alloc, SchedulerConfig(preemption="swap"))
    r0, r1, r2, r3 = seq(0, 4, 2), seq(1, 4, 2), seq(2, 4, 3), seq(3, 4, 3)
    for s in (r0, r1, r2, r3):
        sched.add(s)
    step(sched, sched.schedule(), 0.0)
    decode = sched.schedule()
    assert decode.seqs == (r0, r1)
    assert decode.swaps == ((True, 3, 0), (True, 2, 1))
    assert list(sched.swapped) == [r2, r3]
    assert step(sched, decode, 1.0) == [r0, r1]
    decode = sched.schedule()
    assert decode.seqs == (r2, r3)
    assert decode.swaps == ((False, 1, 3), (False, 0, 0))
    assert (list(sched.swapped), alloc.num_free_blocks) == ([], 0)
    assert sched.settled()  # back from host memory, but nobody waits to be let in


def test_a_victim_goes_back_into_its_queue_in_arrival_order():
    s0, s1, s2, s3, s4 = (seq(i, 4, 2) for i in range(5))
    queue = deque([s0, s2, s4])
    _requeue(queue, s3)
    assert list(queue) == [s0, s2, s3, s4]
    _requeue(queue, s1)
    assert list(queue) == [s0, s1, s2, s3, s4]


def test_the_integrity_check_names_a_queue_out_of_arrival_order():
    sched = IterationScheduler(PagedAllocator(64, 4, watermark=0.0), SchedulerConfig(max_num_seqs=2))
    sched.add(seq(1, 4, 2))
    sched.add(seq(0, 4, 2))
    with pytest.raises(AssertionError, match="^a queue is out of arrival order$"):
        sched.check_integrity()


def test_a_parallel_sample_is_preempted_alone_and_a_full_batch_is_within_its_cap():
    # 2 blocks of 4 slots: the two samples share the prompt's block, and each needs a new one
    alloc = PagedAllocator(8, 4, watermark=0.0)
    sched = IterationScheduler(alloc, SchedulerConfig(max_num_seqs=2))
    leader = seq(0, 4, 3, n=2)
    other = leader.group.members[1]
    sched.add(leader)
    step(sched, sched.schedule(), 0.0)
    assert sched.running == [leader, other]
    sched.check_integrity()  # two running sequences, the cap
    decode = sched.schedule()
    assert decode.seqs == (leader,)
    assert (list(sched.waiting), other.status, sched.num_preempted) == ([other], SeqStatus.PREEMPTED, 1)
    assert alloc.addressing(leader).blocks == (0, 1)
    sched.check_integrity()


def test_a_static_batch_whose_last_runner_cannot_grow_frees_what_it_held_and_starts_over():
    # 4 blocks: r0 finishes and its 2 blocks stay held; r1's third block then finds none
    alloc = PagedAllocator(16, 4, watermark=0.0)
    sched = RequestScheduler(alloc, SchedulerConfig())
    r0, r1 = seq(0, 4, 2), seq(1, 4, 6)
    sched.add(r0)
    sched.add(r1)
    step(sched, sched.schedule(), 0.0)
    assert step(sched, sched.schedule(), 1.0) == [r0]
    for t in (2.0, 3.0, 4.0):
        assert step(sched, sched.schedule(), t) == []
    again = sched.schedule()  # r1 gives up its blocks, r0's are freed, r1 is prefilled anew
    assert again.seqs == (r1,)
    assert fields(again) == (True, 9, 9, 1, (), (), (), 0, False)
    assert (r1.num_preemptions, sched.held, sched.num_preempted) == (1, [], 0)
    assert alloc.num_free_blocks == 1


def test_admission_stops_at_the_first_request_that_does_not_fit_and_runs_the_others():
    sched = IterationScheduler(PagedAllocator(8, 4, watermark=0.0), SchedulerConfig())
    r0, r1, r2 = seq(0, 4, 2), seq(1, 4, 2), seq(2, 4, 2)
    for s in (r0, r1, r2):
        sched.add(s)
    prefill = sched.schedule()
    assert prefill.seqs == (r0, r1)
    assert fields(prefill) == (True, 8, 8, 1, (), (), (), 0, False)
    assert list(sched.waiting) == [r2]


def test_a_group_is_let_in_only_when_all_its_outputs_fit():
    arena = FirstFitArena(17)
    sched = IterationScheduler(ContiguousAllocator(arena, OracleReservation()), SchedulerConfig())
    lone, group = seq(0, 4, 3), seq(1, 4, 3, n=2)  # 6 slots, then 2 x 6 with 11 left
    sched.add(lone)
    sched.add(group)
    assert sched.schedule().seqs == (lone,)
    assert list(sched.waiting) == [group]


def test_a_preempted_beam_pair_comes_back_only_when_both_fit():
    # 3 blocks: r0's decode takes the free one, the pair's copy-on-write finds none
    alloc = PagedAllocator(12, 4, watermark=0.0)
    sched = IterationScheduler(alloc, SchedulerConfig())
    r0, pair = seq(0, 4, 5), seq(1, 3, 4, beam_width=2)
    sched.add(r0)
    sched.add(pair)
    step(sched, sched.schedule(), 0.0)
    decode = sched.schedule()
    assert decode.seqs == (r0,)
    assert list(sched.waiting) == list(pair.group.members)
    step(sched, decode, 1.0)
    decode = sched.schedule()  # one block is free: the pair needs two
    assert decode.seqs == (r0,)
    assert not decode.is_prefill


def test_a_beam_group_is_recomputed_even_when_swap_could_park_each_beam():
    """Swap preemption, 5 blocks of 4 slots. The pair's 3-token prompt block is shared after the
    fork, and the first decode's copy-on-write gives each beam a block of its own; each beam then
    continues itself (no re-fork), so host memory could take each beam's blocks. Still the group
    is one victim, recomputed whole: swapping beams one by one could leave one parked while the
    other runs on."""
    alloc = PagedAllocator(20, 4, watermark=0.0, host_blocks=8)
    sched = IterationScheduler(alloc, SchedulerConfig(preemption="swap"))
    r0, pair = seq(0, 4, 10), seq(1, 3, 10, beam_width=2)
    leader, other = pair.group.members
    sched.add(r0)
    sched.add(pair)
    prefill = sched.schedule()
    assert prefill.seqs == (r0, leader)
    run_step(sched, prefill, 0.0, {leader: ([11, 12, 13, 14], [-0.5, -1.0, -2.0, -3.0])})
    decode = sched.schedule()
    assert decode.seqs == (r0, leader, other) and decode.block_copies == ((1, 3),)
    own = {  # each beam's best candidate is its own: the two best continuations, no re-fork
        leader: ([21, 22, 23, 24], [-0.1, -5.0, -6.0, -7.0]),
        other: ([31, 32, 33, 34], [-0.2, -5.0, -6.0, -7.0]),
    }
    run_step(sched, decode, 1.0, own)
    assert [b.output_ids for b in (leader, other)] == [[11, 21], [12, 31]]  # each continued itself
    assert alloc.num_free_blocks == 1 and all(alloc.can_swap_out(b) for b in (leader, other))
    decode = sched.schedule()  # r0 and the leader take the last block; the other beam finds none
    assert decode.seqs == (r0,) and decode.swaps == ()
    assert list(sched.waiting) == [leader, other] and not sched.swapped
    assert sched.num_preempted == 2 and [b.num_computed for b in (leader, other)] == [0, 0]
    sched.check_integrity()
