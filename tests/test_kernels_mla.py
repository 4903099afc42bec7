"""The MLA decode kernel (`kernels/mla_decode.py`) against its PyTorch reference, the tiny
DeepSeek model decoding the same greedy tokens through it as through PyTorch, and `kvbench
kernels --mla`'s wiring.

On CPU the kernel runs in Triton's interpreter on tiny shapes (4 and 18 heads, latent 32 +
rope 16); the arena is poisoned with NaN wherever no sequence lives, so a read outside a
sequence's blocks shows. Bounds as in `tests/test_kernels.py`: max abs error of outputs that are
softmax-weighted sums of values in [-1, 1], 4e-3 in fp16, 1e-5 in fp32 (bf16 runs on the GPU).
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from kernels.mla_decode import head_groups, mla_decode_attention  # noqa: E402
from kernels.reference import mla_decode_attention_ref  # noqa: E402
from kernels.splits import LARGE_GRID_LAUNCH, SMALL_GRID_LAUNCH  # noqa: E402
from tests.support import INTERPRETED  # noqa: E402
from tests.test_kernels import DEVICES, TOLERANCE, Arena, _rand, poisoned_workspace, skip_interpreted_bf16  # noqa: E402

LATENT, ROPE = 32, 16
CASES = [  # (context lengths, block size; 0 = contiguous, query heads)
    ([0, 1, 17, 100], 16, 4),  # an empty context, one inside a block, several blocks
    ([3, 70, 33], 32, 18),  # two head groups, the second of 2 heads (masked rows)
    ([40, 97], 128, 4),  # blocks larger than a tile
    ([1, 64, 90, 0], 0, 4),  # contiguous extents
]
# (splits, merge, shared workspace, launch): one split, the merge kernel, the fused merge; tiles
# of 64 and 128 positions (inside, equal to and larger than a block)
RUNS = [(1, "kernel", False, SMALL_GRID_LAUNCH), (3, "kernel", True, LARGE_GRID_LAUNCH),
        (2, "fused", True, SMALL_GRID_LAUNCH)]  # fmt: skip


DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize(("lens", "block_size", "heads"), CASES)
def test_mla_decode_matches_reference(device, dtype, lens, block_size, heads):
    """Ragged contexts (0 included), paged in random page order or contiguous, every merge."""
    skip_interpreted_bf16(dtype, device)
    gen = torch.Generator().manual_seed(sum(lens) + block_size + heads)
    arena = Arena(lens, 1, LATENT + ROPE, dtype, device, block_size=block_size, gen=gen)  # k: [S, 1, 48]
    q = _rand((len(lens), heads, LATENT + ROPE), dtype, device, gen)
    scale = (LATENT + ROPE) ** -0.5
    where = arena.addressing()
    expected = mla_decode_attention_ref(q, arena.k, arena.lens, scale=scale, latent=LATENT, **where)
    assert expected.shape == (len(lens), heads, LATENT)
    workspace = poisoned_workspace(len(lens), heads, head_groups(heads), LATENT, 4, device)
    for num_splits, merge, shared, launch in RUNS:
        out = torch.full((len(lens), heads, LATENT), float("nan"), dtype=dtype, device=device)
        mla_decode_attention(
            q, arena.k, arena.lens, scale=scale, latent=LATENT, num_splits=num_splits, out=out, merge=merge,
            workspace=workspace if shared else None, launch=launch, **arena.addressing(),
        )  # fmt: skip
        run = (num_splits, merge, launch)
        assert not out.isnan().any(), run
        assert (out.float() - expected.float()).abs().max() <= TOLERANCE[dtype], run
        assert not workspace.tickets.any(), run
        for b, n in enumerate(lens):
            if n == 0:
                assert not out[b].any(), run  # an empty context gives zeros


def test_the_reference_is_the_per_head_attention_it_replaces():
    """MLA decode is multi-query attention over the one cached vector whose values are its latent
    part: the reference equals `decode_attention_ref` with that vector as the one KV head."""
    from kernels.reference import decode_attention_ref

    gen = torch.Generator().manual_seed(7)
    arena = Arena([5, 0, 40], 1, LATENT + ROPE, torch.float32, torch.device("cpu"), block_size=8, gen=gen)
    q = _rand((3, 4, LATENT + ROPE), torch.float32, torch.device("cpu"), gen)
    values = arena.k.clone()
    values[..., LATENT:] = 0.0  # the rope part is not a value
    full = decode_attention_ref(q, arena.k, values, arena.lens, scale=0.2, **arena.addressing())
    mla = mla_decode_attention_ref(q, arena.k, arena.lens, scale=0.2, latent=LATENT, **arena.addressing())
    torch.testing.assert_close(mla, full[..., :LATENT], atol=1e-6, rtol=1e-6)


@INTERPRETED
def test_bad_arguments_raise_one_line():
    q = torch.zeros(2, 4, LATENT + ROPE)
    cache = torch.zeros(16, 1, LATENT + ROPE)
    lens = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="latent must be in 1..48"):
        mla_decode_attention(q, cache, lens, scale=1.0, latent=49, starts=lens)
    with pytest.raises(ValueError, match=r"MLA cache must be \[S, 1, 48\]"):
        mla_decode_attention(q, cache.expand(16, 2, -1), lens, scale=1.0, latent=LATENT, starts=lens)
    with pytest.raises(ValueError, match="block_tables \\(paged\\) or starts"):
        mla_decode_attention(q, cache, lens, scale=1.0, latent=LATENT)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        mla_decode_attention(
            q, cache, lens, scale=1.0, latent=LATENT, block_tables=lens[:, None], block_size=6
        )


@INTERPRETED
def test_tiny_deepseek_decodes_the_same_greedy_tokens_through_the_kernel():
    """The real engine loop (paged, NaN-poisoned arena) on the tiny MLA model: `--attention torch`
    and the Triton path (store and decode kernels, in the interpreter) emit the same tokens."""
    from engines import ENGINES
    from kvbench.engine import Engine
    from kvbench.modeling.arena import KVArena
    from kvbench.modeling.weights import random_model
    from kvbench.real.model_runner import ModelRunner
    from tests.support import VIRTUAL_CLOCK
    from tests.test_families_mla import MLA_TINY
    from tests.test_modeling import engine_options, small_trace

    cpu = torch.device("cpu")
    model = random_model(MLA_TINY, torch.float32, cpu, seed=3)
    trace = small_trace(count=4)
    tokens = {}
    for attention in ("torch", "triton"):
        arena = KVArena(MLA_TINY, 200, torch.float32, cpu)
        arena.fill(float("nan"))
        sched = ENGINES["paged"].build(engine_options(200))
        runner = ModelRunner(
            model, arena, sched.allocator, max_batch=4, max_len=64, temperature=0.0, seed=5,
            attention=attention, clock=VIRTUAL_CLOCK,
        )  # fmt: skip
        assert runner.backend == attention
        run = Engine(sched, runner).run(trace)
        assert [len(seq.output_ids) for seq in run.sequences] == [r.output_len for r in trace.requests]
        tokens[attention] = [tuple(seq.output_ids) for seq in run.sequences]
    assert tokens["torch"] == tokens["triton"]


def test_kernels_mla_option_times_the_v2_lite_cell_beside_the_kv_cell(tmp_path):
    """`kvbench kernels --mla` (in process, Triton's interpreter): after each K/V cell, an MLA cell
    of V2-Lite's shape on kvbench's kernels, matching its reference, with the bytes MLA reads (one
    latent + rope vector per token, plus q and out) and its time over the K/V cell's."""
    import csv
    from dataclasses import fields

    from typer.testing import CliRunner

    from kernels import bench
    from kvbench.cli.app import app

    out = tmp_path / "kernels"
    args = ["--batch", "2", "--context", "5,33", "--block-size", "16", "--kv-heads", "2", "--gqa", "2",
            "--head-dim", "16", "--dtype", "float16", "--repeats", "1", "--warmup", "0", "--mla",
            "--backends", "kvbench-paged,kvbench-contiguous,torch-sdpa", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, ["kernels", *args])
    assert result.exit_code == 0, result.output
    with open(out / "kernels.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == [field.name for field in fields(bench.Row)]
    cells = ("B2 L5 bs16 g2", "B2 L5 bs16 mla h16", "B2 L33 bs16 g2", "B2 L33 bs16 mla h16")
    assert [(r["cell"], r["backend"]) for r in rows] == [
        (c, b) for c in cells for b in ("kvbench-paged", "kvbench-contiguous", "torch-sdpa")
    ]
    for row in rows:
        mla = "mla" in row["cell"]
        assert int(row["latent"]) == (512 if mla else 0)
        if mla and row["backend"] == "torch-sdpa":
            assert row["status"] == "skipped" and row["note"] == "no MLA (latent) decode"
            continue
        assert row["status"] == "ok", row
        assert float(row["max_abs_err"]) <= float(row["atol"])
        if mla:
            context = int(row["context"])
            assert (int(row["q_heads"]), int(row["kv_heads"]), int(row["head_dim"])) == (16, 1, 576)
            assert int(row["useful_bytes"]) == 2 * context * 576 * 2 + 2 * 16 * (576 + 512) * 2
            assert float(row["vs_full"]) > 0 and float(row["bw_fraction"]) > 0
        else:
            assert int(row["useful_bytes"]) == 2 * (2 * int(row["context"]) * 2 * 16 + 2 * 4 * 16) * 2
            assert row["vs_full"] == "nan"


def test_kernels_mla_option_needs_a_kvbench_backend():
    from typer.testing import CliRunner

    from kvbench.cli.app import app

    result = CliRunner().invoke(app, ["kernels", "--mla", "--backends", "torch-sdpa"])
    assert result.exit_code == 2
    assert (
        result.stderr
        == "error: --mla: MLA runs on kvbench-paged and kvbench-contiguous; --backends has neither\n"
    )
