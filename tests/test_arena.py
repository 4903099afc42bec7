"""Slot arenas: exact grant addresses, splitting and merging, fit queries, random operation runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.arena import BuddyArena, FirstFitArena
from tests.support import examples

OPT13B_SLOTS = 15_728
OPT13B_TOP = [
    (0, 8192),
    (8192, 4096),
    (12288, 2048),
    (14336, 1024),
    (15360, 256),
    (15616, 64),
    (15680, 32),
    (15712, 16),
]


# ---------------------------------------------------------------- reference models


def decomposition(num_slots: int) -> list[tuple[int, int]]:
    """Top-level `(start, size)` blocks of a buddy arena: powers of two, largest first."""
    blocks, start = [], 0
    for bit in reversed(range(num_slots.bit_length())):
        if num_slots >> bit & 1:
            blocks.append((start, 1 << bit))
            start += 1 << bit
    return blocks


def buddy_free_reference(num_slots: int, allocated: dict[int, int]) -> list[tuple[int, int]]:
    """The unique free-block set of an eagerly merging buddy arena holding `allocated`.

    A block with no granted slot inside is free whole; otherwise, unless it is itself a grant,
    its two halves are examined in turn.
    """
    free: list[tuple[int, int]] = []

    def visit(start: int, size: int) -> None:
        if allocated.get(start) == size:
            return
        inside = [s for s in allocated if start <= s < start + size]
        if not inside:
            free.append((start, size))
            return
        assert size > 1, "a granted extent is not a buddy block"
        visit(start, size // 2)
        visit(start + size // 2, size // 2)

    for start, size in decomposition(num_slots):
        visit(start, size)
    return sorted(free)


def free_runs_reference(num_slots: int, allocated: dict[int, int]) -> list[tuple[int, int]]:
    """Maximal runs of slots that no extent in `allocated` covers, from a slot bitmap."""
    used = [False] * num_slots
    for start, size in allocated.items():
        for slot in range(start, start + size):
            assert not used[slot], f"slot {slot} granted twice"
            used[slot] = True
    runs, slot = [], 0
    while slot < num_slots:
        if used[slot]:
            slot += 1
            continue
        begin = slot
        while slot < num_slots and not used[slot]:
            slot += 1
        runs.append((begin, slot - begin))
    return runs


def grant_of(n: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return size


# ---------------------------------------------------------------- buddy: exact scenarios


def test_buddy_top_level_blocks_are_the_binary_decomposition():
    arena = BuddyArena(OPT13B_SLOTS)
    assert arena.free_blocks() == OPT13B_TOP
    assert arena.num_free == OPT13B_SLOTS
    assert sum(size for _, size in OPT13B_TOP) == OPT13B_SLOTS
    arena.check_integrity({})


@pytest.mark.parametrize("num_slots", [1, 2, 3, 6, 24, 100, 1024, 4097])
def test_buddy_initial_free_list(num_slots):
    arena = BuddyArena(num_slots)
    assert arena.free_blocks() == decomposition(num_slots)
    arena.check_integrity({})


def test_buddy_split_power_of_two_arena_grants_from_slot_zero():
    arena = BuddyArena(16384)
    assert arena.grant_size(1100) == 2048
    assert arena.alloc(1100) == 0
    assert arena.free_blocks() == [(2048, 2048), (4096, 4096), (8192, 8192)]
    assert arena.num_free == 16384 - 2048
    assert arena.alloc(1100) == 2048
    assert arena.alloc(3000) == 4096
    assert arena.free_blocks() == [(8192, 8192)]
    arena.check_integrity({0: 2048, 2048: 2048, 4096: 4096})


def test_buddy_takes_the_smallest_sufficient_block_before_splitting():
    """On 15,728 slots a free top-level 2048 block exists, so 1100 slots land there, not at 0."""
    arena = BuddyArena(OPT13B_SLOTS)
    assert arena.alloc(1100) == 12288
    assert arena.free_blocks() == [b for b in OPT13B_TOP if b != (12288, 2048)]
    # the next 1100 must split the 4096 block at 8192 (lowest order with a free block)
    assert arena.alloc(1100) == 8192
    assert (10240, 2048) in arena.free_blocks()
    assert (8192, 4096) not in arena.free_blocks()
    assert arena.num_free == OPT13B_SLOTS - 2 * 2048
    arena.check_integrity({12288: 2048, 8192: 2048})


def test_buddy_split_leaves_upper_halves_free():
    arena = BuddyArena(24)  # 16@0 + 8@16
    assert arena.alloc(3) == 16  # order 2: split the 8 block, not the 16 one
    assert arena.free_blocks() == [(0, 16), (20, 4)]
    assert arena.alloc(4) == 20
    assert arena.alloc(1) == 0  # nothing smaller than 16 is free: split it down to 1
    assert arena.free_blocks() == [(1, 1), (2, 2), (4, 4), (8, 8)]
    assert arena.num_free == 15
    arena.check_integrity({16: 4, 20: 4, 0: 1})


@pytest.mark.parametrize("order", [(16, 20, 0), (0, 16, 20), (20, 0, 16), (0, 20, 16)])
def test_buddy_merges_back_after_frees_in_any_order(order):
    arena = BuddyArena(24)
    grants = {arena.alloc(3): 4, arena.alloc(4): 4, arena.alloc(1): 1}
    assert grants == {16: 4, 20: 4, 0: 1}
    for start in order:
        arena.release(start)
        del grants[start]
        arena.check_integrity(grants)
        assert arena.free_blocks() == buddy_free_reference(24, grants)
    assert arena.free_blocks() == [(0, 16), (16, 8)]
    assert arena.num_free == 24


def test_buddy_never_merges_across_top_level_blocks():
    arena = BuddyArena(24)
    assert arena.alloc(8) == 16
    assert arena.alloc(8) == 0
    assert arena.free_blocks() == [(8, 8)]
    arena.release(16)  # 8@16 sits next to the free 8@8 but is not its buddy
    assert arena.free_blocks() == [(8, 8), (16, 8)]
    arena.release(0)
    assert arena.free_blocks() == [(0, 16), (16, 8)]
    arena.check_integrity({})


def test_buddy_smallest_top_level_block_does_not_merge_past_the_arena():
    arena = BuddyArena(6)  # 4@0 + 2@4; 4 ^ 2 == 6 lies past the end
    assert arena.alloc(2) == 4
    assert arena.alloc(2) == 0
    arena.release(4)
    assert arena.free_blocks() == [(2, 2), (4, 2)]
    arena.release(0)
    assert arena.free_blocks() == [(0, 4), (4, 2)]
    arena.check_integrity({})


def test_buddy_can_fit_and_unusable_slots():
    arena = BuddyArena(16)
    assert arena.alloc(1) == 0
    assert arena.free_blocks() == [(1, 1), (2, 2), (4, 4), (8, 8)]
    assert arena.can_fit(8)
    assert not arena.can_fit(9)
    assert not arena.can_fit(16)  # 15 slots free, but no 16 block
    assert arena.free_slots_unusable_for(16) == 15
    assert arena.free_slots_unusable_for(9) == 15  # 9 slots take a 16 block: every free block is too small
    assert arena.free_slots_unusable_for(8) == 7  # 1 + 2 + 4; the 8 block serves it
    assert arena.free_slots_unusable_for(5) == 7  # 5 takes an 8 block
    assert arena.free_slots_unusable_for(4) == 3
    assert arena.free_slots_unusable_for(1) == 0


def test_buddy_can_ever_fit_is_the_largest_top_level_block():
    arena = BuddyArena(24)
    assert arena.can_ever_fit(16)
    assert not arena.can_ever_fit(17)
    assert not arena.can_ever_fit(24)
    big = BuddyArena(OPT13B_SLOTS)
    assert big.can_ever_fit(8192)
    assert not big.can_ever_fit(8193)
    assert BuddyArena(16384).can_ever_fit(16384)
    # fitting now is never more than fitting ever
    big.alloc(8192)
    assert not big.can_fit(8192)
    assert big.can_ever_fit(8192)


def test_buddy_opt13b_fits_exactly_seven_2048_grants():
    arena = BuddyArena(OPT13B_SLOTS)
    starts = []
    while arena.can_fit(2048):
        starts.append(arena.alloc(2048))
    assert starts == [12288, 8192, 10240, 0, 2048, 4096, 6144]
    assert arena.num_free == 1392
    assert arena.free_blocks() == OPT13B_TOP[3:]
    assert arena.free_slots_unusable_for(2048) == 1392
    assert arena.free_slots_unusable_for(1100) == 1392  # 1100 also needs a 2048 block
    assert arena.can_fit(1024)
    assert arena.free_slots_unusable_for(1024) == 1392 - 1024
    arena.check_integrity(dict.fromkeys(starts, 2048))


def test_buddy_stale_heap_entries_stay_bounded():
    """Merged-away blocks leave heap entries behind; they must not pile up without bound.

    Each alloc(1)/release cycle on 15,728 slots splits the 16 block at 15712 into 8+4+2+1 and
    merges it back. The four upper halves become stale heap entries in orders 0..3, whose
    free counts are then 0, so `_pop` never visits those heaps to drop them.
    """
    arena = BuddyArena(OPT13B_SLOTS)
    for _ in range(10_000):
        arena.release(arena.alloc(1))
    assert arena.free_blocks() == OPT13B_TOP
    entries = sum(len(heap) for heap in arena._heaps)
    assert entries <= 4 * len(arena.free_blocks()) + 64, f"{entries} heap entries for 8 free blocks"


# ---------------------------------------------------------------- first fit: exact scenarios


def test_first_fit_grants_exact_sizes_at_lowest_addresses():
    arena = FirstFitArena(100)
    assert [arena.alloc(n) for n in (10, 20, 30)] == [0, 10, 30]
    assert arena.grant_size(37) == 37
    assert arena.num_free == 40
    assert arena.free_runs() == [(60, 40)]
    arena.check_integrity({0: 10, 10: 20, 30: 30})


def test_first_fit_reuses_the_lowest_hole_that_is_long_enough():
    arena = FirstFitArena(100)
    a, b, c, d = (arena.alloc(n) for n in (10, 20, 30, 5))
    assert (a, b, c, d) == (0, 10, 30, 60)
    arena.release(a)  # hole [0, 10)
    arena.release(c)  # hole [30, 60)
    assert arena.free_runs() == [(0, 10), (30, 30), (65, 35)]
    assert arena.alloc(12) == 30  # [0, 10) is too short
    assert arena.alloc(10) == 0  # exact fit consumes the hole
    assert arena.free_runs() == [(42, 18), (65, 35)]
    assert arena.alloc(18) == 42
    assert arena.free_runs() == [(65, 35)]
    arena.check_integrity({10: 20, 60: 5, 30: 12, 0: 10, 42: 18})


@pytest.mark.parametrize(
    "order", [("left", "right", "mid"), ("right", "left", "mid"), ("mid", "left", "right")]
)
def test_first_fit_coalesces_on_both_sides(order):
    arena = FirstFitArena(30)
    grants = {"left": arena.alloc(10), "mid": arena.alloc(10), "right": arena.alloc(10)}
    assert grants == {"left": 0, "mid": 10, "right": 20}
    held = {0: 10, 10: 10, 20: 10}
    for name in order:
        arena.release(grants[name])
        del held[grants[name]]
        arena.check_integrity(held)
        assert arena.free_runs() == free_runs_reference(30, held)
    assert arena.free_runs() == [(0, 30)]


def test_first_fit_release_merges_with_both_neighbours_at_once():
    arena = FirstFitArena(40)
    starts = [arena.alloc(10) for _ in range(4)]
    arena.release(starts[0])
    arena.release(starts[2])
    assert arena.free_runs() == [(0, 10), (20, 10)]
    arena.release(starts[1])
    assert arena.free_runs() == [(0, 30)]
    assert arena.can_fit(30)
    assert not arena.can_fit(31)
    arena.check_integrity({30: 10})


def test_first_fit_fit_queries():
    arena = FirstFitArena(24)
    assert arena.can_ever_fit(24)
    assert not arena.can_ever_fit(25)
    starts = [arena.alloc(6) for _ in range(4)]
    arena.release(starts[0])
    arena.release(starts[2])  # two holes of 6, 12 slots free
    assert arena.num_free == 12
    assert arena.can_fit(6)
    assert not arena.can_fit(7)
    assert arena.free_slots_unusable_for(7) == 12
    assert arena.free_slots_unusable_for(6) == 0
    assert arena.can_ever_fit(24)


# ---------------------------------------------------------------- random runs

ops = st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.integers(0, 10_000)), max_size=60)


@settings(max_examples=examples(150))
@given(num_slots=st.integers(1, 300), operations=ops)
def test_buddy_random_runs_match_the_reference(num_slots, operations):
    arena = BuddyArena(num_slots)
    held: dict[int, int] = {}
    for is_alloc, size, pick in operations:
        free = arena.free_blocks()
        assert free == buddy_free_reference(num_slots, held)
        fits = [(s, z) for s, z in free if z >= grant_of(size)]
        assert arena.can_fit(size) == bool(fits)
        assert arena.free_slots_unusable_for(size) == sum(z for _, z in free if z < grant_of(size))
        assert arena.can_ever_fit(size) == (grant_of(size) <= decomposition(num_slots)[0][1])
        if is_alloc and fits:
            smallest = min(z for _, z in fits)
            expected = min(s for s, z in fits if z == smallest)
            start = arena.alloc(size)
            assert start == expected
            assert start % grant_of(size) == 0
            held[start] = grant_of(size)
        elif held:
            start = sorted(held)[pick % len(held)]
            arena.release(start)
            del held[start]
        arena.check_integrity(held)
        assert arena.num_free == num_slots - sum(held.values())
    release_all(arena, held)
    assert arena.free_blocks() == decomposition(num_slots)
    assert arena.num_free == num_slots


def release_all(arena, held: dict[int, int]) -> None:
    """Free every grant, checking the arena after each release."""
    for start in list(held):
        arena.release(start)
        del held[start]
        arena.check_integrity(held)


@settings(max_examples=examples(150))
@given(num_slots=st.integers(1, 300), operations=ops)
def test_first_fit_random_runs_match_the_reference(num_slots, operations):
    arena = FirstFitArena(num_slots)
    held: dict[int, int] = {}
    for is_alloc, size, pick in operations:
        runs = arena.free_runs()
        assert runs == free_runs_reference(num_slots, held)
        fits = [s for s, length in runs if length >= size]
        assert arena.can_fit(size) == bool(fits)
        assert arena.free_slots_unusable_for(size) == sum(n for _, n in runs if n < size)
        if is_alloc and fits:
            start = arena.alloc(size)
            assert start == fits[0]
            held[start] = size
        elif held:
            start = sorted(held)[pick % len(held)]
            arena.release(start)
            del held[start]
        arena.check_integrity(held)
        assert arena.num_free == num_slots - sum(held.values())
    release_all(arena, held)
    assert arena.free_runs() == [(0, num_slots)]
    assert arena.num_free == num_slots


@settings(max_examples=examples(100))
@given(data=st.data(), log_size=st.integers(0, 6))
def test_buddy_unit_grants_merge_back_in_any_free_order(data, log_size):
    size = 1 << log_size
    arena = BuddyArena(size)
    starts = [arena.alloc(1) for _ in range(size)]
    assert starts == list(range(size))
    assert not arena.can_fit(1)
    order = data.draw(st.permutations(starts))
    held = dict.fromkeys(starts, 1)
    for start in order:
        arena.release(start)
        del held[start]
        arena.check_integrity(held)
        assert arena.free_blocks() == buddy_free_reference(size, held)
    assert arena.free_blocks() == [(0, size)]
