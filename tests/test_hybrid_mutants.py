"""Hybrid allocators (`engines.hybrid`): behaviours a mutation run of engines/hybrid.py found unpinned.

Each test pins, by hand and on the small two-group model of `tests.test_hybrid` (three window
layers of 8 bytes a token, one full layer of 16), one behaviour the other hybrid tests did not
check exactly: the default watermark at admission, batch admission (`can_allocate_all`), the
block-by-block footprint of shared blocks, the growth horizon when a window frees a block next,
the simulator's addressing, a model-less allocator's pages, window freeing with one-token blocks,
the refusals (no swapping, a vLLM layout whose layer straddles pages) and `window_held_from`.
"""

from __future__ import annotations

import pytest

from engines.allocator import BlockTable
from engines.hybrid import HybridAllocator, JengaAllocator
from kvbench.errors import KvbenchError
from kvbench.requests import Request
from kvbench.sequence import Sequence
from tests.test_hybrid import BS, SLOT_BYTES, SMALL

# SMALL under HybridAllocator: pages of 8 x BS = 32 bytes; a window block is 3 pages, a full one 2
PAGES_PER_BLOCK_PAIR = 5


def one_block_sequences(alloc, count: int) -> list[Sequence]:
    """Admit `count` 2-token prompts (one block in each group) and compute them."""
    seqs = [Sequence(Request(i, 0.0, 2, 4)) for i in range(count)]
    for seq in seqs:
        alloc.allocate(seq)
        seq.advance(1, 0.0)
    return seqs


def test_the_default_watermark_keeps_one_percent_of_the_pages_back_at_admission():
    """Without a watermark argument 1% of the pages stay free at admission: 2,400 slots are 3,000
    pages of 32 bytes, 30 kept back, so a prompt of 594 blocks a group (2,970 pages) is admitted
    and one of 595 (2,975) is not, neither alone (`can_ever_hold`) nor now (`can_allocate`)."""
    alloc = HybridAllocator(2400, BS, SMALL)
    assert alloc.pool.num_pages == 3000 and alloc.watermark_pages == 30
    fits, too_big = Request(0, 0.0, 594 * BS, 1), Request(1, 0.0, 594 * BS + 1, 1)
    assert alloc.can_ever_hold(fits) and not alloc.can_ever_hold(too_big)
    assert alloc.can_allocate(Sequence(fits)) and not alloc.can_allocate(Sequence(too_big))


def test_can_allocate_all_asks_for_the_sum_of_every_sequences_blocks_above_the_watermark():
    """Admitting a batch asks for all its sequences' blocks together, 30 pages kept back: 297 + 297
    blocks a group (2,970 pages) fit, 297 + 298 (2,975) do not, though each alone would."""
    alloc = HybridAllocator(2400, BS, SMALL)
    a, b = Sequence(Request(0, 0.0, 297 * BS, 1)), Sequence(Request(1, 0.0, 297 * BS, 1))
    bigger = Sequence(Request(2, 0.0, 298 * BS, 1))
    assert alloc.can_allocate_all([a, b])
    assert alloc.can_allocate(bigger) and not alloc.can_allocate_all([a, bigger])
    alloc.allocate(a)
    assert alloc.num_free_pages == 3000 - 297 * PAGES_PER_BLOCK_PAIR
    assert alloc.can_allocate_all([b]) and not alloc.can_allocate_all([bigger])


def test_an_empty_batch_needs_nothing_even_from_a_full_pool():
    """No sequences ask for no pages: an empty batch is admitted (`can_allocate_all`) and an empty
    step appended (`append_all` returns no copies) when not one page is free."""
    alloc = HybridAllocator(60, BS, SMALL, watermark=0.0)  # 75 pages: 15 block pairs
    one_block_sequences(alloc, 15)
    assert alloc.num_free_pages == 0
    assert alloc.can_allocate_all([]) is True
    assert alloc.append_all([]) == []
    assert not alloc.can_allocate(Sequence(Request(99, 0.0, 1, 1)))


def test_hybrid_allocators_refuse_to_swap():
    """Victims are recomputed, never swapped: both directions say no, and swapping anyway fails
    with a message naming why."""
    for cls in (HybridAllocator, JengaAllocator):
        alloc = cls(60, BS, SMALL, watermark=0.0)
        (seq,) = one_block_sequences(alloc, 1)
        assert alloc.can_swap_out(seq) is False and alloc.can_swap_in(seq) is False
        with pytest.raises(NotImplementedError, match="^hybrid allocators do not swap$"):
            alloc.swap_out(seq)
        with pytest.raises(NotImplementedError, match="^hybrid allocators do not swap$"):
            alloc.swap_in(seq)


def test_addressing_is_the_first_groups_table_with_freed_blocks_as_minus_one():
    """The simulator's view of a sequence is the window group's table (group 0), its freed entry
    -1. Pages are handed out in order, group by group: the window blocks are pages 0, 3, 6 (three
    pages each) and the full ones 9, 11, 13; the step after 9 computed tokens frees block 0."""
    alloc = HybridAllocator(60, BS, SMALL, watermark=0.0)
    seq = Sequence(Request(0, 0.0, 9, 20))
    alloc.allocate(seq)
    assert alloc.addressing(seq) == BlockTable((0, 3, 6), BS)
    seq.advance(1, 0.0)
    alloc.append(seq)
    assert alloc.addressing(seq) == BlockTable((-1, 3, 6), BS)
    assert alloc.memory_tables(seq)[0] == [-1, 3, 6] and alloc.memory_tables(seq)[3] == [9, 11, 13]


def test_one_token_blocks_free_nothing_before_the_window_has_passed_a_token():
    """With blocks of one token, a window of 6 frees block k once k tokens left the window: after
    3 computed tokens nothing (the next query reads from position 0 on), after 7 one block."""
    alloc = HybridAllocator(60, 1, SMALL, watermark=0.0)
    seq = Sequence(Request(0, 0.0, 3, 20))
    alloc.allocate(seq)
    seq.advance(1, 0.0)  # 3 computed, 4 tokens
    alloc.append(seq)
    assert alloc.held_blocks(seq) == [4, 4] and alloc.window_held_from(seq, 0) == 0
    assert alloc.outside_window_slots() == 0
    seq.advance(4, 0.0)  # 7 computed, 8 tokens: the next query (position 7) reads 2..7
    assert alloc.outside_window_slots() == pytest.approx(2 * 24 / SLOT_BYTES)
    alloc.append(seq)
    assert alloc.held_blocks(seq) == [6, 8] and alloc.window_held_from(seq, 0) == 2


def test_growth_horizon_stops_before_the_step_that_frees_a_window_block():
    """Blocks of 8, a window of 6: after 16 computed tokens (17 tokens, 3 blocks, window block 0
    freed) the next block is needed 8 steps on, but the window's block 1 (tokens 8..15) falls out
    at 21 computed tokens, 5 steps on, so a segment runs 5 steps; the window group then holds from
    position 8, the full group from 0."""
    for cls in (HybridAllocator, JengaAllocator):
        alloc = cls(60, 8, SMALL, watermark=0.0)
        seq = Sequence(Request(0, 0.0, 16, 40))
        alloc.allocate(seq)
        seq.advance(1, 0.0)
        alloc.append(seq)
        assert alloc.held_blocks(seq) == [2, 3]
        assert (alloc.window_held_from(seq, 0), alloc.window_held_from(seq, 1)) == (8, 0)
        assert alloc.growth_horizon([seq], 100) == 5
        seq.advance(5, 0.0)
        alloc.append(seq)
        assert alloc.held_blocks(seq) == [1, 3] and alloc.window_held_from(seq, 0) == 16


def test_a_shared_block_counts_once_at_what_its_sharers_will_write_before_any_is_computed():
    """A sample forked before its prompt is computed shares every block: 2 blocks a group hold no
    token yet, but the request (kv_len 9) wants 4 + 4 tokens of each, so target = asked."""
    alloc = HybridAllocator(60, BS, SMALL, watermark=0.0)
    parent = Sequence(Request(0, 0.0, 6, 4, n=2))
    alloc.allocate(parent)
    child = Sequence(Request(0, 0.0, 6, 4, n=2), sample=1)
    child.copy_progress(parent)
    alloc.fork(parent, child)
    fp = alloc.footprint()
    assert fp.tokens == 0
    assert fp.target * SLOT_BYTES == pytest.approx(8 * 24 + 8 * 16)
    assert fp.asked * SLOT_BYTES == pytest.approx(2 * BS * 40)
    assert fp.granted == pytest.approx(fp.asked)
    assert alloc.sharing_saved() == round(2 * BS * 40 / SLOT_BYTES)


def jenga_fork_with_the_parent_one_token_ahead():
    """Jenga, a 9-token prompt of kv_len 11 computed, forked; the parent then computes one more
    token before the next append: all 3 blocks of each group shared, the last one filled 2 tokens
    deep by the parent, 1 by the child."""
    alloc = JengaAllocator(60, BS, SMALL, watermark=0.0)
    parent = Sequence(Request(0, 0.0, 9, 3, n=2))
    alloc.allocate(parent)
    parent.advance(1, 0.0)  # 9 computed, 10 tokens
    child = Sequence(Request(0, 0.0, 9, 3, n=2), sample=1)
    child.copy_progress(parent)
    alloc.fork(parent, child)
    parent.advance(1, 0.0)  # 10 computed, 11 tokens
    return alloc, parent, child


def test_a_shared_block_counts_the_deepest_sharers_tokens_and_the_requests_last_token():
    """Counted block by block, each shared block once: tokens 4 + 4 + 2 a group (the parent's fill
    of the last block, not the child's 1), target 4 + 4 + 3 (kv_len 11 ends inside the last block),
    asked 3 blocks a group; Jenga's window group has 2 pages holding 3 of 4 blocks, so granted
    is asked plus one spare window block (96 bytes): 3 pages of 192 bytes."""
    alloc, _, _ = jenga_fork_with_the_parent_one_token_ahead()
    fp = alloc.footprint()
    assert fp.tokens * SLOT_BYTES == pytest.approx(10 * 24 + 10 * 16)
    assert fp.target * SLOT_BYTES == pytest.approx(11 * 24 + 11 * 16)
    assert fp.asked * SLOT_BYTES == pytest.approx(3 * BS * 40)
    assert fp.granted * SLOT_BYTES == pytest.approx(3 * 192)
    assert alloc.sharing_saved() == round(3 * BS * 40 / SLOT_BYTES)


def test_a_freed_window_entry_does_not_hide_the_blocks_after_it_from_the_footprint():
    """After the parent's append frees its window block 0 (still the child's) and copies the shared
    last block of each group, the blocks after its freed entry still count: the window group holds
    the child's 3 blocks and the parent's copy, the full group the child's 3 and the copy, and the
    parent's 2 tokens of its copy count beside the child's 1 of the original."""
    alloc, parent, child = jenga_fork_with_the_parent_one_token_ahead()
    assert len(alloc.append(parent)) == 2  # the last block of each group copied
    assert alloc.held_blocks(parent) == [2, 3] and alloc.held_blocks(child) == [3, 3]
    fp = alloc.footprint()
    assert fp.asked * SLOT_BYTES == pytest.approx(4 * BS * 40)
    assert fp.tokens * SLOT_BYTES == pytest.approx(11 * 24 + 11 * 16)
    assert fp.target * SLOT_BYTES == pytest.approx(14 * 24 + 14 * 16)
    alloc.check_integrity()


def test_a_model_less_allocator_is_paged_with_one_byte_a_slot():
    """Without KV groups a hybrid allocator is one full group of one byte a token: pages of one
    block, `num_slots // block_size` of them, each block one page's bytes of the pool."""
    alloc = HybridAllocator(100, 16)
    assert (alloc.pool.num_pages, alloc.pool.page_bytes, alloc.slot_bytes) == (6, 16, 1)
    seq = Sequence(Request(0, 0.0, 20, 4))  # 2 blocks
    alloc.allocate(seq)
    assert alloc.addressing(seq) == BlockTable((0, 1), 16)
    assert [alloc.block_bytes(b) for b in (0, 1)] == [[(0, 16)], [(16, 16)]]
    assert alloc.footprint().asked == 32 and alloc.external_frag(None) == 4


def test_a_vllm_layout_whose_full_layer_straddles_pages_is_refused_with_the_way_out():
    """SMALL's full group is one layer of 16 bytes a token, two pages of 8: no real run of it under
    vLLM's layout, and the error says to decode it with Jenga's, which lays it out."""
    with pytest.raises(KvbenchError, match=r"does not split into 2 pages .* decode it with --engine jenga$"):
        HybridAllocator(60, BS, SMALL, watermark=0.0).memory_layout()
    assert len(JengaAllocator(60, BS, SMALL, watermark=0.0).memory_layout()) == 2
