"""Every Triton kernel against its PyTorch reference (`kernels/reference.py`).

On CPU the kernels run in Triton's interpreter (small shapes); on a GPU the same tests run
compiled (marked `gpu`). Each check draws fresh random inputs, poisons the output and every
arena slot no sequence owns with NaN, and compares with a stated bound:

- bf16: max abs error <= 2e-2, fp16: <= 4e-3 (outputs of softmax-weighted sums of values in
  [-1, 1]; both the kernel and the reference accumulate in fp32, the difference is one final
  rounding plus the order of summation and P's rounding to 16 bits);
- fp32 (the runner's CPU dtype): <= 1e-5.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from kernels import decode_attention as decode_module  # noqa: E402
from kernels.decode_attention import decode_attention  # noqa: E402
from kernels.extend_attention import extend_attention  # noqa: E402
from kernels.kv_store import store_kv  # noqa: E402
from kernels.reference import decode_attention_ref, extend_attention_ref, store_kv_ref  # noqa: E402
from kernels.splits import (  # noqa: E402
    LARGE_GRID_LAUNCH,
    SMALL_GRID_LAUNCH,
    DecodeWorkspace,
    choose_launch,
    choose_num_splits,
    grid_launch,
    split_count,
)
from tests.support import INTERPRETED  # noqa: E402

ALL_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5}
DEVICES = [
    pytest.param(torch.device("cpu"), id="cpu", marks=INTERPRETED),
    pytest.param(
        torch.device("cuda"),
        id="cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")],
    ),
]


class Arena:
    """A NaN-poisoned arena `[S, Hkv, D]` holding random K/V only where sequences live.

    Paged: each sequence's blocks are drawn at random from the whole arena (random page order,
    with free blocks in between). Contiguous: extents back to back with a poisoned gap.
    """

    def __init__(self, lens, kv_heads, head_dim, dtype, device, *, block_size=0, gen=None):
        self.lens = torch.tensor(lens, dtype=torch.int32, device=device)
        self.block_size = block_size
        widths = [max(n, 1) for n in lens]
        if block_size:
            need = [-(-w // block_size) for w in widths]
            total = 2 * sum(need) + 1  # half the blocks stay free (poisoned)
            order = torch.randperm(total, generator=gen)
            tables, at = [], 0
            for n in need:
                tables.append(order[at : at + n].tolist() + [0] * (max(need) - n))
                at += n
            self.tables = torch.tensor(tables, dtype=torch.int32, device=device)  # [B, max_blocks]
            self.starts = None
            slots = total * block_size
        else:
            starts, at = [], 3
            for w in widths:
                starts.append(at)
                at += w + 2  # a poisoned gap after each extent
            self.tables, self.starts = None, torch.tensor(starts, dtype=torch.int64, device=device)
            slots = at
        shape = (slots, kv_heads, head_dim)
        self.k = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.v = torch.full(shape, float("nan"), dtype=dtype, device=device)
        for b, n in enumerate(lens):
            where = self.slots(b, torch.arange(n, device=device))
            self.k[where] = (
                torch.rand((n, kv_heads, head_dim), generator=gen).mul(2).sub(1).to(dtype).to(device)
            )
            self.v[where] = (
                torch.rand((n, kv_heads, head_dim), generator=gen).mul(2).sub(1).to(dtype).to(device)
            )

    def slots(self, b: int, positions: torch.Tensor) -> torch.Tensor:
        if self.tables is not None:
            bs = self.block_size
            return self.tables[b].long()[positions // bs] * bs + positions % bs
        return self.starts[b] + positions

    def addressing(self) -> dict:
        return {"block_tables": self.tables, "block_size": self.block_size, "starts": self.starts}


def skip_interpreted_bf16(dtype: torch.dtype, device: torch.device) -> None:
    """Triton 3.6's interpreter computes `tl.dot` on bf16 tiles wrongly (NumPy has no bf16):
    on CPU, bf16 attention is checked through fp16 and fp32; the GPU runs the bf16 cases."""
    if dtype == torch.bfloat16 and device.type == "cpu":
        pytest.skip("Triton's CPU interpreter cannot run tl.dot on bf16; checked on the GPU")


def _rand(shape, dtype, device, gen):
    return torch.rand(shape, generator=gen).mul(2).sub(1).to(dtype).to(device)


CASES = [  # (context lengths, block size; 0 = contiguous, GQA ratio, head dim)
    ([1, 17, 64, 100], 16, 4, 64),
    ([1, 3, 130], 1, 1, 32),
    ([5, 300, 257], 256, 8, 16),
    ([1, 17, 64, 100], 0, 4, 64),
    ([33, 2, 129], 0, 8, 16),
]


def poisoned_workspace(batch, heads, kv_heads, head_dim, max_splits, device) -> DecodeWorkspace:
    """A workspace with NaN partials (a read of a slot no split wrote shows) and zeroed tickets."""
    workspace = DecodeWorkspace.allocate(batch, heads, kv_heads, head_dim, max_splits, device)
    workspace.part.fill_(float("nan"))
    workspace.lse.fill_(float("nan"))
    return workspace


# (splits, merge, own workspace, launch): one split (nothing to merge), the merge kernel with
# per-call scratch (the callers' default) and in a workspace with room for more splits than it
# uses, and the fused merge in the workspace and with per-call scratch; both launches (tiles of
# 64 and 128 positions: block sizes below, inside and above a tile)
SMALL, LARGE = SMALL_GRID_LAUNCH, LARGE_GRID_LAUNCH
DECODE_RUNS = [(1, "kernel", True, SMALL), (3, "kernel", False, LARGE), (3, "kernel", True, SMALL),
               (3, "fused", True, LARGE), (4, "fused", True, SMALL), (2, "fused", False, LARGE)]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("lens", "block_size", "group", "head_dim"), CASES)
def test_decode_attention_matches_reference(device, dtype, lens, block_size, group, head_dim):
    """Every split count and merge against the reference; the fused merge leaves its tickets at 0.

    Contexts of 1 and uneven fills leave some splits empty, which a merge must weigh as nothing.
    """
    skip_interpreted_bf16(dtype, device)
    gen = torch.Generator().manual_seed(len(lens) * 1000 + block_size + group)
    kv_heads = 2
    arena = Arena(lens, kv_heads, head_dim, dtype, device, block_size=block_size, gen=gen)
    q = _rand((len(lens), kv_heads * group, head_dim), dtype, device, gen)
    expected = decode_attention_ref(
        q, arena.k, arena.v, arena.lens, scale=head_dim**-0.5, **arena.addressing()
    )
    workspace = poisoned_workspace(len(lens) + 1, kv_heads * group, kv_heads, head_dim, 4, device)
    for num_splits, merge, shared, launch in DECODE_RUNS:
        out = torch.full_like(q, float("nan"))
        decode_attention(
            q, arena.k, arena.v, arena.lens, scale=head_dim**-0.5, num_splits=num_splits, out=out,
            merge=merge, workspace=workspace if shared else None, launch=launch, **arena.addressing(),
        )  # fmt: skip
        run = (num_splits, merge, launch)
        assert not out.isnan().any(), run
        assert (out.float() - expected.float()).abs().max() <= TOLERANCE[dtype], run
        assert not workspace.tickets.any(), run


@pytest.mark.parametrize("device", DEVICES)
def test_fused_merge_reuses_one_workspace_across_batches_and_split_counts(device):
    """One workspace, zeroed once, serves launches of any batch and split count, again and again.

    On the GPU the splits of a sequence run concurrently, so which one merges varies from call
    to call; contexts there are long enough that every one of 16 splits has work.
    """
    dtype = torch.float16
    gen = torch.Generator().manual_seed(21)
    kv_heads, group, head_dim = 2, 4, 32
    long = device.type == "cuda"
    lens = [1, 2000, 777, 1500, 64] if long else [1, 40, 17, 33, 8]
    arena = Arena(lens, kv_heads, head_dim, dtype, device, block_size=16, gen=gen)
    q = _rand((len(lens), kv_heads * group, head_dim), dtype, device, gen)
    scale = head_dim**-0.5
    workspace = poisoned_workspace(len(lens), kv_heads * group, kv_heads, head_dim, 16, device)
    calls = [(5, 16), (3, 2), (5, 5), (2, 16), (5, 3)] * (20 if long else 1)  # (batch, splits)
    for batch, num_splits in calls:
        rows = slice(0, batch)
        where = dict(block_tables=arena.tables[rows], block_size=16)
        expected = decode_attention_ref(q[rows], arena.k, arena.v, arena.lens[rows], scale=scale, **where)
        out = torch.full_like(q[rows], float("nan"))
        decode_attention(
            q[rows], arena.k, arena.v, arena.lens[rows], scale=scale, num_splits=num_splits, out=out,
            merge="fused", workspace=workspace, **where,
        )  # fmt: skip
        assert (out.float() - expected.float()).abs().max() <= TOLERANCE[dtype], (batch, num_splits)
        assert not workspace.tickets.any(), (batch, num_splits)


@INTERPRETED
def test_one_split_and_the_fused_merge_launch_no_merge_kernel(monkeypatch):
    """A single split writes the output itself, and the fused merge needs no second launch."""
    gen = torch.Generator().manual_seed(4)
    arena = Arena([9, 30], 1, 16, torch.float32, torch.device("cpu"), block_size=4, gen=gen)
    q = _rand((2, 2, 16), torch.float32, "cpu", gen)
    expected = decode_attention_ref(q, arena.k, arena.v, arena.lens, scale=0.25, **arena.addressing())
    merges = []
    monkeypatch.setattr(decode_module, "launch_merge_kernel", lambda *args: merges.append(args))
    for num_splits, merge in ((1, "kernel"), (1, "fused"), (3, "fused")):
        out = decode_attention(
            q, arena.k, arena.v, arena.lens, scale=0.25, num_splits=num_splits, merge=merge,
            **arena.addressing(),
        )  # fmt: skip
        assert (out - expected).abs().max() <= TOLERANCE[torch.float32]
    assert merges == []
    decode_attention(q, arena.k, arena.v, arena.lens, scale=0.25, num_splits=3, **arena.addressing())
    assert len(merges) == 1  # the default merges in a kernel of its own


def test_decode_attention_rejects_a_workspace_too_small_and_an_unknown_merge():
    gen = torch.Generator().manual_seed(2)
    arena = Arena([5, 6, 7], 2, 16, torch.float32, torch.device("cpu"), block_size=4, gen=gen)
    q = _rand((3, 4, 16), torch.float32, "cpu", gen)
    kwargs = dict(scale=0.25, num_splits=2, **arena.addressing())
    too_small = [
        DecodeWorkspace.allocate(2, 4, 2, 16, 2, "cpu"),  # rows for 2 sequences, not 3
        DecodeWorkspace.allocate(3, 4, 2, 16, 1, "cpu"),  # room for one split
        DecodeWorkspace.allocate(3, 8, 4, 16, 2, "cpu"),  # another head layout
        DecodeWorkspace.allocate(3, 4, 2, 16, 2, "cpu", tickets=False),  # no tickets, for the fused merge
    ]
    for workspace in too_small:
        with pytest.raises(ValueError, match="decode workspace"):
            decode_attention(q, arena.k, arena.v, arena.lens, merge="fused", workspace=workspace, **kwargs)
    with pytest.raises(ValueError, match="merge must be one of"):
        decode_attention(q, arena.k, arena.v, arena.lens, merge="atomic", **kwargs)


def test_split_rule_fills_a_small_grid_to_four_programs_per_sm_and_leaves_a_large_one():
    """The H200-tuned rule on 132 SMs (8 KV heads): the 64K band at 512 programs, none shorter
    than 128 tokens, none beyond 16 splits, no split once batch x KV heads passes 528."""
    band = {(8, 8192): 8, (16, 4096): 4, (32, 2048): 2, (64, 1024): 1}
    others = {(8, 1024): 8, (1, 100): 1, (1, 300): 2, (1, 1 << 20): 16, (66, 4096): 1, (256, 2048): 1}
    for (batch, context), splits in {**band, **others}.items():
        assert split_count(batch * 8, context, 132) == splits, (batch, context)
    assert {batch * 8 * n for (batch, _), n in band.items()} == {512}
    assert grid_launch(512, 132) == grid_launch(528, 132) == SMALL_GRID_LAUNCH  # the band, filled
    assert grid_launch(529, 132) == grid_launch(2048, 132) == LARGE_GRID_LAUNCH  # batch alone fills it
    cpu = torch.device("cpu")
    assert choose_num_splits(2, 8, 1000, cpu) == 4 and choose_num_splits(2, 8, 200, cpu) == 1
    assert choose_launch(1 << 20, cpu) == SMALL_GRID_LAUNCH  # the interpreter: small tiles always


@INTERPRETED
def test_decode_attention_empty_context_gives_zeros():
    """A padding row (context 0) reads nothing and yields zeros, in both modes."""
    gen = torch.Generator().manual_seed(1)
    arena = Arena([0, 9], 1, 16, torch.float32, torch.device("cpu"), block_size=4, gen=gen)
    q = _rand((2, 2, 16), torch.float32, "cpu", gen)
    ref = decode_attention_ref(q, arena.k, arena.v, arena.lens, scale=0.25, **arena.addressing())
    for merge in ("kernel", "fused"):
        out = decode_attention(
            q, arena.k, arena.v, arena.lens, scale=0.25, num_splits=2, merge=merge, **arena.addressing()
        )
        assert out[0].abs().max() == 0
        assert (out - ref).abs().max() <= TOLERANCE[torch.float32]


@INTERPRETED
def test_merge_variants_benchmark_runs_all_but_the_cuda_timer(monkeypatch, capsys):
    """benchmarks/merge_variants.py, whose timing needs a GPU: its options, and a tiny cell through
    the interpreter with the host timer (every variant checked, the tickets left at zero)."""
    from kernels.bandwidth import time_host

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "merge_variants.py"
    spec = importlib.util.spec_from_file_location("merge_variants", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)
    spec.loader.exec_module(bench)
    tiny = ["--cells", "3x40", "--splits", "auto,3", "--kv-heads", "2", "--gqa", "2", "--head-dim", "16",
            "--block-size", "4", "--dtype", "float16", "--repeats", "2", "--warmup", "0"]  # fmt: skip
    args = bench.parse_args(tiny)
    assert (args.cells, args.splits) == ([(3, 40)], ["auto", 3])
    rows = bench.measure_cell(3, 40, args, torch.device("cpu"), 1e9, time_host)
    assert [(r["splits"], r["merge"], r["heuristic"]) for r in rows] == [
        (1, "none", True), (3, "kernel", False), (3, "fused", False)
    ]  # fmt: skip
    assert all(bench.row_ok(r, 5e-3) and r["samples"] == 2 for r in rows)
    assert [r["fused_vs_kernel_max_diff"] is not None for r in rows] == [False, False, True]
    assert not bench.row_ok(dict(rows[2], fused_vs_kernel_max_diff=float("nan")), 5e-3)
    assert "B3 L40" in bench.format_table(rows) and bench.summarize(rows)[0]["heuristic_splits"] == 1
    with pytest.raises(SystemExit):
        bench.parse_args(["--cells", "8y8"])
    if not torch.cuda.is_available():
        capsys.readouterr()
        assert bench.main(tiny) == 1
        assert capsys.readouterr().err.count("\n") == 1  # one line: needs a CUDA device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"]
)
@pytest.mark.parametrize("block_size", [0, 1, 16], ids=["contiguous", "bs1", "bs16"])
def test_extend_attention_matches_reference(device, dtype, block_size):
    """Fresh prompts (prefix 0), extensions of a stored prefix, and single new tokens."""
    skip_interpreted_bf16(dtype, device)
    gen = torch.Generator().manual_seed(7 + block_size)
    lens, new = [40, 1, 70, 33], [40, 1, 5, 1]  # context after the step, tokens new in it
    kv_heads, group, head_dim = 2, 4, 32
    arena = Arena(lens, kv_heads, head_dim, dtype, device, block_size=block_size, gen=gen)
    q = _rand((sum(new), kv_heads * group, head_dim), dtype, device, gen)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], device=device)
    kwargs = dict(scale=head_dim**-0.5, **arena.addressing())
    expected = extend_attention_ref(q, arena.k, arena.v, cu, arena.lens, **kwargs)
    out = torch.full_like(q, float("nan"))
    extend_attention(q, arena.k, arena.v, cu, arena.lens, max_new=max(new), out=out, **kwargs)
    assert not out.isnan().any()
    assert (out.float() - expected.float()).abs().max() <= TOLERANCE[dtype]


@INTERPRETED
def test_extend_attention_without_prefix_is_causal_self_attention():
    """With no stored prefix the reference is plain causal attention over the new tokens."""
    gen = torch.Generator().manual_seed(3)
    n, heads, head_dim = 21, 2, 16
    arena = Arena([n], heads, head_dim, torch.float32, torch.device("cpu"), block_size=4, gen=gen)
    q = _rand((n, heads, head_dim), torch.float32, "cpu", gen)
    cu = torch.tensor([0, n])
    out = extend_attention(q, arena.k, arena.v, cu, arena.lens, scale=0.25, max_new=n, **arena.addressing())
    keys = arena.k[arena.slots(0, torch.arange(n))]  # [n, H, D]
    values = arena.v[arena.slots(0, torch.arange(n))]
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), is_causal=True, scale=0.25
    ).transpose(0, 1)  # [n, H, D]
    assert (out - sdpa).abs().max() <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_store_kv_writes_only_mapped_slots(device, dtype):
    gen = torch.Generator().manual_seed(5)
    slots, kv_heads, head_dim = 40, 3, 24  # non-power-of-two heads and dim: masked tiles
    slot_mapping = torch.tensor([7, -1, 0, 39, 12, -1], device=device)
    k = _rand((6, kv_heads, head_dim), dtype, device, gen)
    v = _rand((6, kv_heads, head_dim), dtype, device, gen)
    caches = [
        torch.full((slots, kv_heads, head_dim), float("nan"), dtype=dtype, device=device) for _ in range(4)
    ]
    store_kv(k, v, caches[0], caches[1], slot_mapping)
    store_kv_ref(k, v, caches[2], caches[3], slot_mapping)
    for kernel, ref in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(kernel.isnan(), ref.isnan())  # untouched slots still poisoned
        written = ~ref.isnan()
        assert torch.equal(kernel[written], ref[written])  # a copy: bit-exact
    assert caches[0].isnan().all(dim=(1, 2)).sum() == slots - 4


# ---------------------------------------------------------------- fused elementwise kernels
FUSED_TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5}  # one rounding


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=["bf16", "fp16", "fp32"])
def test_fused_kernels_match_reference(device, dtype):
    """RMSNorm (hidden 48: a masked tile), rotary (5 heads, dim 16) and SiLU-and-multiply."""
    from kernels.fused import rms_norm, rotary_, silu_mul
    from kernels.reference import rms_norm_ref, rotary_ref, silu_mul_ref
    from kvbench.modeling.ops import inv_freq

    gen = torch.Generator().manual_seed(11)
    x = _rand((7, 48), dtype, device, gen) * 3
    weight = _rand((48,), dtype, device, gen)
    bound = FUSED_TOLERANCE[dtype]
    normed = rms_norm(x, weight, 1e-5).float()
    assert (normed - rms_norm_ref(x, weight, 1e-5).float()).abs().max() <= bound * 3

    heads = _rand((7, 5, 16), dtype, device, gen)
    positions = torch.tensor([0, 1, 5, 100, 1000, 4095, 3], device=device)
    freqs = inv_freq(16, 10000.0, device)
    expected = rotary_ref(heads, positions, freqs)
    rotated = rotary_(heads.clone(), positions, freqs)
    assert (rotated.float() - expected.float()).abs().max() <= bound * 2

    gate, up = _rand((3, 1500), dtype, device, gen) * 4, _rand((3, 1500), dtype, device, gen)
    assert (silu_mul(gate, up).float() - silu_mul_ref(gate, up).float()).abs().max() <= bound * 4


@pytest.mark.parametrize("kv_heads", [1, 8, 40])
def test_the_mixed_step_warm_up_covers_every_launch_the_split_rule_picks(kv_heads):
    """Every (split count, launch) a mixed step's decode rows can get on a 132-SM GPU, for any
    number of rows and context, is one the warm-up's launches compile: none compiles mid-run."""
    from kernels.splits import grid_launch, mixed_step_launches, split_count

    sms = 132
    warmed = {(s, grid_launch(rows * kv_heads * s, sms)) for rows, s in mixed_step_launches(kv_heads, sms)}
    for rows in range(1, 600):
        for context in (1, 100, 128, 255, 256, 1000, 2048, 4096, 131072):
            s = split_count(rows * kv_heads, context, sms)
            assert (s, grid_launch(rows * kv_heads * s, sms)) in warmed, (rows, context)
