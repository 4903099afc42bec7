"""Exact cases for the paged engines' allocators (paged, prefix caching, vmm), one behaviour each.

Written against mutation testing's survivors (results/mutation/engines-paged/): each test pins a
value a user could see (a block id, a count, a refusal, an order) that the broader tests of
test_allocators.py, test_prefix_cache.py and test_vmm.py leave free, and the integrity checks
are shown to fail on a broken state (a check that cannot fail guards nothing). Real allocators,
tiny sizes, no engine loop: every test runs in milliseconds.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from engines.allocator import Extent
from engines.block_keys import block_keys
from engines.paged import PagedAllocator
from engines.paged_prefix import PrefixCachingAllocator
from engines.prefix_cache import PrefixCache
from engines.vmm import VirtualAllocator
from kvbench.requests import Request, group_number
from kvbench.sequence import Sequence, sequence_for

ROOT = 0x6B7662656E6368  # block_keys' chain start, written out: the keys are a stable format
IDS, HASHES, GROUP, OWN = 0, 1, 2, 3  # its content tags


def new_seq(request_id: int, prompt: int, output: int, **fields) -> Sequence:
    return Sequence(Request(request_id, 0.0, prompt, output, **fields))


def table(alloc, seq: Sequence) -> list[int]:
    return list(alloc.addressing(seq).blocks)


def free_queue(alloc: PagedAllocator) -> list[int]:
    """The plain free queue, front first (what the next allocations take, in order)."""
    return list(alloc._free)


# ---------------------------------------------------------------- PrefixCache


def test_prefix_cache_maps_keys_and_blocks_and_matches_the_leading_run():
    cache = PrefixCache()
    assert (cache.num_cached, cache.num_evictable, cache.evictions) == (0, 0, 0)
    assert cache.register(5, 50) is True
    assert cache.register(6, 60) is True
    assert cache.register(7, 50) is False  # the key is taken: the first block registered wins
    assert (cache.num_cached, cache.holds(5), cache.holds(7)) == (2, True, False)
    assert (cache.key_of(6), cache.key_of(7)) == (60, None)
    assert cache.match([50, 60, 70]) == [5, 6]
    assert cache.match([60, 50]) == [6, 5]
    assert cache.match([70, 50]) == []  # a run of leading keys only
    assert cache.match([]) == []
    with pytest.raises(AssertionError):
        cache.register(5, 99)  # a block is cached under one key


def test_prefix_cache_lru_evicts_the_least_recently_parked_and_restore_undoes_it():
    cache = PrefixCache()
    for block, key in ((1, 10), (2, 20), (3, 30)):
        cache.register(block, key)
    cache.park(2)
    cache.park(1)
    cache.park(3)
    assert (cache.num_evictable, cache.is_evictable(1), cache.is_evictable(4)) == (3, True, False)
    cache.revive(1)
    assert (cache.num_evictable, cache.is_evictable(1)) == (2, False)
    assert cache.evict() == (2, 20)
    assert (cache.num_cached, cache.evictions, cache.holds(2), cache.match([20])) == (2, 1, False, [])
    cache.restore(2, 20)  # back at the front of the LRU, found again by its key
    assert (cache.num_cached, cache.evictions, cache.match([20])) == (3, 0, [2])
    assert cache.evict() == (2, 20)
    assert cache.evict() == (3, 30)
    assert cache.evictions == 2
    cache.check_integrity([0, 1, 0, 0])  # block 1 referenced, 2 and 3 gone


def test_prefix_cache_integrity_check_fails_on_a_broken_state():
    cache = PrefixCache()
    cache.register(1, 10)
    cache.register(2, 20)
    cache.park(2)
    cache.check_integrity([0, 1, 0])
    with pytest.raises(AssertionError, match="^the LRU is not the unreferenced cached blocks$"):
        cache.check_integrity([0, 0, 0])  # block 1 unreferenced but not in the LRU
    with pytest.raises(AssertionError, match="^the LRU is not the unreferenced cached blocks$"):
        cache.check_integrity([0, 1, 1])  # block 2 referenced but in the LRU
    cache._key_of[1] = 11  # block 1 no longer maps back to key 10
    with pytest.raises(AssertionError, match="^block 1 does not map back to its key$"):
        cache.check_integrity([0, 1, 0])
    cache._key_of[1] = 10
    cache._key_of[3] = 30  # a block without its key
    with pytest.raises(AssertionError, match="^key and block maps differ in size$"):
        cache.check_integrity([0, 1, 0, 1])


# ---------------------------------------------------------------- block keys


def chain(*contents) -> tuple[int, ...]:
    keys, key = [], ROOT
    for content in contents:
        key = hash((key, content))
        keys.append(key)
    return tuple(keys)


def test_block_keys_from_token_ids_by_hand():
    request = Request(3, 0.0, 10, 1, prompt_ids=tuple(range(10, 20)))
    assert block_keys(request, 4) == chain((IDS, (10, 11, 12, 13)), (IDS, (14, 15, 16, 17)))
    assert block_keys(request, 5) == chain((IDS, (10, 11, 12, 13, 14)), (IDS, (15, 16, 17, 18, 19)))
    assert block_keys(request, 16) == ()


def test_block_keys_from_a_prefix_group_then_own_tokens_by_hand():
    request = Request(3, 0.0, 20, 1, prefix_group="g", prefix_len=9)
    group, own = (GROUP, group_number("g")), (OWN, 3)
    assert block_keys(request, 4) == chain(group, group, own, own, own)
    # a prefix longer than the prompt (as a truncated chat turn may carry) covers the prompt only
    longer = request._replace(prefix_len=30)
    assert block_keys(longer, 4) == chain(group, group, group, group, group)
    assert block_keys(Request(3, 0.0, 9, 1), 4) == chain(own, own)


def test_block_keys_from_block_hashes_by_hand():
    # hash blocks of 6 tokens; kvbench blocks of 4: block j covers hash blocks j*4//6 .. (4j+3)//6
    request = Request(8, 0.0, 18, 1, block_hashes=(100, 200, 300))
    own = (OWN, 8)
    spans = [(HASHES, (100,)), (HASHES, (100, 200)), (HASHES, (200,)), (HASHES, (300,))]
    assert block_keys(request, 4, 6) == chain(*spans)
    # hashes covering fewer tokens than the prompt: the rest is the request's own content
    short = Request(8, 0.0, 20, 1, block_hashes=(100, 200))
    assert block_keys(short, 4, 6) == chain(*spans[:3], own, own)
    assert block_keys(short, 4, None) == chain(own, own, own, own, own)
    # hash blocks of 3: block 0's last token (3) opens hash block 1, block 1's (7) lies in hash block 2
    thirds = Request(8, 0.0, 8, 1, block_hashes=(1, 2, 3))
    assert block_keys(thirds, 4, 3) == chain((HASHES, (1, 2)), (HASHES, (2, 3)))
    assert block_keys(short, 4, 0) == chain(own, own, own, own, own)


def test_block_keys_of_different_kinds_of_content_never_meet():
    """Token ids, hash ids, a group's prefix and a request's own tokens are different things even
    where their numbers agree: with 2-token blocks a prompt starting (2, 7) is not request 7's own
    content, nor is a token 100 hash block 100 (a trace may mix rows with and without ids)."""
    ids = Request(0, 0.0, 4, 1, prompt_ids=(2, 7, 2, 7))
    own = Request(7, 0.0, 4, 1)
    assert not set(block_keys(ids, 2)) & set(block_keys(own, 2))
    number = group_number("g")  # below 2**63: a valid token id
    grouped = Request(1, 0.0, 4, 1, prefix_group="g", prefix_len=4)
    group_ids = Request(2, 0.0, 4, 1, prompt_ids=(1, number, 1, number))
    assert not set(block_keys(group_ids, 2)) & set(block_keys(grouped, 2))
    hashed = Request(3, 0.0, 2, 1, block_hashes=(100, 200))
    tokens = Request(4, 0.0, 2, 1, prompt_ids=(100, 200))
    assert not set(block_keys(hashed, 1, 1)) & set(block_keys(tokens, 1))
    own_100, hashes_2_100 = Request(100, 0.0, 2, 1), Request(5, 0.0, 2, 1, block_hashes=(2, 100))
    assert not set(block_keys(own_100, 2)) & set(block_keys(hashes_2_100, 2, 1))


# ---------------------------------------------------------------- PagedAllocator


def footprint(alloc) -> tuple:
    fp = alloc.footprint()
    return (fp.tokens, fp.target, fp.asked, fp.granted)


def test_paged_geometry_and_defaults():
    alloc = PagedAllocator(1000, 4)  # 250 blocks; vLLM's default watermark keeps 1 % of them free
    assert (alloc.num_blocks, alloc.watermark_blocks, alloc.num_host_blocks) == (250, 2, 0)
    assert (alloc.num_free_blocks, alloc.external_frag(None)) == (250, 0)
    assert PagedAllocator(18, 4).external_frag(None) == 2
    assert [alloc.blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    seq = new_seq(1, 4, 1)
    alloc.allocate(seq)
    assert not alloc.can_swap_out(seq)  # no swap space unless asked for
    assert (alloc.sharing_saved(), footprint(alloc)) == (0, (0, 4, 4, 4))


def test_paged_can_ever_hold_counts_beams_against_the_blocks_above_the_watermark():
    alloc = PagedAllocator(40, 4, watermark=0.2)  # 10 blocks, 2 kept free: 8 usable
    assert alloc.can_ever_hold(Request(0, 0.0, 30, 3))  # kv_len 32: 8 blocks
    assert not alloc.can_ever_hold(Request(0, 0.0, 30, 4))  # 9 blocks
    assert alloc.can_ever_hold(Request(0, 0.0, 16, 1, beam_width=2))  # 4 blocks x 2 beams
    assert not alloc.can_ever_hold(Request(0, 0.0, 17, 1, beam_width=2))  # 5 x 2
    assert alloc.can_ever_hold(Request(0, 0.0, 17, 1, n=2))  # samples fork after the prompt


def test_paged_can_allocate_all_counts_every_prompt_above_the_watermark():
    alloc = PagedAllocator(40, 4, watermark=0.2)  # 10 blocks, 2 kept free
    assert alloc.can_allocate_all([new_seq(1, 16, 1), new_seq(2, 16, 1)])  # 8 blocks leave 2
    assert not alloc.can_allocate_all([new_seq(1, 16, 1), new_seq(2, 17, 1)])  # 9 leave 1
    assert alloc.can_allocate(new_seq(1, 32, 1)) and not alloc.can_allocate(new_seq(1, 33, 1))


def test_paged_allocate_append_and_free_move_blocks_and_targets_exactly():
    alloc = PagedAllocator(32, 4, watermark=0.0)  # 8 blocks
    a, b = new_seq(1, 5, 4), new_seq(2, 3, 10)  # kv_len 8 and 12
    alloc.allocate(a)
    alloc.allocate(b)
    assert (table(alloc, a), table(alloc, b)) == ([0, 1], [2])
    assert footprint(alloc) == (0, 8 + 4, 12, 12)  # b's target: the 4 slots it holds
    a.advance(1, 0.0)
    b.advance(1, 0.0)  # b: 4 tokens known, position 3 computed next: still block 2
    assert alloc.append(b) == [] and table(alloc, b) == [2]
    b.advance(1, 0.0)  # 5 tokens: position 4 needs a second block
    assert alloc.can_append(b)
    assert alloc.append(b) == [] and table(alloc, b) == [2, 3]
    assert footprint(alloc) == (5 + 4, 8 + 8, 16, 16)
    with pytest.raises(AssertionError):
        alloc.allocate(a)  # already resident
    alloc.free(a)
    assert free_queue(alloc) == [4, 5, 6, 7, 1, 0]  # last block first, at the back
    assert footprint(alloc) == (4, 8, 8, 8)
    alloc.check_integrity()


def test_paged_can_append_needs_a_free_block_only_when_crossing_into_one():
    alloc = PagedAllocator(8, 4, watermark=0.0)  # 2 blocks
    a, b = new_seq(1, 4, 3), new_seq(2, 4, 3)
    for seq in (a, b):
        alloc.allocate(seq)
        seq.advance(1, 0.0)  # 5 tokens: the next step writes position 4, in a second block
    assert alloc.num_free_blocks == 0
    assert not alloc.can_append(a)
    alloc.free(b)
    assert alloc.can_append(a)  # exactly one free block for exactly one needed
    assert alloc.append(a) == [] and table(alloc, a) == [0, 1]
    assert footprint(alloc) == (4, 6, 8, 8)  # kv_len 6 of the 8 slots held


def forked_pair(alloc: PagedAllocator, prompt: int = 6, output: int = 5) -> tuple[Sequence, Sequence]:
    """A parent after its prefill and a child forked from it (a second sample)."""
    parent, child = new_seq(1, prompt, output), new_seq(2, prompt, output)
    alloc.allocate(parent)
    parent.advance(1, 0.0)
    child.copy_progress(parent)
    assert alloc.fork(parent, child) == []
    return parent, child


def test_paged_fork_shares_every_block_and_counts_the_saving():
    alloc = PagedAllocator(16, 4, watermark=0.0)  # 4 blocks
    parent, child = forked_pair(alloc)  # blocks [0, 1], 6 tokens computed, kv_len 10
    assert table(alloc, child) == [0, 1] and alloc._refs == [2, 2, 0, 0]
    assert alloc.sharing_saved() == 8  # two blocks held twice
    assert footprint(alloc) == (6, 8, 8, 8)  # shared slots counted once
    assert alloc.growth_horizon([parent, child], 5) == 1  # copy-on-write: step by step
    assert alloc.append_all([parent, child]) is None  # decided sequence by sequence
    with pytest.raises(AssertionError):
        alloc.fork(parent, child)  # already resident
    alloc.check_integrity()
    alloc.free(child)
    assert alloc._refs == [1, 1, 0, 0] and alloc.sharing_saved() == 0
    assert footprint(alloc) == (6, 8, 8, 8)
    alloc.check_integrity()


def test_paged_copy_on_write_copies_only_the_shared_block_being_written():
    alloc = PagedAllocator(20, 4, watermark=0.0)  # 5 blocks
    parent, child = forked_pair(alloc)  # position 6 lies in shared block 1
    filler = new_seq(3, 8, 1)
    alloc.allocate(filler)  # blocks 2, 3: one free block left
    assert alloc.can_append(parent)
    other = new_seq(4, 4, 1)
    alloc.allocate(other)  # the last free block
    assert not alloc.can_append(parent) and not alloc.can_append(child)
    alloc.free(other)
    assert alloc.append(parent) == [(1, 4)]
    assert (table(alloc, parent), table(alloc, child), alloc._refs) == ([0, 4], [0, 1], [2, 1, 1, 1, 1])
    assert alloc.sharing_saved() == 4
    assert alloc.append(child) == []  # block 1 is the child's alone now
    alloc.check_integrity()
    assert footprint(alloc) == (6 + 6 - 4, 8 + 8 - 4 + 8, 20, 20)  # block 0 counted once; 5 blocks held


def test_paged_append_all_takes_exactly_the_free_blocks_when_they_suffice():
    alloc = PagedAllocator(16, 4, watermark=0.0)  # 4 blocks
    a, b = new_seq(1, 4, 5), new_seq(2, 4, 5)
    for seq in (a, b):
        alloc.allocate(seq)
        seq.advance(1, 0.0)  # 5 tokens each: a second block each
    c = new_seq(3, 4, 5)
    alloc.allocate(c)
    c.advance(1, 0.0)
    assert alloc.append_all([a, b, c]) is None  # 3 needed, 1 free: nothing taken
    assert (table(alloc, a), table(alloc, b), alloc.num_free_blocks) == ([0], [1], 1)
    alloc.free(c)
    assert alloc.append_all([a, b]) == []  # needs 2, 2 free
    assert (table(alloc, a), table(alloc, b), alloc.num_free_blocks) == ([0, 3], [1, 2], 0)  # c's went last
    assert footprint(alloc) == (8, 16, 16, 16)


def test_paged_swap_space_bounds_and_swap_in_above_the_watermark():
    alloc = PagedAllocator(40, 4, watermark=0.2, host_blocks=2)  # 10 blocks, 2 kept free, 2 host blocks
    a = new_seq(1, 8, 4)
    alloc.allocate(a)  # blocks 0, 1
    a.advance(1, 0.0)  # 9 tokens: the next step needs a third block
    assert alloc.can_swap_out(a)  # exactly 2 host blocks for 2 device blocks
    assert alloc.swap_out(a) == [(0, 0), (1, 1)]
    assert footprint(alloc) == (0, 0, 0, 0) and free_queue(alloc)[-2:] == [1, 0]
    alloc.check_integrity()
    big = new_seq(2, 20, 1)
    alloc.allocate(big)  # 5 blocks: 5 free; a needs 3 (its next token), 2 stay for the watermark
    assert alloc.can_swap_in(a)
    small = new_seq(3, 1, 1)
    alloc.allocate(small)
    assert not alloc.can_swap_in(a)  # 4 free - 3 needed < 2
    alloc.free(small)
    assert alloc.swap_in(a) == [(0, 8), (1, 9)]
    assert table(alloc, a) == [8, 9] and list(alloc._host_free) == [0, 1]
    assert footprint(alloc) == (8, 8 + 20, 28, 28)  # a: 8 computed, 8 of kv_len 11 held; big: 20
    alloc.check_integrity()
    shared = PagedAllocator(16, 4, 0.0, host_blocks=4)
    parent, _ = forked_pair(shared)
    assert not shared.can_swap_out(parent)  # shared blocks are recomputed, not swapped


def test_paged_addressing_is_the_block_table_and_its_block_size():
    alloc = PagedAllocator(32, 8)
    seq = new_seq(1, 9, 1)
    alloc.allocate(seq)
    table_ = alloc.addressing(seq)
    assert (table_.blocks, table_.block_size) == ((0, 1), 8)


def test_paged_integrity_allows_the_blocks_a_segment_grew_ahead_until_trimmed():
    alloc = PagedAllocator(64, 4, watermark=0.0)
    a, b = new_seq(1, 3, 20), new_seq(2, 6, 20)
    for seq in (a, b):
        alloc.allocate(seq)
        seq.advance(1, 0.0)
        alloc.append(seq)
    growth = alloc.grow([a, b], 9)  # a crosses into new blocks at steps 1 and 5, b at 2 and 6
    assert (list(growth.asked), list(growth.target)) == ([0, 4, 4, 0, 0, 4, 4, 0, 0],) * 2
    assert (table(alloc, a), table(alloc, b)) == ([0, 3, 5], [1, 2, 4, 6])
    alloc.check_integrity()  # a holds 2 blocks past its tokens, b 2: grown ahead, not yet run
    alloc.trim(3)
    assert (table(alloc, a), table(alloc, b), free_queue(alloc)[:3]) == ([0, 3], [1, 2, 4], [5, 6, 7])
    for seq in (a, b):
        seq.advance(3, 0.0)
    alloc.check_integrity()


def paged_state() -> tuple[PagedAllocator, tuple[Sequence, ...]]:
    """Shared blocks, a private one and a swapped-out sequence: every table the checks read."""
    alloc = PagedAllocator(32, 4, watermark=0.0, host_blocks=2)
    parent, child = forked_pair(alloc)  # blocks 0, 1 shared
    other, gone = new_seq(3, 4, 3), new_seq(4, 4, 3)
    for seq in (other, gone):
        alloc.allocate(seq)  # blocks 2, 3
        seq.advance(1, 0.0)
    alloc.swap_out(gone)  # host block 0
    alloc.check_integrity()
    return alloc, (parent, child, other, gone)


PAGED_CORRUPTIONS = {
    "^seq 3 maps a block twice$": lambda alloc, seqs: alloc._tables[seqs[2]].append(2),
    "^seq 3 holds 3 blocks$": lambda alloc, seqs: alloc._tables[seqs[2]].extend([3, 4]),
    "^reference counts differ from the block tables$": lambda alloc, seqs: alloc._refs.__setitem__(5, 1),
    # the closed-form shared footprint reads the running target total, which the checks recount
    "^shared footprint wrong$": lambda alloc, seqs: setattr(alloc, "_target", alloc._target + 1),
    "^target total out of date$": lambda alloc, seqs: (
        alloc.free(seqs[1]),
        setattr(alloc, "_target", alloc._target + 1),
    ),
    "^host blocks lost$": lambda alloc, seqs: alloc._host_free.append(0),
    "^a sequence is both resident and swapped$": lambda alloc, seqs: alloc._swapped.__setitem__(seqs[2], []),
    "^a block is free twice$": lambda alloc, seqs: alloc._free.append(alloc._free[0]),
    "^free set wrong$": lambda alloc, seqs: alloc._free.pop(),
    "^shared-block count wrong$": lambda alloc, seqs: setattr(alloc, "_num_shared", 1),
}


@pytest.mark.parametrize("message", PAGED_CORRUPTIONS)
def test_paged_integrity_check_names_what_is_broken(message):
    alloc, seqs = paged_state()
    PAGED_CORRUPTIONS[message](alloc, seqs)
    with pytest.raises(AssertionError, match=message):
        alloc.check_integrity()


def test_paged_shared_footprint_counts_partial_and_uncomputed_blocks_once():
    alloc = PagedAllocator(40, 4, watermark=0.0)  # 10 blocks
    parent, child = forked_pair(alloc, prompt=8, output=3)  # kv_len 10: blocks 0, 1 full and shared
    for seq in (parent, child):
        assert alloc.append(seq) == []  # position 8: a private third block, nothing computed in it
        alloc.check_integrity()  # after the parent's: block 1 is the child's last, the parent's whole
    assert (table(alloc, parent), table(alloc, child)) == ([0, 1, 2], [0, 1, 3])
    alloc.check_integrity()  # the closed form agrees with counting block by block
    assert footprint(alloc) == (8, 8 + 2 + 2, 16, 16)  # the third blocks want 2 slots each
    assert alloc.footprint() == alloc._footprint_by_blocks()


# ---------------------------------------------------------------- PrefixCachingAllocator


def test_prefix_fork_of_cached_blocks_counts_the_extra_references_as_saved():
    alloc = PrefixCachingAllocator(32, 4, watermark=0.0)  # 8 blocks
    parent = new_seq(1, 9, 4)
    alloc.allocate(parent)
    parent.advance(1, 0.0)  # 9 computed: blocks 0, 1 full and keyed
    assert alloc.can_allocate(new_seq(9, 1, 1))  # registers parent's blocks
    assert (alloc.cache.num_cached, alloc.sharing_saved()) == (2, 0)
    child = new_seq(1, 9, 4)
    child.copy_progress(parent)
    assert alloc.fork(parent, child) == []
    assert alloc._refs[:3] == [2, 2, 2]
    assert (alloc._num_shared, alloc._dup) == (1, 2)  # block 2 is copy-on-write; 0, 1 are cached
    assert alloc.sharing_saved() == 12  # every shared block counts while one is copy-on-write
    alloc.check_integrity()
    assert alloc.append(child) == [(2, 3)]  # position 9 lies in the uncached shared block
    assert (alloc._num_shared, alloc.sharing_saved()) == (0, 8)
    assert footprint(alloc) == (9 + 9 - 8, 12 + 12 - 8, 16, 16)
    alloc.check_integrity()
    alloc.free(parent)
    assert (alloc._refs[:4], alloc._dup, alloc.cache.num_evictable) == ([1, 1, 0, 1], 0, 0)
    alloc.free(child)
    assert (alloc.cache.num_evictable, alloc.num_free_blocks) == (2, 8)
    alloc.check_integrity()


# ---------------------------------------------------------------- VirtualAllocator


def vmm(num_pages: int = 5, **kw) -> VirtualAllocator:
    """4-slot pages in a 22-slot budget, ranges of 8 slots (2 pages), no watermark unless asked."""
    args = {"num_slots": 22, "page_tokens": 4, "num_pages": num_pages, "max_len": 8, "max_requests": 3}
    return VirtualAllocator(**(args | {"watermark": 0.0} | kw))


def test_vmm_fork_with_no_page_left_needs_none_and_the_group_counts_its_members():
    alloc = vmm(num_pages=2)
    leader = sequence_for(Request(1, 0.0, 3, 2, n=2))
    alloc.allocate(leader)  # a range per output, one page each: no page left
    alloc.check_integrity()  # the pooled range holds the prompt's page (and its target) already
    leader.advance(1, 0.0)
    child = leader.group.members[1]
    child.copy_progress(leader)
    assert alloc.available_pages == 0
    assert alloc.fork(leader, child) == [(0, 8, 3)]  # the prompt's page is already mapped
    leader.group.forked = True
    assert (alloc.page_table(leader), alloc.page_table(child)) == ((0,), (1,))
    alloc.check_integrity()
    alloc.free(child)  # the group keeps the range, not its page
    assert (alloc.page_table(leader), list(alloc._unmapped), alloc._free_ranges) == ((0,), [1], {2})
    alloc.check_integrity()
    alloc.free(leader)  # the last member: every range goes, pages kept mapped idle
    assert (alloc._free_ranges, alloc.footprint().idle) == ({0, 1, 2}, 4)
    alloc.check_integrity()


def test_vmm_geometry_of_fractional_pages_and_its_defaults():
    alloc = VirtualAllocator(21, Fraction(5, 2), 8, max_len=11, max_requests=2, watermark=0.25)
    # 11 tokens need 5 pages; a range starts on a token boundary: a multiple of 2 pages, 6 (15 tokens)
    assert (alloc.page_tokens, alloc.num_pages) == (Fraction(5, 2), 8)
    assert (alloc.range_pages, alloc.range_slots, alloc.max_requests, alloc.virtual_slots) == (6, 15, 2, 30)
    assert (alloc.watermark_pages, alloc.deferred) == (2, True)
    assert (alloc.maps, alloc.unmaps, alloc.reused, alloc.available_pages) == (0, 0, 0, 8)
    assert [alloc.pages_for(n) for n in (0, 1, 2, 3, 5, 6)] == [0, 1, 1, 2, 2, 3]
    assert [alloc.capacity(n) for n in (0, 1, 2, 3)] == [0, 2, 5, 7]
    assert (alloc.external_frag(None), alloc.sharing_saved()) == (1.0, 0)
    assert list(alloc._unmapped) == list(range(8))
    assert VirtualAllocator(16, 4, 4, max_len=8, max_requests=1).range_pages == 2
    with pytest.raises(AssertionError, match="^pages exceed the budget$"):
        VirtualAllocator(20, 4, 6, max_len=8, max_requests=1)
    with pytest.raises(AssertionError, match="^pages exceed the budget$"):
        VirtualAllocator(20, 0, 6, max_len=8, max_requests=1)
    VirtualAllocator(24, 4, 6, max_len=8, max_requests=1)  # exactly the budget


def test_vmm_never_swaps():
    alloc = vmm()
    seq = new_seq(1, 4, 1)
    alloc.allocate(seq)
    assert not alloc.can_swap_out(seq) and not alloc.can_swap_in(seq)
    with pytest.raises(NotImplementedError, match="^virtual ranges are never swapped$"):
        alloc.swap_out(seq)
    with pytest.raises(NotImplementedError, match="^virtual ranges are never swapped$"):
        alloc.swap_in(seq)


def test_vmm_admission_takes_the_range_needing_fewest_driver_calls_lowest_first():
    alloc = VirtualAllocator(64, 4, 16, max_len=16, max_requests=5, watermark=0.0)  # ranges of 4 pages
    seqs = [new_seq(i, p, 1) for i, p in enumerate((16, 8, 8, 4, 4))]
    for seq in seqs:
        alloc.allocate(seq)  # ranges 0..4 with 4, 2, 2, 1, 1 pages: pages 0-9, 6 unmapped
    for seq in seqs:
        seq.advance(1, 0.0)
        alloc.free(seq)
    assert (alloc.available_pages, alloc.footprint().idle) == (16, 40.0)
    assert list(alloc._unmapped) == [10, 11, 12, 13, 14, 15]
    e = new_seq(10, 8, 1)  # 2 pages: ranges 1 and 2 hold exactly 2; the lower
    alloc.allocate(e)
    assert (alloc.addressing(e), alloc.page_table(e)) == (Extent(16, 8, 8), (4, 5))
    assert (alloc.reused, alloc.maps, alloc.footprint().idle) == (2, 10, 32.0)  # 8 pages still idle
    f = new_seq(11, 12, 1)  # 3 pages: only range 0 holds enough; its fourth page is unmapped
    alloc.allocate(f)
    assert (alloc.addressing(f).start, alloc.page_table(f), alloc.unmaps) == (0, (0, 1, 2), 1)
    assert list(alloc._unmapped) == [10, 11, 12, 13, 14, 15, 3]
    g = new_seq(12, 16, 1)  # 4 pages: none holds enough; the most (range 2: 2 pages), topped up
    alloc.allocate(g)
    assert (alloc.addressing(g).start, alloc.page_table(g)) == (32, (6, 7, 10, 11))
    assert (alloc.reused, alloc.maps) == (7, 12)
    h = new_seq(13, 16, 1)  # ranges 3 and 4 hold 1 page each: the lower, topped up
    alloc.allocate(h)
    assert (alloc.addressing(h).start, alloc.page_table(h)) == (48, (8, 12, 13, 14))
    assert (alloc.reused, alloc.maps) == (8, 15)
    assert (alloc.footprint().idle, alloc.available_pages) == (4.0, 3)  # range 4's page; 15 and 3
    fp = alloc.footprint()
    assert (fp.tokens, fp.target, fp.asked, fp.granted) == (0, 8 + 12 + 16 + 16, 52, 52.0)
    alloc.check_integrity()


def test_vmm_reclaims_from_the_idle_range_holding_fewest_pages_lowest_first():
    alloc = VirtualAllocator(40, 4, 10, max_len=16, max_requests=5, watermark=0.0)
    seqs = [new_seq(i, p, 1) for i, p in enumerate((8, 4, 8, 4))]  # ranges 0-3: 2, 1, 2, 1 pages
    for seq in seqs:
        alloc.allocate(seq)
    grower = new_seq(9, 16, 9)
    alloc.allocate(grower)  # range 4: pages 6-9, the pool is empty
    for seq in seqs:
        seq.advance(1, 0.0)
        alloc.free(seq)  # idle: ranges 0 (pages 0, 1), 1 (2), 2 (3, 4), 3 (5)
    grower.advance(1, 0.0)  # 17 tokens: its range holds 16
    assert alloc.range_slots == 16 and not alloc.can_ever_hold(grower.request)
    taken = [alloc._take_page() for _ in range(6)]
    # fewest first (ranges 1 and 3 hold one each; the lower first), each range's last page first
    assert taken == [2, 5, 1, 0, 4, 3]
    assert (alloc.unmaps, alloc.maps, alloc.footprint().idle, alloc._mapped[:4]) == (6, 16, 0.0, [[]] * 4)


def test_vmm_can_allocate_all_needs_a_range_and_pages_for_each():
    alloc = vmm(num_pages=5, watermark=0.2)  # 1 page kept free at admission, 3 ranges
    two = [new_seq(1, 8, 1), new_seq(2, 8, 1)]
    assert alloc.can_allocate_all(two)  # 4 pages leave 1
    assert not alloc.can_allocate_all([new_seq(1, 8, 1), new_seq(2, 9, 1)])
    assert not alloc.can_allocate_all([new_seq(i, 1, 1) for i in range(4)])  # 4 ranges
    assert alloc.can_allocate_all([new_seq(i, 1, 1) for i in range(3)])
    assert alloc.can_allocate(new_seq(1, 16, 1)) and not alloc.can_allocate(new_seq(1, 17, 1))


def vmm_segment(page, prompts: tuple[int, ...], spare_pages: int, idle_prompt: int = 0):
    """A vmm decode batch right after step 0's append, with `spare_pages` unmapped pages left
    (and, with `idle_prompt`, a finished request's pages mapped idle beside them)."""
    page = Fraction(page)
    pages = VirtualAllocator(1000, page, 0, 64, 1).pages_for
    num_pages = sum(pages(p + 1) for p in prompts) + pages(idle_prompt) + spare_pages
    alloc = VirtualAllocator(int(num_pages * page) + 1, page, num_pages, 64, len(prompts) + 1, watermark=0.0)
    seqs = tuple(new_seq(i, p, 40) for i, p in enumerate(prompts))
    for seq in seqs:
        alloc.allocate(seq)
    if idle_prompt:
        idle = new_seq(99, idle_prompt, 1)
        alloc.allocate(idle)
        idle.advance(1, 0.0)
        alloc.free(idle)
    for seq in seqs:
        seq.advance(1, 0.0)
        alloc.append(seq)
    assert len(alloc._unmapped) == spare_pages
    return alloc, seqs


def vmm_state(alloc: VirtualAllocator, seqs) -> tuple:
    fp = alloc.footprint()  # tokens left out: the grown batch has not run its steps
    tables = [alloc.page_table(seq) for seq in seqs]
    return tables, (fp.target, fp.asked, fp.granted, fp.idle), alloc.maps, list(alloc._unmapped)


VMM_SEGMENTS = [  # page tokens, prompts, spare pages, idle pages' prompt
    (4, (3, 6, 9), 14, 0),
    (4, (4, 1), 5, 8),
    (Fraction(5, 2), (2, 7, 5), 9, 5),
    (Fraction(4, 3), (1, 6), 7, 0),
    (8, (6, 2), 1, 0),  # the spare page goes at step 2; at step 6 the other sequence finds none
]


@pytest.mark.parametrize("case", VMM_SEGMENTS)
def test_vmm_growth_and_trim_equal_step_by_step_appends(case):
    page, prompts, spare, idle = case
    stepped, seqs = vmm_segment(page, prompts, spare, idle)
    states, asked, target, granted, horizon = [vmm_state(stepped, seqs)], [0], [0], [0.0], None
    for step in range(1, 30):
        for seq in seqs:
            seq.advance(1, 0.0)
        before, unmaps = stepped.footprint(), stepped.unmaps
        if stepped.append_all(seqs) is None:  # not enough pages, even reclaiming idle ones
            horizon = step
            break
        if stepped.unmaps > unmaps:
            horizon = step  # the first step that had to reclaim an idle page
            break
        after = stepped.footprint()
        asked.append(after.asked - before.asked)
        target.append(after.target - before.target)
        granted.append(after.granted - before.granted)
        states.append(vmm_state(stepped, seqs))
    grown, seqs = vmm_segment(page, prompts, spare, idle)
    assert grown.grow(seqs, 1) is None  # one step needs nothing beyond step 0's append
    expected_horizon = horizon or 30
    assert grown.growth_horizon(seqs, 30) == expected_horizon
    assert grown.growth_horizon(seqs, 3) == min(3, expected_horizon)
    k = expected_horizon
    growth = grown.grow(seqs, k)
    assert (growth.asked.dtype, growth.target.dtype, growth.granted.dtype) == (np.int64, np.int64, np.float64)
    assert (list(growth.asked), list(growth.target)) == (asked[:k], target[:k])
    assert list(growth.granted) == pytest.approx(granted[:k])
    assert vmm_state(grown, seqs) == states[k - 1]
    grown.trim(k - 2)  # a segment that ran 2 steps short of its plan
    assert vmm_state(grown, seqs) == states[k - 3]
    for seq in seqs:
        seq.advance(k - 2, 0.0)
    grown.check_integrity()


def vmm_state_with_everything() -> tuple[VirtualAllocator, Sequence, Sequence, Sequence]:
    """A forked group (ranges 0, 1), a lone sequence (range 2), an idle range (3) and an empty
    one (4): every table the checks read."""
    alloc = VirtualAllocator(40, 4, 10, max_len=8, max_requests=5, watermark=0.0)
    leader = sequence_for(Request(1, 0.0, 3, 4, n=2))
    alloc.allocate(leader)
    leader.advance(1, 0.0)
    child = leader.group.members[1]
    child.copy_progress(leader)
    alloc.fork(leader, child)
    leader.group.forked = True
    lone, gone = new_seq(2, 4, 4), new_seq(9, 5, 1)
    for seq in (lone, gone):
        alloc.allocate(seq)
        seq.advance(1, 0.0)
    alloc.append(lone)
    alloc.free(gone)
    alloc.check_integrity()
    assert (alloc._mapped, alloc._free_ranges) == ([[0], [1], [2, 5], [3, 4], []], {3, 4})
    return alloc, leader, child, lone


def _steal_a_free_range(alloc: VirtualAllocator, leader: Sequence) -> None:
    free = min(r for r in alloc._free_ranges if not alloc._mapped[r])
    alloc._free_ranges.remove(free)
    alloc._pools[leader.group].append(free)


def _pool_every_member(alloc: VirtualAllocator, leader: Sequence) -> None:
    """The group's ranges all in its pool, though it counts no member resident."""
    for member in leader.group.members:
        alloc._pools[leader.group].append(alloc._owner.pop(member))
    alloc._resident[leader.group] = 0


VMM_CORRUPTIONS = {  # each breaks one thing: (allocator, leader, lone sequence) -> None
    "^a page is lost or mapped twice$": lambda alloc, leader, lone: alloc._unmapped.append(0),
    "^a range is held twice$": lambda alloc, leader, lone: alloc._owner.__setitem__(lone, 1),
    "^a held range is also free$": lambda alloc, leader, lone: alloc._free_ranges.add(1),
    "^a range is lost$": lambda alloc, leader, lone: alloc._free_ranges.remove(4),
    "^idle count wrong$": lambda alloc, leader, lone: setattr(alloc, "_idle", 3),
    "^held count wrong$": lambda alloc, leader, lone: setattr(alloc, "_held", alloc._held + 1),
    "^asked wrong$": lambda alloc, leader, lone: setattr(alloc, "_asked", alloc._asked + 1),
    "^pages idle without deferred reclamation$": lambda alloc, leader, lone: setattr(
        alloc, "deferred", False
    ),
    "^seq 2 lost pages under its tokens$": lambda alloc, leader, lone: setattr(lone, "num_computed", 9),
    "^a group's resident count is wrong$": lambda alloc, leader, lone: alloc._resident.__setitem__(
        leader.group, 1
    ),
    "^a group holds a range too many$": lambda alloc, leader, lone: _steal_a_free_range(alloc, leader),
    "^a group's resident count is (wrong)$": lambda alloc, leader, lone: _pool_every_member(alloc, leader),
    "^target total out of date$": lambda alloc, leader, lone: setattr(alloc, "_target", alloc._target + 1),
}


@pytest.mark.parametrize("message", VMM_CORRUPTIONS)
def test_vmm_integrity_check_names_what_is_broken(message):
    alloc, leader, _, lone = vmm_state_with_everything()
    VMM_CORRUPTIONS[message](alloc, leader, lone)
    with pytest.raises(AssertionError, match=message):
        alloc.check_integrity()


def test_vmm_integrity_counts_a_pooled_range_of_a_group():
    alloc, leader, child, _ = vmm_state_with_everything()
    alloc.free(child)  # its range waits in the group's pool, unmapped
    assert (alloc._pools[leader.group], alloc._mapped[1], list(alloc._unmapped)) == ([1], [], [6, 7, 8, 9, 1])
    alloc.check_integrity()
    fp = alloc.footprint()
    assert (fp.tokens, fp.target, fp.asked, fp.granted, fp.idle) == (3 + 4, 4 + 7, 12, 12.0, 8.0)
    assert alloc.can_allocate(child)  # back into its group's range


def group_seq(request_id: int, prompt: int, output: int = 4, prefix: int = 8) -> Sequence:
    return new_seq(request_id, prompt, output, prefix_group="g", prefix_len=prefix)


def test_prefix_grow_evicts_the_oldest_cached_block_and_trim_puts_it_back():
    alloc = PrefixCachingAllocator(16, 4, watermark=0.0)  # 4 blocks
    first = group_seq(1, 8, 1)
    alloc.allocate(first)  # blocks 0, 1
    first.advance(1, 0.0)
    alloc.free(first)  # both cached, unreferenced: LRU [1, 0]
    runner = new_seq(2, 3, 20)
    alloc.allocate(runner)  # block 2
    runner.advance(1, 0.0)
    alloc.append(runner)
    other = new_seq(3, 4, 1)
    alloc.allocate(other)  # block 3: the free queue is empty
    assert (alloc.num_free_blocks, list(alloc.cache._lru)) == (2, [1, 0])
    assert alloc.growth_horizon([runner], 20) == 9  # two more blocks, at steps 1 and 5; the third at 9
    growth = alloc.grow([runner], 9)
    assert list(growth.asked) == [0, 4, 0, 0, 0, 4, 0, 0, 0]
    assert (table(alloc, runner), alloc.cache.evictions, alloc.cache.num_cached) == ([2, 1, 0], 2, 0)
    alloc.trim(5)  # ran 5 steps: the block of step 5 goes back, cached again, oldest again
    assert (table(alloc, runner), alloc.cache.evictions, list(alloc.cache._lru)) == ([2, 1], 1, [0])
    assert alloc.cache.key_of(0) == block_keys(first.request, 4)[0]
    runner.advance(5, 0.0)
    alloc.check_integrity()
    again = group_seq(4, 6)
    alloc.free(other)
    alloc.allocate(again)  # block 0 is found again; its second block was evicted
    assert (table(alloc, again), again.num_cached_tokens) == ([0, 3], 4)
    alloc.check_integrity()


def test_prefix_swap_out_and_in_register_computed_blocks_again():
    alloc = PrefixCachingAllocator(32, 4, watermark=0.0, host_blocks=4)  # 8 blocks
    a = group_seq(1, 9)
    alloc.allocate(a)
    a.advance(1, 0.0)  # blocks 0, 1 computed and keyed, not yet registered
    assert alloc.cache.num_cached == 0
    assert alloc.swap_out(a) == [(0, 0), (1, 1), (2, 2)]  # registers first, then leaves
    assert (alloc.cache.num_cached, list(alloc.cache._lru)) == (2, [1, 0])
    assert (alloc._keys, alloc._pending, free_queue(alloc)) == ({}, {}, [3, 4, 5, 6, 7, 2])
    filler = new_seq(2, 28, 1)
    alloc.allocate(filler)  # the 6 free blocks, then evicts block 1 (the oldest)
    assert table(alloc, filler) == [3, 4, 5, 6, 7, 2, 1] and alloc.cache.num_cached == 1
    alloc.free(filler)  # never computed: back to the free queue, last block first
    assert alloc.swap_in(a) == [(0, 1), (1, 2), (2, 7)]
    assert alloc._pending == {a: 0} and alloc.cache.num_cached == 1
    assert alloc.can_allocate(new_seq(3, 1, 1))  # registers a's computed blocks where their key is free
    keys = block_keys(a.request, 4)
    assert (alloc.cache.key_of(1), alloc.cache.key_of(2), alloc._pending) == (None, keys[1], {})
    assert alloc.cache.match(keys) == [0, 2]  # block 0 kept the first key
    alloc.check_integrity()


def test_prefix_admission_counts_revived_hits_and_registers_only_computed_blocks():
    alloc = PrefixCachingAllocator(40, 4, watermark=0.0)  # 10 blocks
    a = group_seq(1, 14, prefix=12)  # keys for blocks 0-2 (the group's), 3 prompt blocks + 1
    alloc.allocate(a)
    assert alloc._pending == {a: 0} and alloc.can_allocate(group_seq(9, 1))
    assert alloc.cache.num_cached == 0  # nothing computed yet
    a.num_computed = 5  # a chunk: block 0 computed, block 1 not
    assert alloc.can_allocate(group_seq(9, 1))
    assert (alloc.cache.num_cached, alloc._pending) == (1, {a: 1})
    a.num_computed = 13
    assert alloc.can_allocate(group_seq(9, 1))
    assert (alloc.cache.num_cached, alloc._pending) == (3, {})
    alloc.free(a)  # LRU [2, 1, 0] after its tail block 3
    b = group_seq(2, 13, prefix=12)  # 4 blocks: 3 hits, all unreferenced
    assert alloc.num_free_blocks == 10
    full = new_seq(3, 24, 1)
    alloc.allocate(full)  # 6 free blocks
    assert alloc.num_free_blocks == 4 and alloc.can_allocate(b)  # 4 needed: 1 new, 3 revived
    other = new_seq(4, 1, 1)
    alloc.allocate(other)  # the last free block
    assert not alloc.can_allocate(b)
    alloc.free(other)
    assert alloc.can_allocate(b)
    alloc.allocate(b)
    assert (table(alloc, b), b.num_computed, b.num_cached_tokens) == ([0, 1, 2, 3], 12, 12)
    alloc.check_integrity()


def prefix_state() -> tuple[PrefixCachingAllocator, Sequence, Sequence]:
    """Cached blocks shared by two sequences, two cached in the LRU, three free."""
    alloc = PrefixCachingAllocator(40, 4, watermark=0.0)  # 10 blocks
    a, b, gone = group_seq(1, 14, prefix=12), group_seq(2, 13, prefix=12), new_seq(5, 8, 1)
    alloc.allocate(a)  # blocks 0-3
    a.advance(1, 0.0)
    alloc.allocate(gone)  # blocks 4, 5; registers a's blocks 0-2 first
    gone.advance(1, 0.0)
    alloc.allocate(b)  # hits 0-2, new block 6; registers gone's blocks first
    alloc.free(gone)
    assert (table(alloc, b), list(alloc.cache._lru), alloc._dup) == ([0, 1, 2, 6], [5, 4], 3)
    assert free_queue(alloc) == [7, 8, 9]
    alloc.check_integrity()
    return alloc, a, b


PREFIX_CORRUPTIONS = {
    "^a block is free twice$": lambda alloc, b: alloc._free.append(7),
    "^a free block is cached$": lambda alloc, b: alloc._free.append(5),
    "^free and evictable != unreferenced$": lambda alloc, b: alloc._free.pop(),
    "^$": lambda alloc, b: setattr(alloc, "_num_shared", 1),  # the copy-on-write count
    "^_dup wrong$": lambda alloc, b: setattr(alloc, "_dup", 2),
    "^a pending sequence is not resident$": lambda alloc, b: alloc._pending.__setitem__(new_seq(7, 1, 1), 0),
    "^seq 2: block 0$": lambda alloc, b: alloc._keys.__setitem__(b, (1, 2, 3)),
    "^seq 2: block 1$": lambda alloc, b: alloc._keys.__setitem__(b, alloc._keys[b][:1]),  # keys end early
    "^seq 2: block 0 uncomputed$": lambda alloc, b: setattr(b, "num_computed", 3),
    "^the LRU is not the unreferenced cached blocks$": lambda alloc, b: alloc.cache._lru.pop(5),
}


@pytest.mark.parametrize("message", PREFIX_CORRUPTIONS)
def test_prefix_integrity_check_names_what_is_broken(message):
    alloc, _, b = prefix_state()
    PREFIX_CORRUPTIONS[message](alloc, b)
    with pytest.raises(AssertionError, match=message):
        alloc.check_integrity()


def test_paged_growth_wants_the_partial_last_block_and_a_second_grow_needs_no_horizon():
    alloc = PagedAllocator(64, 4, watermark=0.0)
    a, b = new_seq(1, 3, 8), new_seq(2, 6, 20)  # a: kv_len 10, its third block wants 2 slots
    for seq in (a, b):
        alloc.allocate(seq)
        seq.advance(1, 0.0)
        alloc.append(seq)
    assert alloc.grow([a, b], 1) is None  # a's first crossing is step 1: nothing before it
    growth = alloc.grow([a, b], 7)  # a crosses at steps 1 and 5, b at 2 and 6
    assert (growth.asked.dtype, growth.target.dtype) == (np.int64, np.int64)  # slot counts
    assert list(growth.asked) == [0, 4, 4, 0, 0, 4, 4]
    assert list(growth.target) == [0, 4, 4, 0, 0, 2, 4]
    assert footprint(alloc)[1:] == (10 + 16, 28, 28)  # a: 3 blocks, b: 4 of its 25 slots
    alloc.trim(7)
    for seq in (a, b):
        seq.advance(6, 0.0)
    assert alloc.append(b) == []  # b alone runs the next segment: its step 0 needs no block
    growth = alloc.grow([b], 6)  # straight after a grow: no plan from growth_horizon
    assert list(growth.asked) == [0, 0, 0, 0, 4, 0] and table(alloc, b) == [1, 2, 4, 6, 7]
    alloc.check_integrity()


def test_paged_can_append_counts_a_new_block_beside_shared_full_ones():
    alloc = PagedAllocator(8, 4, watermark=0.0)  # 2 blocks
    parent, child = forked_pair(alloc, prompt=8, output=3)  # both blocks full and shared
    assert not alloc.can_append(parent)  # position 8 needs a third block, none is free
    alloc.free(child)
    assert not alloc.can_append(parent)


def test_prefix_blocks_shared_before_they_are_computed_move_to_the_cached_count():
    alloc = PrefixCachingAllocator(32, 4, watermark=0.0)
    parent, child = new_seq(1, 9, 4), new_seq(1, 9, 4)
    alloc.allocate(parent)
    alloc.fork(parent, child)  # before the prefill: three shared, uncached blocks
    assert (alloc._num_shared, alloc._dup, alloc.sharing_saved()) == (3, 0, 12)
    parent.num_computed = child.num_computed = 4  # a first chunk: block 0 computed
    assert alloc.can_allocate(new_seq(2, 1, 1))  # registers block 0
    assert (alloc._num_shared, alloc._dup, alloc._pending) == (2, 1, {parent: 1})
    parent.advance(1, 0.0)
    child.copy_progress(parent)
    assert alloc.can_allocate(new_seq(2, 1, 1))  # registers block 1
    assert (alloc._num_shared, alloc._dup, alloc.sharing_saved()) == (1, 2, 12)
    assert footprint(alloc) == (9, 12, 12, 12)  # every block once: copy-on-write counting covers all
    alloc.check_integrity()
    assert alloc.append(parent) == [(2, 3)]  # the uncached shared block is copied on write
    assert (alloc._num_shared, alloc._dup, alloc.sharing_saved()) == (0, 2, 8)
    assert footprint(alloc) == (9 + 9 - 8, 12 + 12 - 8, 16, 16)
    alloc.check_integrity()


def test_prefix_trim_gives_plain_free_blocks_back_to_the_front_of_the_queue():
    alloc = PrefixCachingAllocator(24, 4, watermark=0.0)  # 6 blocks
    runner = new_seq(1, 3, 20)
    alloc.allocate(runner)
    runner.advance(1, 0.0)
    alloc.append(runner)
    alloc.grow([runner], 10)  # blocks 1, 2 and 3, at steps 1, 5 and 9, from the free queue
    assert (table(alloc, runner), free_queue(alloc)) == ([0, 1, 2, 3], [4, 5])
    alloc.trim(2)
    assert (table(alloc, runner), free_queue(alloc), alloc.cache.evictions) == ([0, 1], [2, 3, 4, 5], 0)
    runner.advance(2, 0.0)
    alloc.check_integrity()


def test_vmm_mapped_counts_include_idle_ranges():
    alloc, *_ = vmm_state_with_everything()
    counts = alloc.mapped_counts()
    assert (counts.tolist(), counts.dtype) == ([1, 1, 2, 2, 0], np.int64)


def test_vmm_can_append_needs_the_next_page_only_when_crossing_into_it():
    alloc = vmm(num_pages=3)
    a, b = new_seq(1, 4, 4), new_seq(2, 4, 4)
    for seq in (a, b):
        alloc.allocate(seq)  # a page each, one left
        seq.advance(1, 0.0)  # position 4 needs a second page
    assert alloc.can_append(a)  # exactly one page for one needed
    alloc.append(a)
    assert not alloc.can_append(b) and alloc.append_all([b]) is None
    a.advance(1, 0.0)
    assert alloc.can_append(a)  # position 5 lies in a's second page


def test_paged_growth_adds_up_sequences_crossing_at_the_same_step():
    alloc = PagedAllocator(64, 4, watermark=0.0)
    a, b = new_seq(1, 3, 5), new_seq(2, 3, 20)  # a: kv_len 7, its second block wants 3 slots
    for seq in (a, b):
        alloc.allocate(seq)
        seq.advance(1, 0.0)
        alloc.append(seq)
    growth = alloc.grow([a, b], 4)  # both write position 4, in a second block, at step 1
    assert (list(growth.asked), list(growth.target)) == ([0, 8, 0, 0], [0, 3 + 4, 0, 0])
    assert (table(alloc, a), table(alloc, b)) == ([0, 2], [1, 3])


def test_vmm_can_ever_hold_counts_outputs_ranges_and_the_watermark():
    alloc = vmm(num_pages=5, watermark=0.2)  # 1 page kept free: 4 usable; 3 ranges of 8 slots
    assert alloc.can_ever_hold(Request(0, 0.0, 4, 5))  # kv_len 8: a whole range
    assert not alloc.can_ever_hold(Request(0, 0.0, 5, 5))  # 9: longer than a range
    assert alloc.can_ever_hold(Request(0, 0.0, 4, 5, n=2))  # 2 pages x 2 outputs = 4
    assert not alloc.can_ever_hold(Request(0, 0.0, 4, 5, n=3))  # 6 pages
    assert not alloc.can_ever_hold(Request(0, 0.0, 1, 1, n=4))  # 4 outputs, 3 ranges


def test_vmm_admission_of_a_group_and_of_a_pooled_member():
    alloc = vmm(num_pages=3, max_requests=2)
    assert not alloc.can_allocate(sequence_for(Request(1, 0.0, 8, 2, n=2)))  # 2 pages x 2 outputs > 3
    leader = sequence_for(Request(1, 0.0, 4, 4, n=2))
    assert alloc.can_allocate(leader)
    alloc.allocate(leader)  # both ranges, a page each
    leader.advance(1, 0.0)
    child = leader.group.members[1]
    child.copy_progress(leader)
    alloc.fork(leader, child)
    leader.group.forked = True
    alloc.free(child)  # preempted: its range waits in the group's pool; no range is free
    assert alloc._free_ranges == set() and alloc.available_pages == 2
    assert alloc.can_allocate(child)  # back into the group's range
    assert not alloc.can_allocate(new_seq(5, 1, 1))  # pages, but no range
    child.preempt()
    alloc.allocate(child)  # its 5 tokens need 2 pages under its old range: 2, then its own 1 again
    assert (alloc.addressing(child), alloc.page_table(child)) == (Extent(8, 8, 8), (2, 1))
    assert alloc._pools[leader.group] == []
    alloc.check_integrity()  # both members resident again


def test_paged_shared_last_block_partly_wanted_counts_once():
    alloc = PagedAllocator(16, 4, watermark=0.0)
    forked_pair(alloc, prompt=5, output=2)  # kv_len 6: shared block 1 wants 2 slots, holds 1
    assert footprint(alloc) == (4 + 1, 4 + 2, 8, 8)
    alloc.check_integrity()


def test_vmm_fork_needs_a_page_for_the_parents_computed_tokens():
    alloc = vmm(num_pages=3, max_requests=3)
    lone = new_seq(9, 1, 1)
    alloc.allocate(lone)  # range 0, page 0: the group's ranges are 1 and 2
    leader = sequence_for(Request(1, 0.0, 3, 8, n=2))
    alloc.allocate(leader)  # pages 1 and 2, one under each of its ranges
    leader.advance(1, 0.0)
    child = leader.group.members[1]
    child.copy_progress(leader)
    assert alloc.fork(leader, child) == [(8, 16, 3)]  # from the parent's range to the child's
    alloc.free(child)  # preempted: its range waits in the pool, its page is unmapped
    alloc.free(lone)  # range 0 keeps page 0, idle
    leader.advance(1, 0.0)
    alloc.append(leader)  # position 4: the unmapped page
    leader.advance(1, 0.0)
    other = new_seq(8, 4, 1)
    alloc.allocate(other)  # range 0 and its idle page: no page is left
    child.copy_progress(leader)
    with pytest.raises(AssertionError, match="^no page for a fork's copy$"):
        alloc.fork(leader, child)  # 5 computed tokens need 2 pages under the child's range


def test_prefix_defaults_and_hits_through_the_traces_hash_blocks():
    alloc = PrefixCachingAllocator(1000, 4)  # vLLM's default watermark; no swap space
    assert (alloc.watermark_blocks, alloc.num_host_blocks, alloc.hash_block_size) == (2, 0, None)
    hashed = PrefixCachingAllocator(64, 4, watermark=0.0, hash_block_size=8)
    a, b = new_seq(1, 16, 1, block_hashes=(7, 8)), new_seq(2, 17, 1, block_hashes=(7, 8, 9))
    hashed.allocate(a)
    a.advance(1, 0.0)
    hashed.allocate(b)  # b's first 16 tokens hash like a's: 4 blocks found
    assert (table(hashed, b), b.num_cached_tokens) == ([0, 1, 2, 3, 4], 16)


def test_prefix_hits_stop_before_the_block_of_the_last_prompt_token():
    alloc = PrefixCachingAllocator(32, 4, watermark=0.0)
    a = group_seq(1, 8)
    alloc.allocate(a)
    a.advance(1, 0.0)
    b = group_seq(2, 8)  # both blocks cached, but the last token must be computed: one hit
    alloc.allocate(b)
    assert (table(alloc, b), b.num_computed) == ([0, 2], 4)


def test_vmm_without_deferred_reclamation_passes_its_integrity_check():
    alloc = vmm(deferred=False)
    seq = new_seq(1, 6, 1)
    alloc.allocate(seq)
    seq.advance(1, 0.0)
    alloc.free(seq)
    assert (alloc.footprint().idle, alloc.unmaps) == (0.0, 2)
    alloc.check_integrity()


def test_vmm_reclaiming_skips_an_idle_range_taken_meanwhile():
    alloc = vmm(num_pages=3)
    a, b = new_seq(1, 4, 1), new_seq(2, 8, 1)
    for seq in (a, b):
        alloc.allocate(seq)  # range 0: page 0; range 1: pages 1, 2
        seq.advance(1, 0.0)
    alloc.free(a)
    alloc.free(b)  # both idle; nothing unmapped
    c = new_seq(3, 4, 5)
    alloc.allocate(c)  # range 0 holds its one page: reused, but still listed as a victim
    c.advance(1, 0.0)
    alloc.append(c)  # position 4: a page reclaimed from range 1, the only idle range
    assert (alloc.page_table(c), alloc._mapped[1], alloc.unmaps) == ((0, 2), [1], 1)
    alloc.check_integrity()


def test_vmm_admissions_unmap_what_their_ranges_hold_beyond_the_need():
    alloc = vmm(num_pages=5)
    a, b = new_seq(1, 8, 1), new_seq(2, 8, 1)
    for seq in (a, b):
        alloc.allocate(seq)  # ranges 0 and 1, two pages each
        seq.advance(1, 0.0)
    alloc.free(a)
    alloc.free(b)
    for i in (3, 4):
        alloc.allocate(new_seq(i, 1, 1))  # one page each: the second page of each range goes
    assert (alloc.unmaps, list(alloc._unmapped), alloc.maps) == (2, [4, 1, 3], 4)


def test_vmm_geometry_at_the_edges_of_the_budget():
    assert VirtualAllocator(1000, 4, 200, max_len=8, max_requests=1).watermark_pages == 2  # 1 %
    half = VirtualAllocator(8, Fraction(1, 2), 16, max_len=4, max_requests=2)  # half a token a page
    assert (half.range_pages, half.range_slots, half.pages_for(3)) == (8, 4, 6)
    assert VirtualAllocator(8, 1, 8, max_len=4, max_requests=2).range_slots == 4
