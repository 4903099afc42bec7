"""Sliding-window decode and prefill in the Triton kernels, against the PyTorch window attention.

The oracle is `kvbench/modeling/window_attention.py` (the path window layers take on the torch
backend). Contexts run over several windows; windows below, at and across block and tile
boundaries; paged (block sizes 1, 16 and one larger than a tile) and contiguous; every split
count and merge. Each check computes the oracle, then fills every position before the windows'
left bound, in the sequence's own slots, with NaN before it runs the kernel: a kernel that read
one of them would return NaN (a masked NaN still poisons a weighted sum), so a matching output
proves that nothing before the window is read. Tolerances as in tests/test_kernels.py. The
kernel checks run in Triton's interpreter on CPU and compiled on a GPU (marked `gpu`); those of
the dispatch, the benchmark row and a tiny Mistral against transformers run on CPU.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from kernels.decode_attention import decode_attention  # noqa: E402
from kernels.extend_attention import extend_attention  # noqa: E402
from kernels.splits import LARGE_GRID_LAUNCH, SMALL_GRID_LAUNCH  # noqa: E402
from kvbench.modeling.attention import AttentionMetadata, attention  # noqa: E402
from kvbench.modeling.window_attention import decode_window_attention, extend_window_attention  # noqa: E402
from tests.support import INTERPRETED  # noqa: E402
from tests.test_kernels import DEVICES, TOLERANCE, Arena, _rand  # noqa: E402

CPU = torch.device("cpu")


def poison_before(arena: Arena, bounds: list[int]) -> None:
    """NaN into sequence b's own slots at positions `[0, bounds[b])`: where a window never looks."""
    for b, bound in enumerate(bounds):
        if bound > 0:
            where = arena.slots(b, torch.arange(bound, device=arena.k.device))
            arena.k[where] = float("nan")
            arena.v[where] = float("nan")


# (context lengths, block size: 0 = contiguous, window): windows of several blocks, not block
# aligned, smaller than a block and than a tile, one larger than some contexts (full attention
# there); rows of different lengths, an empty one among them
DECODE_CASES = [
    ([200, 1, 70, 131], 16, 37),
    ([300, 5, 129], 1, 64),
    ([260, 0, 100], 128, 3),
    ([200, 64, 9, 190], 0, 50),
    ([150, 2], 0, 7),
]
# (splits, merge, launch): one split (written directly), the merge kernel, the fused merge; both tiles
DECODE_RUNS = [
    (1, "kernel", SMALL_GRID_LAUNCH),
    (3, "kernel", LARGE_GRID_LAUNCH),
    (4, "fused", SMALL_GRID_LAUNCH),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("lens", "block_size", "window"), DECODE_CASES)
def test_windowed_decode_matches_reference_and_reads_nothing_before_the_window(
    device, lens, block_size, window
):
    gen = torch.Generator().manual_seed(sum(lens) + block_size + window)
    kv_heads, group, head_dim, dtype = 2, 2, 16, torch.float16
    arena = Arena(lens, kv_heads, head_dim, dtype, device, block_size=block_size, gen=gen)
    q = _rand((len(lens), kv_heads * group, head_dim), dtype, device, gen)
    kwargs = dict(scale=head_dim**-0.5, **arena.addressing())
    expected = decode_window_attention(q, arena.k, arena.v, arena.lens, window=window, **kwargs)
    full = decode_window_attention(q, arena.k, arena.v, arena.lens, **kwargs)
    assert any(n > window for n in lens) and (expected - full).abs().max() > 10 * TOLERANCE[dtype]  # it bites
    poison_before(arena, [max(n - window, 0) for n in lens])
    for num_splits, merge, launch in DECODE_RUNS:
        out = torch.full_like(q, float("nan"))
        decode_attention(
            q, arena.k, arena.v, arena.lens, num_splits=num_splits, merge=merge, launch=launch, out=out,
            window=window, **kwargs,
        )  # fmt: skip
        run = (num_splits, merge, launch)
        assert not out.isnan().any(), run
        assert (out.float() - expected.float()).abs().max() <= TOLERANCE[dtype], run


@pytest.mark.parametrize("device", DEVICES)
def test_windowed_decode_in_fp32_with_the_default_splits(device):
    """The runner's CPU dtype, splits chosen for the window (not the context), window None = full."""
    gen = torch.Generator().manual_seed(11)
    lens, window = [513, 40, 300], 100
    arena = Arena(lens, 1, 32, torch.float32, device, block_size=32, gen=gen)
    q = _rand((3, 4, 32), torch.float32, device, gen)
    kwargs = dict(scale=0.2, **arena.addressing())
    full = decode_attention(q, arena.k, arena.v, arena.lens, window=None, **kwargs)
    assert (full - decode_window_attention(q, arena.k, arena.v, arena.lens, **kwargs)).abs().max() <= 1e-5
    expected = decode_window_attention(q, arena.k, arena.v, arena.lens, window=window, **kwargs)
    poison_before(arena, [max(n - window, 0) for n in lens])
    out = decode_attention(q, arena.k, arena.v, arena.lens, window=window, **kwargs)
    assert (out - expected).abs().max() <= 1e-5


# (context lengths after the step, tokens new in it, block size, window): fresh prompts longer
# than several windows, an extension of a stored prefix, single new tokens; windows smaller than
# a block, not aligned, larger than the prompt
EXTEND_CASES = [
    ([90, 1, 70, 40], [90, 1, 6, 1], 16, 20),
    ([75, 50], [75, 3], 0, 5),
    ([66, 33], [40, 33], 1, 33),
    ([45, 12], [45, 12], 64, 100),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("lens", "new", "block_size", "window"), EXTEND_CASES)
def test_windowed_prefill_matches_reference_and_reads_nothing_before_the_windows(
    device, lens, new, block_size, window
):
    gen = torch.Generator().manual_seed(sum(lens) + window)
    kv_heads, group, head_dim, dtype = 2, 2, 16, torch.float32
    arena = Arena(lens, kv_heads, head_dim, dtype, device, block_size=block_size, gen=gen)
    q = _rand((sum(new), kv_heads * group, head_dim), dtype, device, gen)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], device=device)
    kwargs = dict(scale=head_dim**-0.5, **arena.addressing())
    expected = extend_window_attention(q, arena.k, arena.v, cu, arena.lens, window=window, **kwargs)
    poison_before(arena, [max(n - m - window + 1, 0) for n, m in zip(lens, new, strict=True)])
    out = torch.full_like(q, float("nan"))
    extend_attention(q, arena.k, arena.v, cu, arena.lens, max_new=max(new), out=out, window=window, **kwargs)
    assert not out.isnan().any()
    assert (out - expected).abs().max() <= 1e-5


# (context lengths, block size: 0 = contiguous, window): full attention and a window, paged and not
SOFTCAP_CASES = [([200, 1, 70, 131], 16, 0), ([300, 5, 129], 1, 64), ([200, 64, 9, 190], 0, 50)]
SOFTCAP = 0.4  # small beside these scores (|s| up to about 2), so capping changes every answer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("lens", "block_size", "window"), SOFTCAP_CASES)
def test_soft_capped_decode_matches_reference(device, lens, block_size, window):
    """Gemma 2's c x tanh(s / c) on every scaled score, in the kernel, with and without a window,
    through one split, the merge kernel and the fused merge."""
    gen = torch.Generator().manual_seed(sum(lens) + window)
    kv_heads, group, head_dim, dtype = 2, 2, 16, torch.float32
    arena = Arena(lens, kv_heads, head_dim, dtype, device, block_size=block_size, gen=gen)
    q = _rand((len(lens), kv_heads * group, head_dim), dtype, device, gen)
    kwargs = dict(scale=head_dim**-0.5, window=window, **arena.addressing())
    expected = decode_window_attention(q, arena.k, arena.v, arena.lens, softcap=SOFTCAP, **kwargs)
    uncapped = decode_window_attention(q, arena.k, arena.v, arena.lens, **kwargs)
    assert (expected - uncapped).abs().max() > 1e-2  # the cap bites
    for num_splits, merge, launch in DECODE_RUNS:
        out = decode_attention(
            q, arena.k, arena.v, arena.lens, num_splits=num_splits, merge=merge, launch=launch,
            softcap=SOFTCAP, **kwargs,
        )  # fmt: skip
        assert (out - expected).abs().max() <= 1e-5, (num_splits, merge)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("lens", "new", "block_size", "window"), [EXTEND_CASES[0], EXTEND_CASES[1]])
@pytest.mark.parametrize("windowed", [True, False], ids=["window", "full"])
def test_soft_capped_prefill_matches_reference(device, lens, new, block_size, window, windowed):
    window = window if windowed else 0
    gen = torch.Generator().manual_seed(sum(lens) + window)
    kv_heads, group, head_dim, dtype = 2, 2, 16, torch.float32
    arena = Arena(lens, kv_heads, head_dim, dtype, device, block_size=block_size, gen=gen)
    q = _rand((sum(new), kv_heads * group, head_dim), dtype, device, gen)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], device=device)
    kwargs = dict(scale=head_dim**-0.5, window=window, **arena.addressing())
    expected = extend_window_attention(q, arena.k, arena.v, cu, arena.lens, softcap=SOFTCAP, **kwargs)
    uncapped = extend_window_attention(q, arena.k, arena.v, cu, arena.lens, **kwargs)
    assert (expected - uncapped).abs().max() > 1e-2
    out = extend_attention(q, arena.k, arena.v, cu, arena.lens, max_new=max(new), softcap=SOFTCAP, **kwargs)
    assert (out - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("softcap", [1e4, 1e6], ids=["1e4", "1e6"])
def test_a_cap_far_above_the_scores_changes_nothing_in_either_kernel(device, softcap):
    """There tanh(s / c) is all but s / c, which a formula of 1 - e^-2|x| loses to cancellation
    (a cap of 1e6 was off by 2e-2 in fp16): the kernels take tanh's series there."""
    lens, new = [70, 20], [6, 20]
    gen = torch.Generator().manual_seed(3)
    arena = Arena(lens, 1, 16, torch.float16, device, block_size=8, gen=gen)
    kwargs = dict(scale=0.25, **arena.addressing())
    q = _rand((2, 2, 16), torch.float16, device, gen)
    expected = decode_window_attention(q, arena.k, arena.v, arena.lens, **kwargs)
    out = decode_attention(q, arena.k, arena.v, arena.lens, softcap=softcap, **kwargs)
    assert (out.float() - expected.float()).abs().max() <= TOLERANCE[torch.float16]
    q = _rand((sum(new), 2, 16), torch.float16, device, gen)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], device=device)
    expected = extend_window_attention(q, arena.k, arena.v, cu, arena.lens, **kwargs)
    out = extend_attention(q, arena.k, arena.v, cu, arena.lens, max_new=max(new), softcap=softcap, **kwargs)
    assert (out.float() - expected.float()).abs().max() <= TOLERANCE[torch.float16]


@pytest.mark.parametrize("softcap", [-1.0, float("inf"), float("nan"), 1e-40])
def test_a_score_cap_is_zero_or_a_positive_number(softcap):
    arena = Arena([4], 1, 16, torch.float32, CPU, block_size=4, gen=torch.Generator().manual_seed(0))
    q = torch.zeros(1, 1, 16)
    with pytest.raises(ValueError, match="softcap"):
        decode_attention(q, arena.k, arena.v, arena.lens, scale=1.0, softcap=softcap, **arena.addressing())
    with pytest.raises(ValueError, match="softcap"):
        extend_attention(
            q, arena.k, arena.v, torch.tensor([0, 1]), arena.lens, scale=1.0, max_new=1, softcap=softcap,
            **arena.addressing(),
        )  # fmt: skip


@INTERPRETED
@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "decode"])
def test_attention_sends_window_layers_and_soft_caps_to_the_kernels(prefill, monkeypatch):
    """backend "triton": a window layer, and a soft-capped one, run the kernels (NaN before the
    window stays unread, and the answer is the torch backend's, which runs the PyTorch path).

    Which path ran is counted by wrapping the PyTorch window attention (it still computes).
    """
    from kvbench.modeling import window_attention

    name = "extend_window_attention" if prefill else "decode_window_attention"
    calls, real = [], getattr(window_attention, name)
    monkeypatch.setattr(window_attention, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    gen = torch.Generator().manual_seed(5)
    lens, new, window, head_dim = [70, 20], ([6, 20] if prefill else [1, 1]), 9, 16
    arena = Arena(lens, 1, head_dim, torch.float32, CPU, block_size=8, gen=gen)
    tokens = sum(new)
    q = _rand((tokens, 2, head_dim), torch.float32, CPU, gen)
    k, v = (
        _rand((tokens, 1, head_dim), torch.float32, CPU, gen),
        _rand((tokens, 1, head_dim), torch.float32, CPU, gen),
    )
    slots = torch.cat(
        [arena.slots(b, torch.arange(n - m, n)) for b, (n, m) in enumerate(zip(lens, new, strict=True))]
    )
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()])

    def run(backend: str, **layer) -> torch.Tensor:
        meta = AttentionMetadata(
            is_prefill=prefill, slot_mapping=slots, cu_seqlens=cu, context_lens=arena.lens,
            block_tables=arena.tables, block_size=arena.block_size, max_new=max(new), num_splits=2,
            backend=backend,
        )  # fmt: skip
        return attention(q, k, v, arena.k, arena.v, meta, 0.25, **layer)

    expected = run("torch", window=window)
    assert len(calls) == 1  # the torch backend: the PyTorch window attention
    poison_before(arena, [max(n - m - window + 1, 0) for n, m in zip(lens, new, strict=True)])
    assert (run("triton", window=window) - expected).abs().max() <= 1e-5
    assert len(calls) == 1  # the triton backend: the kernels
    capped = run("torch", window=window, softcap=0.5)
    assert len(calls) == 2 and (capped - expected).abs().max() > 1e-3  # the torch backend: PyTorch
    assert (run("triton", window=window, softcap=0.5) - capped).abs().max() <= 1e-5
    assert len(calls) == 2  # the triton backend: the kernels cap scores


@INTERPRETED
def test_kernels_benchmark_times_a_window_row_beside_full_attention(tmp_path):
    """`kvbench kernels --window 0,8` in the interpreter: each cell at full attention, then with a
    window of 8 on kvbench's kernels (checked against the PyTorch window attention), its useful
    bytes the window's and its time set against full attention's; the plots keep full attention."""
    import csv

    from typer.testing import CliRunner

    from kvbench.cli.app import app

    out = tmp_path / "kernels"
    args = ["kernels", "--batch", "2", "--context", "40", "--block-size", "4", "--kv-heads", "2", "--gqa",
            "2", "--head-dim", "16", "--dtype", "float16", "--repeats", "1", "--warmup", "0",
            "--window", "0,8", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with open(out / "kernels.csv", newline="") as f:
        rows = {(r["cell"], r["backend"]): r for r in csv.DictReader(f)}
    qo = 2 * 2 * 4 * 16 * 2  # q and out: batch × query heads × head dim × 2 bytes
    for backend in ("kvbench-paged", "kvbench-contiguous"):
        full, windowed = rows["B2 L40 bs4 g2", backend], rows["B2 L40 bs4 g2 w8", backend]
        assert full["status"] == windowed["status"] == "ok" and windowed["window"] == "8"
        assert float(windowed["max_abs_err"]) <= float(windowed["atol"])
        assert int(full["useful_bytes"]) == 2 * 2 * 40 * 2 * 16 * 2 + qo  # K and V of every position
        assert int(windowed["useful_bytes"]) == 2 * 2 * 8 * 2 * 16 * 2 + qo  # of the window's 8
        assert float(windowed["vs_full"]) > 0 and float(windowed["bw_fraction"]) > 0
    assert rows["B2 L40 bs4 g2 w8", "torch-sdpa"]["status"] == "skipped"
    assert "x full attention's time" in result.output
    assert (out / "latency.png").stat().st_size > 0


@pytest.mark.parametrize("value", ["-1", "8,x"])
def test_kernels_benchmark_rejects_a_bad_window_in_one_line(value):
    from typer.testing import CliRunner

    from kvbench.cli.app import app

    result = CliRunner().invoke(app, ["kernels", "--window", value])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --window: ") and result.stderr.count("\n") == 1, result.stderr


@INTERPRETED
@pytest.mark.slow
def test_mistral_on_the_window_kernels_equals_transformers(tmp_path):
    """A tiny Mistral (window 8), paged, on the triton backend, slots older than each step's
    windows poisoned with NaN: prefill chunks and decode steps give transformers' logits (the
    kernel tests above cover contiguous addressing; this one takes ~15 s in the interpreter)."""
    pytest.importorskip("transformers")
    from kvbench.modeling.weights import load_checkpoint
    from tests.test_families import compare, reference

    ref, folder = reference(tmp_path, "mistral")
    model = load_checkpoint(folder, torch.float32, CPU)
    compare(ref, model, paged=True, forget_before_window=True, backend="triton")


@INTERPRETED
def test_kernels_benchmark_times_a_capped_row_beside_the_uncapped_one(tmp_path):
    """`kvbench kernels --window 0,8 --softcap 0,0.5`: each cell uncapped, then capped on kvbench's
    kernels, checked against the PyTorch attention with the cap (a cap of 0.5 changes these
    scores, so a kernel that ignored it would be off by more than the tolerance), and timed
    against the uncapped full-attention cell; the plots keep only that one."""
    import csv

    from typer.testing import CliRunner

    from kvbench.cli.app import app

    out = tmp_path / "kernels"
    args = ["kernels", "--batch", "2", "--context", "40", "--block-size", "4", "--kv-heads", "2", "--gqa",
            "2", "--head-dim", "16", "--dtype", "float16", "--repeats", "1", "--warmup", "0",
            "--window", "0,8", "--softcap", "0,0.5", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with open(out / "kernels.csv", newline="") as f:
        rows = {(r["cell"], r["backend"]): r for r in csv.DictReader(f)}
    for backend in ("kvbench-paged", "kvbench-contiguous"):
        full = rows["B2 L40 bs4 g2", backend]
        for label in ("B2 L40 bs4 g2 cap0.5", "B2 L40 bs4 g2 w8 cap0.5"):
            capped = rows[label, backend]
            assert capped["status"] == "ok" and float(capped["softcap"]) == 0.5
            assert float(capped["max_abs_err"]) <= float(capped["atol"])
            assert float(capped["vs_full"]) > 0
        assert rows["B2 L40 bs4 g2 cap0.5", backend]["useful_bytes"] == full["useful_bytes"]
        assert float(full["softcap"]) == 0
    assert rows["B2 L40 bs4 g2 cap0.5", "torch-sdpa"]["status"] == "skipped"
    assert rows["B2 L40 bs4 g2 cap0.5", "torch-sdpa"]["note"] == "no score cap"


@pytest.mark.parametrize("value", ["-1", "nan", "x", "0,0", "1e7"])
def test_kernels_benchmark_rejects_a_bad_score_cap_in_one_line(value):
    from typer.testing import CliRunner

    from kvbench.cli.app import app

    result = CliRunner().invoke(app, ["kernels", "--softcap", value])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --softcap") and result.stderr.count("\n") == 1, result.stderr
