"""Swaps between the device arena and host memory move exactly the blocks the scheduler names.

The real runner's swap (kvbench/real/kv_copies.py) stages a run of blocks block-major and moves
each span of consecutive host blocks as one copy; these tests drive it with the real arena and
the real paged allocator, in orders where host blocks are consecutive, scattered and reversed,
and check every slot of every layer, K and V, against where the block must have gone.
"""

from __future__ import annotations

import random

import pytest
import torch

from benchmarks.swap_copies import SwapSpace, main
from engines.batch import Batch
from kvbench.models import MlaShape, ModelSpec, get_model
from kvbench.real.kv_copies import host_spans

DENSE = ModelSpec("tiny", "llama", 3, 32, 4, 2, 64, 128, 64)
MLA = ModelSpec(
    "tiny-mla", "deepseek", 2, 64, 4, 4, 128, 512, 64, norm_eps=1e-6,
    mla=MlaShape(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
)  # fmt: skip


def batch(*swaps: tuple[bool, int, int]) -> Batch:
    """A batch that only swaps: (to_host, source block, target block), in order."""
    return Batch(seqs=(), is_prefill=False, num_tokens=0, num_context=0, swaps=swaps)


def space(spec: ModelSpec, block_size: int, blocks: int, host_blocks: int, device: str = "cpu") -> SwapSpace:
    """A real arena and paged host space, every slot of every layer distinct, so a block landing
    in the wrong place shows."""
    copies = SwapSpace(spec, block_size, blocks, host_blocks, torch.float32, device)
    copies.arena.k.copy_(torch.arange(copies.arena.k.numel(), dtype=torch.float32).view_as(copies.arena.k))
    copies.arena.v.copy_(-torch.arange(copies.arena.v.numel(), dtype=torch.float32).view_as(copies.arena.v))
    return copies


@pytest.mark.parametrize("spec", [DENSE, MLA], ids=["dense", "mla"])
@pytest.mark.parametrize("block_size", [1, 4])
@pytest.mark.parametrize(
    "host_order",
    [[0, 1, 2, 3, 4], [5, 1, 2, 7, 0], [4, 3, 2, 1, 0]],
    ids=["consecutive", "scattered", "reversed"],
)
def test_blocks_swapped_out_and_in_land_where_the_scheduler_says(spec, block_size, host_order):
    copies = space(spec, block_size, blocks=12, host_blocks=8)
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
    copies = space(DENSE, 4, blocks=6, host_blocks=4)
    first, second = copies.block(2), copies.block(5)
    copies._swap(batch((True, 5, 1)))
    # host block 1 now holds device block 5; swap out block 2, then bring block 5's K/V into block 2
    copies._swap(batch((True, 2, 3), (False, 1, 2), (False, 3, 0)))
    assert all(torch.equal(a, b) for a, b in zip(copies.block(2), second, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(copies.block(0), first, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_asynchronous_copies_through_pinned_memory_keep_the_scheduled_order_on_cuda():
    """On a GPU the copies are asynchronous against pinned memory: a swap out, the arena
    overwritten by a kernel, and a swap in, queued back to back with no synchronisation, must
    still bring back every block as it was (the copies and the kernel share one stream)."""
    spec = get_model("opt-125m")
    copies = space(spec, 16, blocks=256, host_blocks=256, device="cuda")
    rng = random.Random(0)
    out, back = rng.sample(range(256), 96), rng.sample(range(256), 96)
    host = rng.sample([b for b in range(256) if not 100 <= b < 130], 66)
    host[10:10] = range(100, 130)  # a long span of consecutive host blocks among scattered ones
    before = [copies.block(b) for b in out]
    copies._swap(batch(*((True, d, h) for d, h in zip(out, host, strict=True))))
    copies.arena.k.fill_(0.5)
    copies.arena.v.fill_(0.5)
    copies._swap(batch(*((False, h, d) for h, d in zip(host, back, strict=True))))
    for kept, b in zip(before, back, strict=True):
        assert all(torch.equal(a, k) for a, k in zip(copies.block(b), kept, strict=True))


def test_host_spans_join_consecutive_host_blocks_in_swap_order_only():
    assert host_spans([4, 5, 6]) == [(0, 4, 3)]
    assert host_spans([4, 5, 9, 10, 2]) == [(0, 4, 2), (2, 9, 2), (4, 2, 1)]
    assert host_spans([6, 5, 4]) == [(0, 6, 1), (1, 5, 1), (2, 4, 1)]  # descending: one copy each
    assert host_spans([]) == []


def test_the_benchmark_times_every_copy_and_prices_it_against_the_bound(tmp_path, capsys):
    rows = main(["--device", "cpu", "--model", "tiny-llama", "--tokens", "32", "--block-sizes", "1,16",
                 "--repeats", "2", "--dtype", "float32", "--out", str(tmp_path / "swap.json")])  # fmt: skip
    # per block size: out and in, consecutive and random host order, and the bound each way
    assert [(r["block_size"], r["copy"], r["host_order"]) for r in rows[:6]] == [
        (1, "swap out", "consecutive"), (1, "swap in", "consecutive"), (1, "swap out", "random"),
        (1, "swap in", "random"), (1, "bound out", "-"), (1, "bound in", "-"),
    ]  # fmt: skip
    assert len(rows) == 12 and all(r["seconds"] > 0 and r["gb_per_s"] > 0 for r in rows)
    assert [r["of_bound"] for r in rows if r["copy"].startswith("bound")] == [1.0] * 4
    assert "of bound" in capsys.readouterr().out and (tmp_path / "swap.json").exists()
