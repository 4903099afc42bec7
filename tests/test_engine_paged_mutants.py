"""Exact cases for the paged engines' allocators (paged, prefix caching, vmm), one behaviour each.

Written against mutation testing's survivors (results/mutation/engines-paged/): each test pins a
value a user could see (a block id, a count, a refusal, an order) that the broader tests of
test_allocators.py, test_prefix_cache.py and test_vmm.py leave free, and the integrity checks
are shown to fail on a broken state (a check that cannot fail guards nothing). Real allocators,
tiny sizes, no engine loop: every test runs in milliseconds.
"""

from __future__ import annotations

import pytest

from engines.block_keys import block_keys
from engines.paged import PagedAllocator
from engines.prefix_cache import PrefixCache
from kvbench.requests import Request, group_number
from kvbench.sequence import Sequence

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
    with pytest.raises(AssertionError):
        cache.check_integrity([0, 0, 0])  # block 1 unreferenced but not in the LRU
    with pytest.raises(AssertionError):
        cache.check_integrity([0, 1, 1])  # block 2 referenced but in the LRU
    cache._key_of[1] = 11  # block 1 no longer maps back to key 10
    with pytest.raises(AssertionError):
        cache.check_integrity([0, 1, 0])
    cache._key_of[1] = 10
    cache._key_of[3] = 30  # a block without its key
    with pytest.raises(AssertionError):
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
