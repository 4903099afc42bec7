"""Behaviours of the hybrid prefix-caching allocators (`engines.hybrid_prefix`) that a mutation run of
that module found unpinned: the default watermark and chunked prefill passed through to the grouped
allocator, block keys at the trace's hash block size, a model of window layers only, what a hit on
blocks another sequence holds costs at admission, appends that take the last free pages, what a
sequence freed mid-prefill leaves, forks before and after the prefill (copy-on-write versus cached
sharing, in footprints and in multi-step segments), and a duplicate block that lost its key.

Every number is worked out by hand on `tests.test_hybrid_prefix`'s small model: three window layers
of 8 bytes a token (window 9) and one full layer of 16 bytes, blocks of 4 tokens; hybrid pages of 32
bytes (a window block 3 pages, a full one 2), a slot 40 bytes.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from engines.hybrid_prefix import HybridPrefixAllocator, JengaPrefixAllocator
from kvbench.kvspec.layers import SlidingWindow, kv_groups
from kvbench.requests import Request
from kvbench.sequence import Sequence
from tests.test_hybrid_prefix import BS, GROUPS, WINDOW, prefill, shared

SLOT_BYTES = 40  # one token in every layer of GROUPS


def slots(num_bytes: float) -> float:
    return num_bytes / SLOT_BYTES


class TrackedSequence(Sequence):
    """A `Sequence` a weak reference can follow (`Sequence` has slots and no `__weakref__`)."""

    __slots__ = ("__weakref__",)


# ---------------------------------------------------------------- construction


def test_the_default_watermark_holds_back_one_percent_of_the_pages():
    """600 slots are 750 pages of 32 bytes; the default watermark (1 %) keeps 7 of them back, so a
    prompt of 148 blocks a group (740 pages) is admitted and one of 149 (745 pages) is not, though
    it would fit the pool. Why: the prefix allocator passes its watermark on to the grouped one."""
    alloc = HybridPrefixAllocator(600, BS, GROUPS)
    assert alloc.pool.num_pages == 750 and alloc.watermark_pages == 7
    assert alloc.can_allocate(Sequence(Request(0, 0.0, 148 * BS, 4)))
    assert not alloc.can_allocate(Sequence(Request(1, 0.0, 149 * BS, 4)))


@pytest.mark.parametrize("cls", [HybridPrefixAllocator, JengaPrefixAllocator])
def test_chunked_prefill_takes_window_blocks_chunk_by_chunk_past_a_hit(cls):
    """Under chunked prefill (steps of 4 tokens) a window group spans only what the next step
    writes. A 21-token prompt admitted cold takes 1 window block and 6 full ones; once its 20-token
    prefix is cached, a 30-token prompt hits 5 blocks (the window group blocks 3-4 only) and takes
    past the hit the one window block its next chunk (tokens 20-23) writes, where the full group
    takes all 3 of its remaining blocks. Why: the step budget reaches the grouped allocator, and a
    hit's tokens count as computed when the new blocks are counted."""
    alloc = cls(60, BS, GROUPS, watermark=0.0, step_tokens=4)
    a = shared(0, 21)
    assert alloc.can_allocate(a)
    alloc.allocate(a)
    assert alloc.held_blocks(a) == [1, 6]
    for _ in range(5):  # chunks of 4 tokens to 20 computed, the window's blocks taken as it moves
        a.compute(4, 0.0)
        alloc.append(a)
    a.advance(1, 0.0)  # the last prompt token samples
    alloc.check_integrity()
    alloc.free(a)
    b = shared(1, 30)
    assert alloc.can_allocate(b)
    alloc.allocate(b)
    assert b.num_cached_tokens == 20 and alloc.prefix_hits_by_request[1] == (8, 20)
    assert alloc.held_blocks(b) == [3, 8]
    alloc.check_integrity()


def test_block_hashes_key_blocks_at_the_allocators_hash_block_size():
    """Requests without a prefix group but with the trace's block hashes (hash blocks of 8 tokens)
    share blocks by those hashes: a second request with the same hashes hits its whole 20-token
    prefix, and one whose second hash block differs hits only the 2 blocks (8 tokens) of the first.
    Why: the allocator keys blocks with its `hash_block_size`; without it every request would be
    keyed by its own id and nothing would be shared."""
    alloc = HybridPrefixAllocator(60, BS, GROUPS, watermark=0.0, hash_block_size=8)
    assert alloc.hash_block_size == 8
    prefill(alloc, Sequence(Request(0, 0.0, 21, 4, block_hashes=(11, 12, 13))))
    same = Sequence(Request(1, 0.0, 21, 4, block_hashes=(11, 12, 13)))
    prefill(alloc, same)
    assert same.num_cached_tokens == 20 and alloc.prefix_hits_by_request[1] == (8, 20)
    other = Sequence(Request(2, 0.0, 21, 4, block_hashes=(11, 99, 13)))
    prefill(alloc, other)
    assert other.num_cached_tokens == 8 and alloc.prefix_hits_by_request[2] == (8, 8)


# ---------------------------------------------------------------- hits and admission


def test_a_model_of_window_layers_only_hits_on_its_windows_blocks():
    """With no full-attention group nothing bounds the hit but the window: a 21-token prompt whose
    20-token prefix is cached hits 5 blocks, taking only blocks 3 and 4 (a hit at 20 tokens reads
    from position 12), its entries 0-2 null. Why: the hit search must work without any full group
    to start its bound from."""
    groups = kv_groups((SlidingWindow(1, 2, WINDOW),) * 3)  # 24 bytes a token: pages of 96 bytes
    alloc = HybridPrefixAllocator(60, BS, groups, watermark=0.0)
    a = shared(0, 21)
    prefill(alloc, a)
    blocks_a = list(alloc._tables[a][0])
    alloc.free(a)
    b = shared(1, 21)
    prefill(alloc, b)
    assert b.num_cached_tokens == 20 and alloc.prefix_hits_by_request[1] == (8,)
    assert alloc._tables[b][0][:5] == [None, None, None, blocks_a[3], blocks_a[4]]
    assert alloc.prefix_hits_by_group([0, 1]) == {"window-9": 8}


def test_a_hit_on_blocks_a_resident_sequence_holds_costs_no_pages_at_admission():
    """28 slots are 35 pages. a (21 tokens) holds 6 blocks a group (30 pages); its admission check
    for b slides a's window, parking its window blocks 0-2 (9 pages): room 5 + 9 pages. b hits a's
    five full blocks and window blocks 3-4, all still referenced by a: they cost nothing, and b's
    one new block a group (5 pages) is admitted. Counting those hits as taken back from the parked
    blocks (16 pages more) would refuse it."""
    alloc = HybridPrefixAllocator(28, BS, GROUPS, watermark=0.0)
    assert alloc.pool.num_pages == 35
    a = shared(0, 21)
    prefill(alloc, a)
    b = shared(1, 21)
    assert alloc.can_allocate(b) and alloc.can_allocate_all([b])
    alloc.allocate(b)
    assert b.num_cached_tokens == 20 and alloc.held_blocks(b) == [3, 6]
    assert alloc.num_free_pages == 0 and alloc.pool.parked_pages == 9
    alloc.check_integrity()


def test_an_append_may_take_the_last_free_pages():
    """8 slots are 10 pages; a 3-token prompt takes one block a group (5 pages). Its second decode
    step writes position 4, in a new block of each group: exactly the 5 pages left, which a batch
    append takes (no watermark applies to running sequences)."""
    alloc = HybridPrefixAllocator(8, BS, GROUPS, watermark=0.0)
    seq = Sequence(Request(0, 0.0, 3, 10))
    prefill(alloc, seq)
    assert alloc.append_all([seq]) == [] and alloc.num_free_pages == 5
    seq.advance(1, 0.0)  # 4 computed: the next step writes position 4
    assert alloc.append_all([seq]) == []
    assert alloc.held_blocks(seq) == [2, 2] and alloc.num_free_pages == 0
    alloc.check_integrity()


def test_jenga_prefix_counts_a_live_pages_spare_blocks_as_allocator_overhead():
    """A 10-token prompt takes three blocks a group: two window pages (2 blocks each, one spare
    block of 4 x 24 bytes) and one full page (3 blocks, none spare). The spare 96 bytes are 2.4
    slots of 40 granted beyond the 12 asked, as plain `jenga` grants them."""
    alloc = JengaPrefixAllocator(60, BS, GROUPS, watermark=0.0)
    alloc.allocate(Sequence(Request(0, 0.0, 10, 4)))
    footprint = alloc.footprint()
    assert (footprint.asked, footprint.granted) == (12.0, pytest.approx(12.0 + slots(96)))
    alloc.check_integrity()


# ---------------------------------------------------------------- freeing and registration


def test_a_sequence_freed_mid_prefill_keeps_the_blocks_it_computed_cached():
    """Under chunked prefill (8 tokens a step) a sequence preempted after its first chunk has
    computed blocks 0-1 of its 5 keyed blocks: they stay cached, the rest is forgotten, and a later
    request of the prefix hits those 2 blocks (8 tokens) in both groups. Why: freeing registers what
    was computed and drops the sequence from what remains to register."""
    alloc = HybridPrefixAllocator(60, BS, GROUPS, watermark=0.0, step_tokens=8)
    a = shared(0, 21)
    assert alloc.can_allocate(a)
    alloc.allocate(a)
    a.compute(8, 0.0)
    alloc.free(a)
    assert alloc.cache.num_evictable == 4  # blocks 0 and 1 of each group, parked
    b = shared(1, 21)
    assert alloc.can_allocate(b)
    alloc.allocate(b)
    assert b.num_cached_tokens == 8 and alloc.prefix_hits_by_request[1] == (8, 8)
    alloc.check_integrity()


def test_the_allocator_keeps_no_reference_to_a_freed_sequence():
    """Once freed, a sequence is garbage: the allocator keeps neither its block keys nor anything
    else of it. Why: a long run frees millions of sequences."""
    alloc = HybridPrefixAllocator(60, BS, GROUPS, watermark=0.0)
    seq = TrackedSequence(Request(0, 0.0, 21, 4, prefix_group="g", prefix_len=20))
    prefill(alloc, seq)
    alloc.free(seq)
    ref = weakref.ref(seq)
    del seq
    gc.collect()
    assert ref() is None


def test_a_duplicate_block_that_lost_its_key_stays_private_after_the_winner_is_evicted():
    """a and b (13 tokens, 3 keyed blocks) are admitted together under chunked prefill (4 tokens a
    step) and both compute block 0: a's copies win its key, b's stay private. a is freed; c takes
    every page left, evicting a's parked copies. b then computes block 1, registered as usual, but
    its private block 0 is not registered late: d of the same prefix finds no leading block and
    hits nothing."""
    alloc = HybridPrefixAllocator(20, BS, GROUPS, watermark=0.0, step_tokens=4)  # 25 pages
    a, b = shared(0, 13), shared(1, 13)
    for seq in (a, b):
        assert alloc.can_allocate(seq)
        alloc.allocate(seq)
    a.compute(4, 0.0)
    b.compute(4, 0.0)
    alloc.append(b)  # registers block 0 of each: a's first
    assert alloc.cache.num_cached == 2
    alloc.free(a)
    c = Sequence(Request(9, 0.0, 16, 2))  # 1 window block and 4 full: the 11 pages left
    assert alloc.can_allocate(c)
    alloc.allocate(c)
    assert alloc.cache.evictions == 2 and alloc.cache.num_cached == 0 and alloc.num_free_pages == 0
    b.compute(4, 0.0)
    alloc.free(c)
    alloc.free(b)  # registers b's block 1 of each group
    assert alloc.cache.num_cached == 2
    d = shared(3, 13)
    assert alloc.can_allocate(d)
    alloc.allocate(d)
    assert d.num_cached_tokens == 0 and alloc.prefix_hits_by_request[3] == (0, 0)
    alloc.check_integrity()


# ---------------------------------------------------------------- forks


def fork_pair(alloc) -> tuple[Sequence, Sequence]:
    """A 21-token prompt of prefix group g with two samples: the parent admitted, the child not yet."""
    request = Request(0, 0.0, 21, 4, prefix_group="g", prefix_len=20, n=2)
    parent = Sequence(request)
    assert alloc.can_allocate(parent)
    alloc.allocate(parent)
    return parent, Sequence(request, sample=1)


def test_a_fork_after_the_prefill_shares_cached_blocks_and_copies_the_last_one():
    """Forked after its prefill (21 computed), the parent's five keyed blocks a group are cached
    and its sixth is a copy-on-write candidate. The footprint counts every block once: 21 tokens,
    24 wanted and asked. The child's append copies its sixth block of each group (and both slide
    their windows to blocks 3-5); then sharing is the cached blocks only, full 0-4 and window 3-4
    (5 x 64 + 2 x 96 bytes saved), and the footprint subtracts them from both sharers'."""
    alloc = HybridPrefixAllocator(60, BS, GROUPS, watermark=0.0)
    parent, child = fork_pair(alloc)
    parent.advance(1, 0.0)
    child.copy_progress(parent)
    assert alloc.fork(parent, child) == []
    alloc.check_integrity()
    fp = alloc.footprint()
    assert (fp.tokens, fp.target, fp.asked, fp.granted) == pytest.approx((21, 24, 24, 24))
    assert alloc.sharing_saved() == 24  # every shared block while one is copy-on-write
    assert alloc.append_all([parent, child]) is None  # copy-on-write: sequence by sequence
    assert len(alloc.append(child)) == 2 and alloc.append(parent) == []
    alloc.check_integrity()
    assert alloc.sharing_saved() == round(slots(5 * 64 + 2 * 96))
    shared_bytes = 20 * 16 + 8 * 24
    tokens, wanted = 2 * (9 * 24 + 21 * 16) - shared_bytes, 2 * (12 * 24 + 24 * 16) - shared_bytes
    fp = alloc.footprint()
    assert (fp.tokens, fp.target, fp.asked) == pytest.approx((slots(tokens), slots(wanted), slots(wanted)))
    assert alloc.append_all([parent, child]) == []  # multi-step segments are on again


def test_a_fork_before_the_prefill_turns_its_shared_prompt_blocks_into_cached_hits():
    """Forked right after admission, parent and child share 6 uncomputed blocks a group, all
    copy-on-write candidates (24 slots saved; steps one by one). The prefill computes the shared
    prompt; at the next call its five keyed blocks a group are cached with two references: no
    longer copy-on-write but cached sharing, so after the child copies the one block it writes
    into (the sixth of each group) and both windows slide to blocks 3-5, nothing is copy-on-write
    and multi-step segments are back: 3 steps until the sixth block fills. Saved: full blocks 0-4
    and window blocks 3-4, held twice."""
    alloc = HybridPrefixAllocator(60, BS, GROUPS, watermark=0.0)
    parent, child = fork_pair(alloc)
    child.copy_progress(parent)
    assert alloc.fork(parent, child) == []
    alloc.check_integrity()
    assert alloc.sharing_saved() == 24
    assert alloc.append_all([parent, child]) is None and alloc.growth_horizon([parent, child], 8) == 1
    parent.advance(1, 0.0)  # the prefill, for both
    child.copy_progress(parent)
    assert len(alloc.append(child)) == 2 and alloc.append(parent) == []
    alloc.check_integrity()
    assert alloc.sharing_saved() == round(slots(5 * 64 + 2 * 96))
    assert alloc.footprint().tokens == pytest.approx(slots(2 * (9 * 24 + 21 * 16) - 20 * 16 - 8 * 24))
    assert alloc.append_all([parent, child]) == [] and alloc.growth_horizon([parent, child], 8) == 3
    alloc.free(child)
    alloc.free(parent)
    # the prompt blocks stay cached: a later request of the prefix hits them
    later = shared(1, 21)
    prefill(alloc, later)
    assert later.num_cached_tokens == 20 and alloc.prefix_hits_by_request[1] == (8, 20)
