"""`kvbench kernels`: the real CLI on a tiny grid in Triton's interpreter, its files, its errors.

The timings of a CPU run mean nothing; what is checked is that every backend's output
matches the reference, every column is written, the plots render from the CSV alone, and
bad options stop with one line.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("triton")

from kernels import bench, bench_backends
from kernels.reference import decode_attention_ref
from kvbench.cli import kernels as cli_kernels
from kvbench.cli.app import app
from kvbench.report.kernel_plot import plot_bandwidth_fraction, plot_latency, read_rows
from kvbench.results.files import write_csv

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--batch", "2", "--context", "5,33", "--block-size", "4", "--kv-heads", "2", "--gqa", "2",
        "--head-dim", "16", "--dtype", "float16", "--repeats", "2", "--warmup", "0"]  # fmt: skip
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def kvbench(*args: str, interpret: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "kvbench", "kernels", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_cli_runs_the_tiny_grid_and_writes_csv_bandwidth_and_plots(tmp_path):
    out = tmp_path / "kernels"
    proc = kvbench(*TINY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "CPU timings mean nothing" in proc.stdout
    with open(out / "kernels.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == [field.name for field in fields(bench.Row)]
    assert [(r["cell"], r["backend"]) for r in rows] == [
        (cell, backend) for cell in ("B2 L5 bs4 g2", "B2 L33 bs4 g2") for backend in bench.CPU_BACKENDS
    ]
    for row in rows:
        assert row["status"] == "ok", row
        assert float(row["max_abs_err"]) <= float(row["atol"]) == bench.ATOL["float16"]
        assert float(row["us"]) > 0 and float(row["gbps"]) > 0 and float(row["bw_fraction"]) > 0
        assert int(row["useful_bytes"]) == int(row["moved_bytes"])  # no padding: all lengths equal
    assert all(float(r["vs_contiguous"]) == 1.0 for r in rows if r["backend"] == "kvbench-contiguous")
    kv = 2 * 2 * 33 * 2 * 16 * 2  # K and V: batch × context × KV heads × head dim × 2 bytes
    qo = 2 * 2 * 4 * 16 * 2  # q and out: batch × query heads × head dim × 2 bytes
    assert int(rows[-1]["useful_bytes"]) == kv + qo
    bandwidth = json.loads((out / "bandwidth.json").read_text())
    assert bandwidth["read_bandwidth_bytes_per_s"] > 0 and bandwidth["device"] == "cpu"
    for name in ("latency", "bandwidth_fraction"):
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.svg").stat().st_size > 0
    assert "kvbench-paged" in proc.stdout.split("cell")[-1]  # the closing table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "--batch: '0' is not a positive integer"),
        (["--dtype", "int8"], "--dtype: 'int8' is not one of bfloat16, float16"),
        (["--backends", "kvbench-paged,nope"], "--backends: unknown backend 'nope'"),
    ],
)
def test_bad_options_stop_with_one_line(args, message):
    proc = kvbench(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {message}") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--context", "1024,x"], "--context: 'x' is not a positive integer"),
        (["--block-size", "12"], "--block-size: 12 is not a power of two in 1..256"),
        (["--gqa", "3"], "--gqa: 3 is not a power of two in 1..16"),
        (["--head-dim", "8"], "--head-dim: 8 is not a power of two in 16..256"),
        (["--cells", "8by1024"], "--cells: '8by1024' is not BATCHxCONTEXT"),
        (["--repeats", "0"], "--repeats must be a positive integer up to 2147483647, got 0"),
    ],
)
def test_more_bad_options_in_process(args, message):
    result = CliRunner().invoke(app, ["kernels", *args])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_command_says_so(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    result = CliRunner().invoke(app, ["kernels", "--batch", "1"])
    assert result.exit_code == 2
    assert (
        result.stderr.startswith("error: kvbench kernels needs a CUDA device")
        and result.stderr.count("\n") == 1
    )


@pytest.mark.parametrize("device", ["cuda:abc", "cuda:", "cuda:-1", "cuda:0 ", "cpu"])
def test_a_device_that_is_not_cuda_or_cuda_n_is_one_line(monkeypatch, device):
    """`cuda:abc` once passed the check and failed in torch.device, a traceback on a GPU."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    result = CliRunner().invoke(app, ["kernels", "--batch", "1", "--device", device])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: --device: {device!r} is not cuda or cuda:N"), result.stderr
    assert result.stderr.count("\n") == 1


def test_exact_cells_and_option_lists():
    assert cli_kernels.cell_pairs("8x1024, 256x2048") == [(8, 1024), (256, 2048)]
    cells = bench.grid([(8, 1024), (32, 16384)], [1, 16], [4], kv_heads=8, head_dim=128, dtype="bfloat16",
                       ragged=False)  # fmt: skip
    assert [(c.batch, c.context, c.block_size, c.q_heads) for c in cells] == [
        (8, 1024, 1, 32), (8, 1024, 16, 32), (32, 16384, 1, 32), (32, 16384, 16, 32),
    ]  # fmt: skip
    assert tuple(bench.BUILDERS) == bench.BACKENDS == cli_kernels._BACKENDS
    assert cli_kernels._CPU_BACKENDS == bench.CPU_BACKENDS


def test_layout_pages_are_a_random_permutation_and_extents_back_to_back():
    cell = bench.Cell(batch=5, context=40, block_size=4, kv_heads=1, gqa=1, head_dim=16, dtype="float16",
                      ragged=True)  # fmt: skip
    layout = bench.make_layout(cell, np.random.default_rng(3), torch.device("cpu"))
    lens = layout.lens.long()
    blocks = (lens + 3) // 4
    held = [layout.block_tables[b, : blocks[b]].tolist() for b in range(5)]
    physical = [p for row in held for p in row]
    assert sorted(physical) == list(range(int(blocks.sum()))) != physical  # every block once, shuffled
    assert layout.num_slots == 4 * int(blocks.sum())
    assert layout.starts.tolist() == [0, *np.cumsum(lens.tolist())[:-1].tolist()]
    assert int(lens.min()) >= 1 and int(lens.max()) <= cell.context


def test_ragged_cell_every_backend_matches_the_reference():
    """In-process (the interpreter on CPU, compiled on a GPU): ragged lengths, SDPA padded and masked."""
    cell = bench.Cell(batch=3, context=21, block_size=2, kv_heads=2, gqa=4, head_dim=16, dtype="float16",
                      ragged=True)  # fmt: skip
    config = bench.BenchConfig(
        cells=(cell,), backends=bench.CPU_BACKENDS, device=str(DEVICE), repeats=1, warmup=0
    )
    context = bench.Context.create(DEVICE, config.backends)
    rows = bench.run_cell(cell, config, context, read_bw=1e9)
    assert [r.backend for r in rows] == list(bench.CPU_BACKENDS)
    for row in rows:
        assert row.status == "ok" and row.max_abs_err <= bench.ATOL["float16"], row
    sdpa = rows[-1]
    assert "masked" in sdpa.note and sdpa.moved_bytes > sdpa.useful_bytes  # it reads the padding too


def test_a_cell_over_the_memory_cap_is_skipped_with_a_note():
    cell = bench.Cell(
        batch=64, context=4096, block_size=16, kv_heads=8, gqa=4, head_dim=128, dtype="bfloat16"
    )
    config = bench.BenchConfig(cells=(cell,), backends=("kvbench-paged",), device="cpu", max_gib=0.01)
    context = bench.Context.create(torch.device("cpu"), config.backends)
    (row,) = bench.run_cell(cell, config, context, read_bw=1e9)
    assert row.status == "skipped" and "--max-gib 0.01" in row.note and math.isnan(row.us)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_block_mask_reads_the_paged_arena_like_the_reference():
    """The FlexAttention mask built from the block table, checked in eager mode on the CPU."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    cell = bench.Cell(batch=4, context=19, block_size=4, kv_heads=2, gqa=2, head_dim=16, dtype="float16",
                      ragged=True)  # fmt: skip
    layout = bench.make_layout(cell, np.random.default_rng(0), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 4, 16, generator=gen)  # [B, Hq, D]
    k, v = (torch.randn(layout.num_slots, 2, 16, generator=gen) for _ in range(2))  # [S, Hkv, D]
    mask = bench_backends.flex_block_mask(layout, cell.batch)
    k4, v4 = k.permute(1, 0, 2).unsqueeze(0), v.permute(1, 0, 2).unsqueeze(0)  # [1, Hkv, S, D]
    out = flex.flex_attention(q.unsqueeze(2), k4, v4, block_mask=mask, scale=0.25, enable_gqa=True).squeeze(2)
    ref = decode_attention_ref(
        q, k, v, layout.lens, scale=0.25, block_tables=layout.block_tables, block_size=4
    )
    assert (out - ref).abs().max() < 1e-5


def test_plots_render_from_a_saved_csv_alone(tmp_path):
    rows = []
    for batch, context, block_size in ((8, 1024, 16), (8, 4096, 16), (32, 1024, 1), (32, 1024, 16)):
        cell = bench.Cell(batch, context, block_size, 8, 4, 128, "bfloat16")
        base = dict(useful_bytes=2 * batch * context * 8 * 128 * 2, atol=0.02, copies=4)
        base["moved_bytes"] = base["useful_bytes"]
        contiguous_us = base["useful_bytes"] / 3.5e12 * 1e6
        for i, backend in enumerate(bench.BACKENDS):
            if backend == "flex-paged" and block_size == 1:
                rows.append(bench._row(cell, backend, "failed", note="LoweringException", **base))
                continue
            us = contiguous_us * (1 + 0.1 * i)
            row = bench._row(cell, backend, "ok", us=us, us_p10=us, us_p90=us, max_abs_err=1e-3, **base)
            rows.append(bench._finish(row, 4.4e12, contiguous_us))
    path = tmp_path / "kernels.csv"
    write_csv(path, rows, bench.Row)
    saved = read_rows(path)  # only the file from here on
    assert len(saved) == len(rows) and saved[0]["batch"] == 8 and saved[0]["ragged"] is False
    failed = [r for r in saved if r["status"] == "failed"]
    assert len(failed) == 1 and math.isnan(failed[0]["us"]) and failed[0]["note"] == "LoweringException"
    written = plot_latency(saved, tmp_path / "plots" / "latency")
    written += plot_bandwidth_fraction(saved, tmp_path / "plots" / "fraction")
    assert [p.name for p in written] == ["latency.png", "latency.svg", "fraction.png", "fraction.svg"]
    for p in written:
        data = p.read_bytes()
        assert data.startswith(b"\x89PNG") if p.suffix == ".png" else b"<svg" in data
