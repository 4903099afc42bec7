"""Swaps between the device arena and host memory move exactly the blocks the scheduler names.

The real runner's swap (kvbench/real/kv_copies.py) stages a run of blocks block-major and moves
each span of consecutive host blocks as one copy; these tests drive it with the real arena and
the real paged allocator, in orders where host blocks are consecutive, scattered and reversed,
and check every slot of every layer, K and V, against where the block must have gone.
"""

from __future__ import annotations

import pytest
import torch

from engines.batch import Batch
from engines.paged import PagedAllocator
from kvbench.modeling.arena import KVArena
from kvbench.models import MlaShape, ModelSpec
from kvbench.real.kv_copies import ArenaCopies, host_spans

CPU = torch.device("cpu")
DENSE = ModelSpec("tiny", "llama", 3, 32, 4, 2, 64, 128, 64)
MLA = ModelSpec(
    "tiny-mla", "deepseek", 2, 64, 4, 4, 128, 512, 64, norm_eps=1e-6,
    mla=MlaShape(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
)  # fmt: skip


def batch(*swaps: tuple[bool, int, int]) -> Batch:
    """A batch that only swaps: (to_host, source block, target block), in order."""
    return Batch(seqs=(), is_prefill=False, num_tokens=0, num_context=0, swaps=swaps)


class Copies(ArenaCopies):
    """The runner's copy methods over a real arena and allocator, without a model."""

    def __init__(self, spec: ModelSpec, block_size: int, blocks: int, host_blocks: int) -> None:
        self.device = CPU
        self.allocator = PagedAllocator(blocks * block_size, block_size, host_blocks=host_blocks)
        self.arena = KVArena(spec, blocks * block_size, torch.float32, CPU)
        # every slot of every layer distinct, so a block landing in the wrong place shows
        self.arena.k.copy_(torch.arange(self.arena.k.numel(), dtype=torch.float32).view_as(self.arena.k))
        self.arena.v.copy_(-torch.arange(self.arena.v.numel(), dtype=torch.float32).view_as(self.arena.v))
        self._host = self._swap_space()

    def block(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One device block's K and V, all layers: `[L, bs, Hkv, D]` each."""
        bs = self.allocator.block_size
        return tuple(kv[:, block * bs : (block + 1) * bs].clone() for kv in (self.arena.k, self.arena.v))


@pytest.mark.parametrize("spec", [DENSE, MLA], ids=["dense", "mla"])
@pytest.mark.parametrize("block_size", [1, 4])
@pytest.mark.parametrize(
    "host_order",
    [[0, 1, 2, 3, 4], [5, 1, 2, 7, 0], [4, 3, 2, 1, 0]],
    ids=["consecutive", "scattered", "reversed"],
)
def test_blocks_swapped_out_and_in_land_where_the_scheduler_says(spec, block_size, host_order):
    copies = Copies(spec, block_size, blocks=12, host_blocks=8)
    device_out = [3, 9, 4, 0, 11]  # device blocks swapped out, in this order, to host_order
    before = {b: copies.block(b) for b in device_out}
    copies._swap(batch(*((True, d, h) for d, h in zip(device_out, host_order, strict=True))))
    # the device blocks are overwritten (as other sequences would), then swapped back in elsewhere
    copies.arena.k.fill_(0.5)
    copies.arena.v.fill_(0.5)
    device_in = [7, 2, 10, 5, 1]
    copies._swap(batch(*((False, h, d) for h, d in zip(host_order, device_in, strict=True))))
    for out, back in zip(device_out, device_in, strict=True):
        for moved, kept in zip(copies.block(back), before[out], strict=True):
            assert torch.equal(moved, kept)
    untouched = set(range(12)) - set(device_in)
    for b in untouched:
        assert all(bool((kv == 0.5).all()) for kv in copies.block(b))


def test_swaps_in_scheduled_order_let_a_freed_block_be_taken_by_the_next_swap():
    """A block swapped out may be the target of a swap-in in the same batch: the order holds."""
    copies = Copies(DENSE, 4, blocks=6, host_blocks=4)
    first, second = copies.block(2), copies.block(5)
    copies._swap(batch((True, 5, 1)))
    # host block 1 now holds device block 5; swap out block 2, then bring block 5's K/V into block 2
    copies._swap(batch((True, 2, 3), (False, 1, 2), (False, 3, 0)))
    assert all(torch.equal(a, b) for a, b in zip(copies.block(2), second, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(copies.block(0), first, strict=True))


def test_host_spans_join_consecutive_host_blocks_in_swap_order_only():
    assert host_spans([4, 5, 6]) == [(0, 4, 3)]
    assert host_spans([4, 5, 9, 10, 2]) == [(0, 4, 2), (2, 9, 2), (4, 2, 1)]
    assert host_spans([6, 5, 4]) == [(0, 6, 1), (1, 5, 1), (2, 4, 1)]  # descending: one copy each
    assert host_spans([]) == []
