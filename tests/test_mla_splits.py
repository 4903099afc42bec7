"""The MLA kernel's own split rule (`choose_mla_splits`: up to 128 splits, so a small batch fills
the GPU) and the kernel and both merges at split counts above the K/V kernels' 16.

On CPU the kernel runs in Triton's interpreter on tiny shapes (4 and 18 heads, latent 32 +
rope 16, 16-position tiles so that 64 splits of a 1,024-token context each get a tile); the arena
and the workspace are poisoned with NaN, so a read of a slot no sequence or split wrote shows.
Bounds as in `tests/test_kernels.py`.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from kernels.mla_decode import mla_decode_attention  # noqa: E402
from kernels.reference import mla_decode_attention_ref  # noqa: E402
from kernels.split_merge import launch_merge_kernel  # noqa: E402
from kernels.splits import (  # noqa: E402
    MAX_SPLITS,
    MIN_SPLIT_TOKENS,
    MLA_MAX_SPLITS,
    PROGRAMS_PER_SM,
    choose_mla_splits,
    choose_num_splits,
    head_groups,
    split_count,
)
from tests.test_kernels import DEVICES, TOLERANCE, Arena, _rand, poisoned_workspace, skip_interpreted_bf16  # noqa: E402

H200_SMS = 132
LATENT, ROPE = 32, 16
TILE = (16, 4, 2)  # 16 positions a tile: every one of 64 splits of 1,024 tokens reads one


def mla_splits(batch: int, heads: int, context: int) -> int:
    """`choose_mla_splits` on the H200's 132 SMs."""
    return split_count(batch * head_groups(heads), context, H200_SMS, MLA_MAX_SPLITS)


def test_mla_rule_fills_the_h200_at_small_batches_and_leaves_large_ones_as_they_were():
    """V2-Lite (16 heads, one program per sequence and split): a batch of 8 gets 64 splits (512
    programs, where the K/V cap of 16 left 128 on 132 SMs); from 33 sequences on no more than 16
    fit, and the count is the K/V rule's."""
    expected = {
        (8, 8192): 64, (8, 32768): 64,  # the measured cells of results/reference/kernels-window-mla
        (64, 8192): 8, (64, 32768): 8,
        (1, 32768): 128, (2, 32768): 128, (4, 32768): 128, (16, 32768): 32, (32, 32768): 16,
        (1, 1 << 20): 128,  # the cap
        (8, 4096): 32, (8, 1000): 4, (8, 100): 1,  # none under 128 tokens
        (40, 8192): 8, (66, 8192): 8, (67, 8192): 4, (528, 8192): 1, (600, 8192): 1,
    }  # fmt: skip
    for (batch, context), splits in expected.items():
        assert mla_splits(batch, 16, context) == splits, (batch, context)
        assert splits == 1 or context // splits >= MIN_SPLIT_TOKENS
    for batch in range(1, 600):
        for context in (100, 1000, 8192, 1 << 20):
            mla, kv = mla_splits(batch, 16, context), split_count(batch, context, H200_SMS)
            assert mla & (mla - 1) == 0 and batch * mla <= max(batch, PROGRAMS_PER_SM * H200_SMS)
            assert mla == kv if batch > 32 or kv < MAX_SPLITS else mla >= kv, (batch, context)
    for batch in (4, 8, 16, 32, 64):  # the GPU filled to the K/V kernel's 512 programs
        assert batch * mla_splits(batch, 16, 32768) == 512
    assert split_count(8, 32768, H200_SMS) == MAX_SPLITS == 16  # the K/V rule keeps its cap
    # DeepSeek-V2's 128 heads: 8 head groups a sequence, so fewer splits fill the GPU
    assert head_groups(128) == 8 and mla_splits(8, 128, 32768) == 8 and mla_splits(1, 128, 32768) == 64


def test_cpu_rule_is_the_k_v_kernels_few_splits():
    """The interpreter keeps up to 4 splits, as for the K/V kernels (tests pass larger counts)."""
    cpu = torch.device("cpu")
    for heads, context in ((16, 1000), (16, 200), (18, 1 << 20), (4, 90)):
        assert choose_mla_splits(2, heads, context, cpu) == choose_num_splits(
            2, head_groups(heads), context, cpu
        )
    assert choose_mla_splits(2, 16, 1000, cpu) == 4 and choose_mla_splits(2, 16, 200, cpu) == 1


# (splits, merge): more splits than one merge step unrolls (16), a count that is no multiple of
# it (the last step masked), and the cap, with the merge kernel and the fused merge (the merge
# kernel's masked last step alone: test_merge_kernel_weighs_every_split_of_a_wide_row's 40)
RUNS = [(64, "fused"), (40, "fused"), (128, "kernel")]
CASES = [  # (context lengths, block size; 0 = contiguous, query heads)
    ([1024, 0, 300, 1000], 16, 4),  # 64 splits: all read, 19 read, none read, the last ones partly
    ([2048, 17], 0, 18),  # contiguous; two head groups, the second of 2 heads (masked rows)
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("lens", "block_size", "heads"), CASES)
def test_mla_decode_with_many_splits_matches_reference(device, dtype, lens, block_size, heads):
    """Up to 128 splits, empty ones included, in a NaN-poisoned workspace with room for the cap:
    each merge reads exactly the splits of its launch, and the fused one leaves its tickets at 0."""
    skip_interpreted_bf16(dtype, device)
    gen = torch.Generator().manual_seed(sum(lens) + heads)
    arena = Arena(lens, 1, LATENT + ROPE, dtype, device, block_size=block_size, gen=gen)  # k: [S, 1, 48]
    q = _rand((len(lens), heads, LATENT + ROPE), dtype, device, gen)
    scale = (LATENT + ROPE) ** -0.5
    where = arena.addressing()
    expected = mla_decode_attention_ref(q, arena.k, arena.lens, scale=scale, latent=LATENT, **where)
    workspace = poisoned_workspace(len(lens), heads, head_groups(heads), LATENT, MLA_MAX_SPLITS, device)
    # interpreted, the contiguous case leaves 64 fused splits to the paged case (a third of its time)
    runs = RUNS[1:] if block_size == 0 and torch.device(device).type == "cpu" else RUNS
    for num_splits, merge in runs:
        out = torch.full((len(lens), heads, LATENT), float("nan"), dtype=dtype, device=device)
        mla_decode_attention(
            q, arena.k, arena.lens, scale=scale, latent=LATENT, num_splits=num_splits, out=out, merge=merge,
            workspace=workspace, launch=TILE, **where,
        )  # fmt: skip
        run = (num_splits, merge)
        assert not out.isnan().any(), run
        assert (out.float() - expected.float()).abs().max() <= TOLERANCE[dtype], run
        assert not workspace.tickets.any(), run
        for b, n in enumerate(lens):
            if n == 0:
                assert not out[b].any(), run


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("splits", "head_dim"), [(40, 300), (128, 512), (3, 16)])  # steps, column blocks
def test_merge_kernel_weighs_every_split_of_a_wide_row(device, splits, head_dim):
    """The merge kernel alone on partials wider than one program's columns (MLA's latent of 512)
    and more splits than one step holds: the log-sum-exp-weighted mean of the partials, empty
    splits (-inf) weighing nothing, a row with none but empty ones giving zeros, and the slots
    past the launch's splits (NaN) never read."""
    gen = torch.Generator().manual_seed(splits + head_dim)
    batch, heads, room = 3, 2, splits + 5
    part = torch.full((batch, heads, room, head_dim), float("nan"))
    lse = torch.full((batch, heads, room), float("nan"))
    part[:, :, :splits] = torch.rand((batch, heads, splits, head_dim), generator=gen) * 2 - 1
    lse[:, :, :splits] = torch.rand((batch, heads, splits), generator=gen) * 8 - 4
    lse[0, 0, ::3] = float("-inf")  # empty splits: their partials are zeros
    part[0, 0, ::3] = 0.0
    lse[1, 1, :splits] = float("-inf")  # an empty context
    part[1, 1, :splits] = 0.0
    weights = torch.exp(lse[:, :, :splits] - lse[:, :, :splits].amax(-1, keepdim=True))  # [B, H, S]
    weights = torch.nan_to_num(weights, nan=0.0)  # the empty context's row: -inf - -inf
    norm = weights.sum(-1, keepdim=True)
    expected = (part[:, :, :splits] * weights[..., None]).sum(2) / torch.where(norm > 0, norm, 1.0)
    part, lse = part.to(device), lse.to(device)
    out = torch.full((batch, heads, head_dim), float("nan"), device=device)
    launch_merge_kernel(part, lse, out, splits)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert not out[1, 1].any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_the_decode_loop_splits_an_mla_model_by_the_mla_rule():
    """A real decode loop (whose graphs freeze the split count per bucket) takes the MLA rule for an
    MLA model: on an H200, 64 splits at a batch of 8 and 8,192 tokens, not the K/V rule's 16."""
    from kvbench.modeling.arena import KVArena
    from kvbench.modeling.weights import random_model
    from kvbench.real.decode_loop import DecodeLoop
    from tests.test_families_mla import MLA_TINY

    cuda = torch.device("cuda")
    model = random_model(MLA_TINY, torch.bfloat16, cuda, seed=0)
    arena = KVArena(MLA_TINY, 8 * 8192, torch.bfloat16, cuda)
    loop = DecodeLoop(model, arena, max_batch=8, max_len=8192, block_size=16, paged=True, backend="triton",
                      temperature=0.0, seed=0)  # fmt: skip
    assert loop._splits[8] == choose_mla_splits(8, MLA_TINY.num_heads, 8192, cuda)
    assert loop._splits[8] > choose_num_splits(8, 1, 8192, cuda)
