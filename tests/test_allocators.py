"""KV allocators: exact extents and block ids, occupancy categories, multi-step growth, random runs."""

from __future__ import annotations

from collections import deque
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from engines.allocator import BlockTable, Extent, snapshot
from engines.arena import BuddyArena, FirstFitArena
from engines.contiguous import ContiguousAllocator, MaxReservation, OracleReservation, Pow2Reservation
from engines.paged import PagedAllocator
from kvbench.metrics.occupancy import Footprint, KVSnapshot
from kvbench.requests import Request
from kvbench.sequence import Sequence
from tests.support import examples, steps

# ---------------------------------------------------------------- helpers

ARENAS = {"buddy": BuddyArena, "first-fit": FirstFitArena}


def new_seq(request_id: int, prompt: int, output: int) -> Sequence:
    return Sequence(Request(request_id, 0.0, prompt, output))


def contiguous(num_slots: int, policy, fit: str = "buddy") -> ContiguousAllocator:
    return ContiguousAllocator(ARENAS[fit](num_slots), policy)


def admit(alloc, seq: Sequence) -> bool:
    """Admission plus the prefill step, as an engine does it; returns whether seq finished."""
    assert alloc.can_allocate(seq)
    alloc.allocate(seq)
    alloc.check_integrity()
    return seq.advance(1, 0.0)


def decode(alloc, seq: Sequence) -> list[tuple[int, int]]:
    """One decode step of one sequence: room for num_tokens, then the step itself."""
    assert alloc.can_append(seq)
    copies = alloc.append(seq)
    alloc.check_integrity()
    seq.advance(1, 0.0)
    alloc.check_integrity()
    return copies


def assert_partition(snap: KVSnapshot) -> None:
    values = snap.as_dict()
    assert all(v >= 0 for v in values.values()), values
    assert sum(values.values()) == snap.num_slots, values


def blocks(alloc: PagedAllocator, seq: Sequence) -> list[int]:
    table = alloc.addressing(seq)
    assert isinstance(table, BlockTable)
    assert table.block_size == alloc.block_size
    return list(table.blocks)


def drain(alloc: PagedAllocator) -> list[int]:
    """The free queue, front first, read through the public API (takes every free block)."""
    probe = new_seq(10**6, alloc.num_free_blocks * alloc.block_size, 1)
    if alloc.num_free_blocks == 0:
        return []
    alloc.allocate(probe)
    return blocks(alloc, probe)


def buddy_initial(num_slots: int) -> list[tuple[int, int]]:
    out, start = [], 0
    for bit in reversed(range(num_slots.bit_length())):
        if num_slots >> bit & 1:
            out.append((start, 1 << bit))
            start += 1 << bit
    return out


# ---------------------------------------------------------------- reservation policies


def test_policy_slots():
    req = Request(0, 0.0, 5, 25)
    assert req.kv_len == 29
    assert OracleReservation().slots(req) == 29
    assert Pow2Reservation(2048).slots(req) == 5 + 32 - 1  # the paper: 32 positions for 25 outputs
    assert MaxReservation(2048).slots(req) == 2048
    pow2 = Pow2Reservation(2048)
    assert [pow2.slots(Request(0, 0.0, 5, o)) for o in (1, 2, 3, 4, 5, 8, 9)] == [5, 6, 8, 8, 12, 12, 20]


# ---------------------------------------------------------------- contiguous: exact cases


def test_oracle_buddy_extents_and_categories():
    alloc = contiguous(64, OracleReservation())
    a, b = new_seq(1, 5, 4), new_seq(2, 5, 5)  # kv_len 8 and 9
    alloc.allocate(a)
    alloc.allocate(b)
    assert alloc.addressing(a) == Extent(0, 8, 8)
    assert alloc.addressing(b) == Extent(16, 9, 16)  # 9 slots take a 16 block
    assert alloc.footprint() == Footprint(tokens=0, target=17, asked=17, granted=24)
    snap = snapshot(alloc)
    assert snap.as_dict() == {
        "token_states": 0,
        "outside_window": 0,
        "reservation": 17,
        "internal_frag": 0,
        "allocator_overhead": 7,
        "mapped_idle": 0,
        "external_frag": 0,
        "free": 40,
    }
    a.advance(1, 0.0)
    b.advance(1, 0.0)  # prefill: 5 tokens computed each
    alloc.check_integrity()
    snap = snapshot(alloc)
    assert (snap.token_states, snap.reservation, snap.allocator_overhead, snap.free) == (10, 7, 7, 40)
    # decode a to its end: one more token state and one less reservation per step
    for step in range(3):
        assert alloc.append(a) == []
        a.advance(1, 0.0)
        assert alloc.footprint().tokens == 11 + step
    assert a.num_generated == 4
    assert a.num_computed == a.request.kv_len
    assert snapshot(alloc).reservation == 4  # b still has 4 of its 9 to compute
    alloc.free(a)
    alloc.check_integrity()
    assert alloc.arena.free_blocks() == [(0, 16), (32, 32)]
    assert alloc.footprint() == Footprint(tokens=5, target=9, asked=9, granted=16)
    alloc.free(b)
    assert alloc.arena.free_blocks() == [(0, 64)]
    assert alloc.footprint() == Footprint(0, 0, 0, 0)


def test_pow2_buddy_splits_internal_frag_and_overhead():
    alloc = contiguous(64, Pow2Reservation(2048))
    a = new_seq(1, 5, 5)  # kv_len 9, asks 5 + 8 - 1 = 12, granted 16
    admit(alloc, a)
    assert alloc.addressing(a) == Extent(0, 12, 16)
    assert snapshot(alloc).as_dict() == {
        "token_states": 5,
        "outside_window": 0,
        "reservation": 4,
        "internal_frag": 3,
        "allocator_overhead": 4,
        "mapped_idle": 0,
        "external_frag": 0,
        "free": 48,
    }


def test_max_buddy_reserves_the_maximum_length():
    alloc = contiguous(64, MaxReservation(24))
    a, b = new_seq(1, 5, 5), new_seq(2, 3, 2)
    admit(alloc, a)
    admit(alloc, b)
    assert alloc.addressing(a) == Extent(0, 24, 32)
    assert alloc.addressing(b) == Extent(32, 24, 32)
    snap = snapshot(alloc)
    assert (snap.token_states, snap.reservation) == (8, 13 - 8)  # targets 9 + 4
    assert (snap.internal_frag, snap.allocator_overhead, snap.free) == (48 - 13, 16, 0)
    c = new_seq(3, 1, 1)
    assert not alloc.can_allocate(c)
    assert alloc.external_frag(c) == 0  # no free slot at all
    assert alloc.can_ever_hold(c.request)
    assert not contiguous(16, MaxReservation(24)).can_ever_hold(c.request)


def test_first_fit_oracle_extents_reuse_holes():
    alloc = contiguous(40, OracleReservation(), fit="first-fit")
    a, b, c = new_seq(1, 5, 4), new_seq(2, 5, 5), new_seq(3, 2, 2)  # kv_len 8, 9, 3
    for seq in (a, b, c):
        admit(alloc, seq)
    assert [alloc.addressing(s) for s in (a, b, c)] == [Extent(0, 8, 8), Extent(8, 9, 9), Extent(17, 3, 3)]
    alloc.free(a)
    d, e, f = new_seq(4, 3, 4), new_seq(5, 2, 2), new_seq(6, 1, 2)  # kv_len 6, 3, 2
    for seq in (d, e, f):
        admit(alloc, seq)
    assert alloc.addressing(d) == Extent(0, 6, 6)  # the hole [0, 8)
    assert alloc.addressing(e) == Extent(20, 3, 3)  # [6, 8) is too short for 3
    assert alloc.addressing(f) == Extent(6, 2, 2)  # but takes 2
    assert alloc.arena.free_runs() == [(23, 17)]
    fp = alloc.footprint()
    assert fp == Footprint(tokens=5 + 2 + 3 + 2 + 1, target=9 + 3 + 6 + 3 + 2, asked=23, granted=23)
    assert snapshot(alloc).allocator_overhead == 0


def test_contiguous_append_never_allocates_and_horizon_is_unbounded():
    alloc = contiguous(64, OracleReservation())
    seqs = [new_seq(i, 3, 6) for i in range(3)]
    for seq in seqs:
        admit(alloc, seq)
    before = alloc.footprint()
    for seq in seqs:
        assert alloc.can_append(seq)
        assert alloc.append(seq) == []
    assert alloc.growth_horizon(seqs, 5) == 5
    assert alloc.grow(seqs, 5) is None
    for seq in seqs:
        assert seq.advance(5, 1.0)
    alloc.check_integrity()
    after = alloc.footprint()
    assert (after.tokens, after.target, after.asked, after.granted) == (
        before.tokens + 15,
        before.target,
        before.asked,
        before.granted,
    )
    assert snapshot(alloc).reservation == 0  # every sequence reached its final length


def test_contiguous_external_frag_buddy():
    alloc = contiguous(64, OracleReservation())
    a, b, c = new_seq(1, 5, 4), new_seq(2, 20, 13), new_seq(3, 8, 9)  # kv_len 8, 32, 16
    for seq in (a, b, c):
        admit(alloc, seq)
    assert [alloc.addressing(s).start for s in (a, b, c)] == [0, 32, 16]
    assert alloc.arena.free_blocks() == [(8, 8)]
    head = new_seq(4, 5, 5)  # kv_len 9: needs a 16 block
    assert not alloc.can_allocate(head)
    assert alloc.external_frag(head) == 8
    assert alloc.external_frag(new_seq(5, 4, 5)) == 0  # kv_len 8 fits the free block
    assert alloc.external_frag(None) == 0
    snap = snapshot(alloc, head)
    assert (snap.external_frag, snap.free) == (8, 0)
    assert_partition(snap)
    assert snapshot(alloc, None).free == 8


def test_contiguous_external_frag_first_fit():
    alloc = contiguous(32, OracleReservation(), fit="first-fit")
    seqs = [new_seq(i, 5, 6) for i in range(3)]  # kv_len 10 each
    for seq in seqs:
        admit(alloc, seq)
    alloc.free(seqs[0])
    assert alloc.arena.free_runs() == [(0, 10), (30, 2)]
    assert alloc.external_frag(new_seq(7, 5, 7)) == 12  # 11 slots fit nowhere: both runs unusable
    assert alloc.external_frag(new_seq(8, 5, 6)) == 0
    assert alloc.external_frag(new_seq(9, 1, 2)) == 0
    never = new_seq(10, 30, 10)
    assert not alloc.can_ever_hold(never.request)
    assert alloc.external_frag(never) == 12
    assert_partition(snapshot(alloc, never))


def test_contiguous_can_ever_hold():
    buddy = contiguous(24, OracleReservation())
    assert buddy.can_ever_hold(Request(0, 0.0, 10, 7))  # 16 slots
    assert not buddy.can_ever_hold(Request(0, 0.0, 10, 8))  # 17 slots need a 32 block
    first_fit = contiguous(24, OracleReservation(), fit="first-fit")
    assert first_fit.can_ever_hold(Request(0, 0.0, 10, 15))
    assert not first_fit.can_ever_hold(Request(0, 0.0, 10, 16))


# ---------------------------------------------------------------- paged: exact cases


def test_paged_block_ids_follow_the_fifo_queue():
    alloc = PagedAllocator(18, 4, watermark=0.0)  # 4 blocks and 2 tail slots
    assert (alloc.num_blocks, alloc.num_free_blocks) == (4, 4)
    a, b = new_seq(1, 5, 6), new_seq(2, 3, 2)  # kv_len 10 and 4
    admit(alloc, a)
    admit(alloc, b)
    assert blocks(alloc, a) == [0, 1]
    assert blocks(alloc, b) == [2]
    assert snapshot(alloc).as_dict() == {
        "token_states": 8,
        "outside_window": 0,
        "reservation": 4,
        "internal_frag": 0,
        "allocator_overhead": 0,
        "mapped_idle": 0,
        "external_frag": 2,
        "free": 4,
    }
    assert decode(alloc, a) == []
    decode(alloc, b)
    assert b.num_generated == b.request.output_len
    alloc.free(b)
    alloc.check_integrity()
    decode(alloc, a)  # writes position 6
    decode(alloc, a)  # writes position 7, the end of block 1
    assert blocks(alloc, a) == [0, 1]
    assert alloc.can_append(a)
    assert alloc.append(a) == []  # position 8 needs a third block: the queue's front is 3
    assert blocks(alloc, a) == [0, 1, 3]
    assert snapshot(alloc).as_dict() == {
        "token_states": 8,
        "outside_window": 0,
        "reservation": 2,
        "internal_frag": 2,  # kv_len 10 leaves 2 slots of block 3 never filled
        "allocator_overhead": 0,
        "mapped_idle": 0,
        "external_frag": 2,
        "free": 4,
    }
    a.advance(1, 0.0)
    decode(alloc, a)
    assert a.num_generated == a.request.output_len
    alloc.free(a)  # blocks return last first: 3, 1, 0 behind 2
    c = new_seq(3, 9, 1)
    admit(alloc, c)
    assert blocks(alloc, c) == [2, 3, 1]
    assert drain(alloc) == [0]


def test_paged_watermark_admission_and_can_ever_hold():
    alloc = PagedAllocator(40, 4, watermark=0.25)  # 10 blocks, 2 kept free at admission
    assert alloc.watermark_blocks == 2
    assert not alloc.can_allocate(new_seq(1, 33, 1))  # 9 blocks would leave 1
    big = new_seq(2, 32, 2)
    assert alloc.can_allocate(big)  # 8 blocks leave exactly 2
    alloc.allocate(big)
    assert not alloc.can_allocate(new_seq(3, 1, 1))
    assert alloc.can_append(big)  # growth may dig into the watermark
    assert alloc.can_ever_hold(Request(0, 0.0, 30, 3))  # kv_len 32: 8 blocks
    assert not alloc.can_ever_hold(Request(0, 0.0, 30, 4))  # kv_len 33: 9 blocks
    assert PagedAllocator(40, 4, watermark=0.0).can_ever_hold(Request(0, 0.0, 30, 11))
    assert not PagedAllocator(40, 4, watermark=0.0).can_ever_hold(Request(0, 0.0, 30, 12))


def test_paged_tail_is_external_frag():
    assert PagedAllocator(18, 4).external_frag(None) == 2
    assert PagedAllocator(16, 4).external_frag(new_seq(0, 3, 3)) == 0
    alloc = PagedAllocator(23, 8)
    assert alloc.num_blocks == 2
    snap = snapshot(alloc)
    assert (snap.external_frag, snap.free) == (7, 16)


def test_paged_fork_then_append_copies_on_write():
    alloc = PagedAllocator(32, 4, watermark=0.0)
    parent = new_seq(1, 6, 5)  # kv_len 10
    admit(alloc, parent)
    assert blocks(alloc, parent) == [0, 1]
    child = new_seq(2, 6, 5)
    child.num_tokens, child.num_computed, child.num_generated = 7, 6, 1
    alloc.fork(parent, child)
    alloc.check_integrity()
    assert blocks(alloc, child) == [0, 1]
    assert alloc._refs[:3] == [2, 2, 0]
    # shared blocks count once: 4 + 2 computed slots, 8 target slots in 2 blocks
    assert alloc.footprint() == Footprint(tokens=6, target=8, asked=8, granted=8)
    assert alloc.growth_horizon([parent, child], 10) == 1
    assert alloc.append(parent) == [(1, 2)]  # position 6 lies in shared block 1
    assert blocks(alloc, parent) == [0, 2]
    assert alloc._refs[:3] == [2, 1, 1]
    assert alloc.append(child) == []  # block 1 is now the child's alone
    assert blocks(alloc, child) == [0, 1]
    alloc.check_integrity()
    parent.advance(1, 0.0)
    child.advance(1, 0.0)
    assert decode(alloc, parent) == []
    assert decode(alloc, parent) == []  # position 8: a new block, not a copy
    assert blocks(alloc, parent) == [0, 2, 3]
    alloc.free(parent)
    assert alloc._refs[:4] == [1, 1, 0, 0]
    alloc.free(child)
    alloc.check_integrity()
    assert drain(alloc) == [4, 5, 6, 7, 3, 2, 1, 0]


def test_paged_fork_of_full_last_block_needs_no_copy():
    alloc = PagedAllocator(16, 4, watermark=0.0)
    parent = new_seq(1, 8, 4)
    admit(alloc, parent)
    child = new_seq(2, 8, 4)
    child.num_tokens, child.num_computed, child.num_generated = 9, 8, 1
    alloc.fork(parent, child)
    assert alloc.append(parent) == []
    assert alloc.append(child) == []
    assert blocks(alloc, parent) == [0, 1, 2]
    assert blocks(alloc, child) == [0, 1, 3]
    assert alloc._refs == [2, 2, 1, 1]
    alloc.check_integrity()


def test_paged_can_append_counts_the_copy():
    alloc = PagedAllocator(12, 4, watermark=0.0)  # 3 blocks
    parent = new_seq(1, 6, 5)
    admit(alloc, parent)
    child = new_seq(2, 6, 5)
    child.num_tokens, child.num_computed, child.num_generated = 7, 6, 1
    alloc.fork(parent, child)
    other = new_seq(3, 2, 5)
    admit(alloc, other)  # takes the last free block
    assert alloc.num_free_blocks == 0
    assert not alloc.can_append(parent)  # needs no new block, but must copy block 1
    assert not alloc.can_append(child)
    assert alloc.can_append(other)
    alloc.free(other)
    assert alloc.can_append(parent)
    assert alloc.append(parent) == [(1, 2)]
    assert alloc.can_append(child)
    assert alloc.append(child) == []
    alloc.check_integrity()


# ---------------------------------------------------------------- paged: multi-step growth


@st.composite
def growth_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    return {
        "block_size": block_size,
        "num_blocks": draw(st.integers(1, 40)),
        "tail": draw(st.integers(0, block_size - 1)),
        "specs": draw(st.lists(st.tuples(st.integers(1, 30), st.integers(2, 60)), min_size=1, max_size=6)),
        "fillers": draw(st.lists(st.integers(1, 12), max_size=4)),
        "cap": draw(st.integers(1, 80)),
        "cut": draw(st.integers(0, 80)),
    }


def build_batch(case) -> tuple[PagedAllocator, tuple[Sequence, ...], int]:
    """A decode batch right after step 0's append; returns (allocator, batch, max_steps)."""
    bs = case["block_size"]
    alloc = PagedAllocator(case["num_blocks"] * bs + case["tail"], bs, watermark=0.0)
    fillers = []
    for i, prompt in enumerate(case["fillers"]):
        seq = new_seq(1000 + i, prompt, 1)
        if alloc.can_allocate(seq):
            alloc.allocate(seq)
            fillers.append(seq)
    batch = []
    for i, (prompt, output) in enumerate(case["specs"]):
        seq = new_seq(i, prompt, output)
        if alloc.can_allocate(seq):
            admit(alloc, seq)
            batch.append(seq)
    for seq in fillers[::2] + fillers[1::2]:  # scramble the free queue
        alloc.free(seq)
    running = []
    for seq in batch:  # step 0 makes room, dropping whoever cannot grow
        if alloc.can_append(seq):
            alloc.append(seq)
            running.append(seq)
        else:
            alloc.free(seq)
    max_steps = min([case["cap"], *(s.remaining for s in running)]) if running else 1
    return alloc, tuple(running), max_steps


def state(alloc: PagedAllocator, batch) -> tuple:
    return ([blocks(alloc, s) for s in batch], alloc.footprint(), drain(alloc))


@settings(max_examples=examples(200))
@given(case=growth_cases())
def test_grow_matches_step_by_step_appends(case):
    # (a) step by step: where the first append would fail, and each step's increments
    alloc, batch, max_steps = build_batch(case)
    if not batch:
        return
    first_failure = None
    asked, target = [0], [0]
    for seq in batch:
        seq.advance(1, 0.0)
    for step in range(1, max_steps):
        before = alloc.footprint()
        if not all(alloc.can_append(s) and alloc.append(s) == [] for s in batch):
            first_failure = step
            break
        after = alloc.footprint()
        asked.append(after.asked - before.asked)
        target.append(after.target - before.target)
        for seq in batch:
            seq.advance(1, 0.0)
    expected_horizon = max_steps if first_failure is None else first_failure

    # (b) the multi-step path: horizon, then grow for the k steps a runner actually ran
    alloc_b, batch_b, max_steps_b = build_batch(case)
    assert max_steps_b == max_steps
    horizon = alloc_b.growth_horizon(batch_b, max_steps)
    assert horizon == expected_horizon
    k = horizon - case["cut"] % horizon
    growth = alloc_b.grow(batch_b, k)
    for seq in batch_b:
        seq.advance(k, 1.0)
    alloc_b.check_integrity()
    if growth is None:
        assert not any(asked[1:k])
    else:
        assert list(growth.asked) == asked[:k]
        assert list(growth.target) == target[:k]

    # (c) step by step for exactly k steps ends in the same state, block ids included
    alloc_c, batch_c, _ = build_batch(case)
    for step in range(k):
        if step:
            for seq in batch_c:
                assert alloc_c.can_append(seq)
                alloc_c.append(seq)
        for seq in batch_c:
            seq.advance(1, 0.0)
    alloc_c.check_integrity()
    progress = [(s.num_tokens, s.num_computed) for s in batch_b]
    assert progress == [(s.num_tokens, s.num_computed) for s in batch_c]
    final = state(alloc_c, batch_c)  # reads the free queue by taking it: read once
    assert state(alloc_b, batch_b) == final

    # (d) grow without a preceding growth_horizon (no cached plan) does the same
    alloc_d, batch_d, _ = build_batch(case)
    growth_d = alloc_d.grow(list(batch_d), k)
    assert (growth_d is None) == (growth is None)
    if growth is not None:
        assert list(growth_d.asked) == list(growth.asked)
    for seq in batch_d:
        seq.advance(k, 1.0)
    assert state(alloc_d, batch_d) == final

    # (e) a real runner's order: grow to the horizon before running, trim to the k steps run
    alloc_e, batch_e, _ = build_batch(case)
    alloc_e.growth_horizon(batch_e, max_steps)
    alloc_e.grow(batch_e, horizon)
    alloc_e.trim(k)
    for seq in batch_e:
        seq.advance(k, 1.0)
    alloc_e.check_integrity()
    assert state(alloc_e, batch_e) == final


def test_growth_horizon_exact_small_case():
    alloc = PagedAllocator(16, 4, watermark=0.0)  # 4 blocks
    a, b = new_seq(1, 3, 20), new_seq(2, 6, 20)
    admit(alloc, a)  # 4 tokens known, block [0]
    admit(alloc, b)  # 7 tokens known, blocks [1, 2]
    assert alloc.append(a) == [] and alloc.append(b) == []
    # a writes positions 3, 4, ...: block 2 of its own at step 1; b crosses at step 2 (position 8)
    # one free block (3): a takes it at step 1, b fails at step 2
    assert alloc.growth_horizon([a, b], 10) == 2
    assert alloc.growth_horizon([a, b], 1) == 1
    batch = (a, b)
    assert alloc.growth_horizon(batch, 10) == 2
    growth = alloc.grow(batch, 2)
    assert list(growth.asked) == [0, 4]
    assert list(growth.target) == [0, 4]
    assert blocks(alloc, a) == [0, 3]
    assert blocks(alloc, b) == [1, 2]
    for seq in batch:
        seq.advance(2, 1.0)
    alloc.check_integrity()
    assert alloc.num_free_blocks == 0


# ---------------------------------------------------------------- stateful: paged


class PagedMachine(RuleBasedStateMachine):
    """Random admissions, decodes, preemptions, forks and multi-step segments against a model.

    The model keeps every block table and the free queue, so block ids are checked exactly.
    """

    def __init__(self) -> None:
        super().__init__()
        self.alloc: PagedAllocator | None = None
        self.tables: dict[Sequence, list[int]] = {}
        self.queue: deque[int] = deque()
        self.preempted: list[Sequence] = []
        self.next_id = 0

    # -- model

    def bfor(self, tokens: int) -> int:
        return -(-tokens // self.alloc.block_size)

    def refs(self, block: int) -> int:
        return sum(block in table for table in self.tables.values())

    def shared(self) -> bool:
        return any(self.refs(b) > 1 for t in self.tables.values() for b in t)

    def cow_indices(self, seq: Sequence) -> list[int]:
        table = self.tables[seq]
        low = seq.num_computed // self.alloc.block_size
        high = min(self.bfor(seq.num_tokens), len(table))
        return [i for i in range(low, high) if self.refs(table[i]) > 1]

    def model_can_append(self, seq: Sequence) -> bool:
        need = self.bfor(seq.num_tokens) - len(self.tables[seq]) + len(self.cow_indices(seq))
        return len(self.queue) >= need

    def model_append(self, seq: Sequence) -> list[tuple[int, int]]:
        table, copies = self.tables[seq], []
        for i in self.cow_indices(seq):
            copies.append((table[i], self.queue.popleft()))
            table[i] = copies[-1][1]
        while len(table) < self.bfor(seq.num_tokens):
            table.append(self.queue.popleft())
        return copies

    def model_free(self, seq: Sequence) -> None:
        table = self.tables.pop(seq)
        self.queue.extend(b for b in reversed(table) if self.refs(b) == 0)

    def new_request(self, prompt: int, output: int) -> Request:
        self.next_id += 1
        return Request(self.next_id, 0.0, prompt, output)

    def release(self, seq: Sequence) -> None:
        self.alloc.free(seq)
        self.model_free(seq)

    def step_one(self, seq: Sequence) -> None:
        can = self.alloc.can_append(seq)
        assert can == self.model_can_append(seq)
        if not can:  # recompute preemption
            self.release(seq)
            seq.preempt()
            self.preempted.append(seq)
            return
        expected = self.model_append(seq)
        assert self.alloc.append(seq) == expected
        if seq.advance(1, 0.0):
            self.release(seq)

    def admit_seq(self, seq: Sequence) -> bool:
        need = self.bfor(seq.num_tokens)
        can = self.alloc.can_allocate(seq)
        assert can == (len(self.queue) - need >= self.alloc.watermark_blocks)
        if can:
            self.alloc.allocate(seq)
            self.tables[seq] = [self.queue.popleft() for _ in range(need)]
            if seq.advance(1, 0.0):
                self.release(seq)
        return can

    # -- rules

    @initialize(
        block_size=st.integers(1, 4),
        num_blocks=st.integers(1, 16),
        tail=st.integers(0, 3),
        watermark=st.sampled_from([0.0, 0.1, 0.25]),
    )
    def setup(self, block_size, num_blocks, tail, watermark):
        self.alloc = PagedAllocator(num_blocks * block_size + tail % block_size, block_size, watermark)
        self.queue = deque(range(num_blocks))

    @rule(prompt=st.integers(1, 12), output=st.integers(1, 10))
    def admit(self, prompt, output):
        self.admit_seq(Sequence(self.new_request(prompt, output)))

    @precondition(lambda self: self.preempted)
    @rule(pick=st.integers(0, 100))
    def readmit(self, pick):
        seq = self.preempted[pick % len(self.preempted)]
        if self.admit_seq(seq):
            self.preempted.remove(seq)

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 100))
    def step(self, pick):
        self.step_one(list(self.tables)[pick % len(self.tables)])

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 100))
    def free(self, pick):
        self.release(list(self.tables)[pick % len(self.tables)])

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 100), same_request=st.booleans(), extra=st.integers(1, 10))
    def fork(self, pick, same_request, extra):
        parent = list(self.tables)[pick % len(self.tables)]
        request = parent.request
        if not same_request:
            request = self.new_request(parent.request.prompt_len, parent.num_generated + extra)
        child = Sequence(request)
        child.num_tokens = parent.num_tokens
        child.num_computed = parent.num_computed
        child.num_generated = parent.num_generated
        child.status = parent.status
        self.alloc.fork(parent, child)
        self.tables[child] = list(self.tables[parent])

    @precondition(lambda self: self.tables)
    @rule(cap=st.integers(1, 24))
    def multi_step(self, cap):
        running = []
        for seq in list(self.tables):  # step 0 makes room
            assert self.alloc.can_append(seq) == self.model_can_append(seq)
            if self.alloc.can_append(seq):
                assert self.alloc.append(seq) == self.model_append(seq)
                running.append(seq)
            else:
                self.release(seq)
                seq.preempt()
                self.preempted.append(seq)
        batch = tuple(running)
        if not batch:
            return
        max_steps = min([cap, *(s.remaining for s in batch)])
        # model: run steps 1.. until an append would fail
        expected, free = max_steps, len(self.queue)
        lengths = [len(self.tables[s]) for s in batch]
        if self.shared():
            expected = 1
        else:
            for step in range(1, max_steps):
                for i, seq in enumerate(batch):
                    need = self.bfor(seq.num_tokens + step) - lengths[i]
                    if need > free:
                        expected = step
                        break
                    free -= need
                    lengths[i] += need
                if expected == step:
                    break
        k = self.alloc.growth_horizon(batch, max_steps)
        assert k == expected
        if k > 1:
            asked, target = [0] * k, [0] * k
            bs = self.alloc.block_size
            for step in range(1, k):
                for seq in batch:
                    table = self.tables[seq]
                    while len(table) < self.bfor(seq.num_tokens + step):
                        kv = seq.request.kv_len
                        target[step] += min(kv, (len(table) + 1) * bs) - min(kv, len(table) * bs)
                        asked[step] += bs
                        table.append(self.queue.popleft())
            growth = self.alloc.grow(batch, k)
            if growth is None:
                assert not any(asked)
            else:
                assert list(growth.asked) == asked
                assert list(growth.target) == target
        for seq in batch:
            if seq.advance(k, 1.0):
                self.release(seq)

    # -- invariants

    @invariant()
    def consistent(self):
        if self.alloc is None:
            return
        alloc = self.alloc
        alloc.check_integrity()
        assert list(alloc._free) == list(self.queue)
        for seq, table in self.tables.items():
            assert blocks(alloc, seq) == table
            assert len(table) == self.bfor(seq.num_computed)
        assert alloc._refs == [self.refs(b) for b in range(alloc.num_blocks)]
        assert alloc.num_free_blocks == len(self.queue)
        snap = snapshot(alloc)
        assert_partition(snap)
        assert snap.external_frag == alloc.num_slots - alloc.num_blocks * alloc.block_size
        fp = alloc.footprint()
        held = {b for t in self.tables.values() for b in t}
        assert fp.asked == fp.granted == len(held) * alloc.block_size
        if not self.shared():
            assert fp == alloc._footprint_by_blocks()
            assert fp.tokens == sum(s.num_computed for s in self.tables)
            bs = alloc.block_size
            assert fp.target == sum(min(s.request.kv_len, len(t) * bs) for s, t in self.tables.items())

    def teardown(self):
        if self.alloc is None:
            return
        for seq in list(self.tables):
            self.release(seq)
            self.alloc.check_integrity()
        assert self.alloc.num_free_blocks == self.alloc.num_blocks
        assert sorted(self.alloc._free) == list(range(self.alloc.num_blocks))
        assert list(self.alloc._free) == list(self.queue)
        assert self.alloc.footprint() == Footprint(0, 0, 0, 0)


def test_paged_state_machine():
    run_state_machine_as_test(
        PagedMachine, settings=settings(max_examples=examples(150), stateful_step_count=steps(50))
    )


# ---------------------------------------------------------------- stateful: contiguous

POLICIES = {"oracle": OracleReservation(), "pow2": Pow2Reservation(2048), "max": MaxReservation(24)}


class ContiguousMachine(RuleBasedStateMachine):
    """Random admissions, decodes, finishes and segments on a buddy or first-fit arena."""

    def __init__(self) -> None:
        super().__init__()
        self.alloc: ContiguousAllocator | None = None
        self.fit = ""
        self.resident: list[Sequence] = []
        self.head: Sequence | None = None  # the last request that did not fit, left waiting
        self.next_id = 0

    def grant(self, asked: int) -> int:
        return 1 << (asked - 1).bit_length() if self.fit == "buddy" else asked

    def free_extents(self) -> list[tuple[int, int]]:
        arena = self.alloc.arena
        return arena.free_blocks() if self.fit == "buddy" else arena.free_runs()

    def expected_start(self, asked: int) -> int | None:
        fits = [(s, n) for s, n in self.free_extents() if n >= self.grant(asked)]
        if not fits:
            return None
        if self.fit == "buddy":
            return min(fits, key=lambda f: (f[1], f[0]))[0]
        return fits[0][0]

    def release(self, seq: Sequence) -> None:
        self.alloc.free(seq)
        self.resident.remove(seq)

    @initialize(
        fit=st.sampled_from(sorted(ARENAS)),
        policy=st.sampled_from(sorted(POLICIES)),
        num_slots=st.integers(8, 96),
    )
    def setup(self, fit, policy, num_slots):
        self.fit = fit
        self.alloc = contiguous(num_slots, POLICIES[policy], fit)

    @rule(prompt=st.integers(1, 12), output=st.integers(1, 12))
    def admit(self, prompt, output):
        self.next_id += 1
        seq = new_seq(self.next_id, prompt, output)
        asked = self.alloc.policy.slots(seq.request)
        start = self.expected_start(asked)
        assert self.alloc.can_allocate(seq) == (start is not None)
        if start is None:
            self.head = seq
            return
        self.alloc.allocate(seq)
        assert self.alloc.addressing(seq) == Extent(start, asked, self.grant(asked))
        self.resident.append(seq)
        if seq.advance(1, 0.0):
            self.release(seq)

    @precondition(lambda self: self.resident)
    @rule(pick=st.integers(0, 100))
    def step(self, pick):
        seq = self.resident[pick % len(self.resident)]
        assert self.alloc.can_append(seq)
        assert self.alloc.append(seq) == []
        if seq.advance(1, 0.0):
            self.release(seq)

    @precondition(lambda self: self.resident)
    @rule(pick=st.integers(0, 100))
    def free(self, pick):
        self.release(self.resident[pick % len(self.resident)])

    @precondition(lambda self: self.resident)
    @rule(cap=st.integers(1, 12))
    def multi_step(self, cap):
        batch = tuple(self.resident)
        for seq in batch:
            assert self.alloc.append(seq) == []
        max_steps = min([cap, *(s.remaining for s in batch)])
        assert self.alloc.growth_horizon(batch, max_steps) == max_steps
        assert self.alloc.grow(batch, max_steps) is None
        for seq in batch:
            if seq.advance(max_steps, 1.0):
                self.release(seq)

    @invariant()
    def consistent(self):
        if self.alloc is None:
            return
        alloc = self.alloc
        alloc.check_integrity()
        extents = sorted((alloc.addressing(s) for s in self.resident), key=lambda e: e.start)
        for a, b in pairwise(extents):
            assert a.start + a.granted <= b.start
        assert all(e.start + e.granted <= alloc.num_slots for e in extents)
        fp = alloc.footprint()
        assert fp == Footprint(
            tokens=sum(s.num_computed for s in self.resident),
            target=sum(s.request.kv_len for s in self.resident),
            asked=sum(e.asked for e in extents),
            granted=sum(e.granted for e in extents),
        )
        assert alloc.external_frag(None) == 0
        assert_partition(snapshot(alloc))
        if self.head is not None:
            free = alloc.num_slots - fp.granted
            fits = alloc.can_allocate(self.head)
            assert alloc.external_frag(self.head) == (0 if fits else free)
            assert_partition(snapshot(alloc, self.head))

    def teardown(self):
        if self.alloc is None:
            return
        for seq in list(self.resident):
            self.release(seq)
            self.alloc.check_integrity()
        n = self.alloc.num_slots
        assert self.free_extents() == (buddy_initial(n) if self.fit == "buddy" else [(0, n)])
        assert self.alloc.footprint() == Footprint(0, 0, 0, 0)


def test_contiguous_state_machine():
    run_state_machine_as_test(
        ContiguousMachine, settings=settings(max_examples=examples(150), stateful_step_count=steps(50))
    )


@pytest.mark.parametrize("fit", sorted(ARENAS))
def test_contiguous_free_restores_the_arena(fit):
    alloc = contiguous(48, OracleReservation(), fit)
    seqs = [new_seq(i, 3, 4) for i in range(6)]  # kv_len 6
    for seq in seqs:
        admit(alloc, seq)
    for seq in seqs[1::2] + seqs[::2]:
        alloc.free(seq)
        alloc.check_integrity()
    assert alloc.arena.num_free == 48
    expected = buddy_initial(48) if fit == "buddy" else [(0, 48)]
    listing = alloc.arena.free_blocks() if fit == "buddy" else alloc.arena.free_runs()
    assert listing == expected


def test_paged_append_all_is_all_or_nothing():
    alloc = PagedAllocator(16, 2, watermark=0.0)  # 8 blocks of 2 slots
    seqs = [new_seq(i, 2, 8) for i in range(3)]
    for seq in seqs:
        admit(alloc, seq)  # 3 tokens known, 1 block each: the next step needs a second block
    assert alloc.append_all(seqs) == []
    assert [blocks(alloc, s) for s in seqs] == [[0, 3], [1, 4], [2, 5]]  # in batch order
    for seq in seqs:
        seq.advance(1, 0.0)
    assert alloc.append_all(seqs) == []  # position 3 still lies in block 2 of each: nothing taken
    assert alloc.num_free_blocks == 2
    for seq in seqs:
        seq.advance(1, 0.0)
    before = ([blocks(alloc, s) for s in seqs], alloc.num_free_blocks)
    assert alloc.append_all(seqs) is None  # three need a block, two are free: nothing changes
    assert ([blocks(alloc, s) for s in seqs], alloc.num_free_blocks) == before
    alloc.check_integrity()


def test_contiguous_append_all_takes_nothing():
    alloc = contiguous(64, OracleReservation())
    seqs = [new_seq(i, 4, 5) for i in range(2)]
    for seq in seqs:
        admit(alloc, seq)
    free = alloc.arena.num_free
    assert alloc.append_all(seqs) == [] and alloc.arena.num_free == free


def test_paged_swap_out_and_in_move_blocks_between_device_and_host():
    alloc = PagedAllocator(16, 2, watermark=0.0, host_blocks=3)  # 8 device blocks, 3 host blocks
    a, b = new_seq(1, 5, 4), new_seq(2, 3, 4)
    admit(alloc, a)  # 5 prompt tokens: blocks 0, 1, 2
    admit(alloc, b)  # blocks 3, 4
    assert alloc.can_swap_out(a) and alloc.swap_out(a) == [(0, 0), (1, 1), (2, 2)]
    alloc.check_integrity()
    assert not alloc.can_swap_out(b)  # 2 blocks, 0 host blocks left
    assert list(alloc._free) == [5, 6, 7, 2, 1, 0]  # a's device blocks went back, last first
    assert alloc.can_swap_in(a)
    assert alloc.swap_in(a) == [(0, 5), (1, 6), (2, 7)]  # same host blocks, new device blocks
    assert blocks(alloc, a) == [5, 6, 7] and alloc.can_swap_out(b)
    alloc.check_integrity()
