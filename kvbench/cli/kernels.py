"""`kvbench kernels`: time decode attention on a grid (kernels/bench.py), write CSV and plots.

Options are checked before torch is imported, so a typo costs a fraction of a second. On a
machine without CUDA the command stops, unless TRITON_INTERPRET=1 asks for the CPU smoke
run the tests use (the Triton interpreter; its timings mean nothing). `--mla` adds cells of
DeepSeek-V2-Lite's absorbed MLA decode (`kernels/mla_decode.py`) beside the K/V cells.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated

import typer

from kvbench.cli import options as opt
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_distinct
from kvbench.results.outputs import prepare_out

_BACKENDS = (  # kernels.bench.BACKENDS, spelled here so that checking options needs no torch
    "kvbench-paged", "kvbench-contiguous", "kvbench-virtual", "torch-sdpa", "flex-paged",
    "flashinfer-cuda-cores", "flashinfer-tensor-cores",
)  # fmt: skip
SHORT_HELP = "Time decode attention: paged vs contiguous, beside SDPA, FlexAttention, FlashInfer."
_CPU_BACKENDS = ("kvbench-paged", "kvbench-contiguous", "torch-sdpa")
_DTYPES = ("bfloat16", "float16")


def _is_count(item: str) -> bool:
    """ASCII digits only, at most 18 of them: `str.isdigit` also accepts '²' and other digits
    `int` rejects, and `int` refuses a string of more than 4300 digits; no size here needs 19."""
    return re.fullmatch(r"[0-9]{1,18}", item) is not None


def positive_ints(option: str, text: str) -> list[int]:
    """`"8,32"` -> `[8, 32]`; anything else, or a value given twice, is a one-line error naming
    `option`."""
    items = [item.strip() for item in text.split(",")]
    for item in items:
        if not _is_count(item) or int(item) < 1:
            raise KvbenchError(f"{option}: {item!r} is not a positive integer (digits 0-9, at most 18)")
    check_distinct(option, items, int)
    return [int(item) for item in items]


def window_sizes(text: str) -> list[int]:
    """`"0,4096"` -> `[0, 4096]`: sliding windows, 0 for full attention (the row windows compare with)."""
    items = [item.strip() for item in text.split(",")]
    for item in items:
        if not _is_count(item):
            raise KvbenchError(f"--window: {item!r} is not 0 (full attention) or a positive integer")
    check_distinct("--window", items, int)
    return [int(item) for item in items]


MAX_SOFTCAP = 1e6  # a cap this large changes no score of a half-precision dot product


def softcaps(text: str) -> list[float]:
    """`"0,50"` -> `[0.0, 50.0]`: score caps, 0 for none (the row capped cells compare with)."""
    items = [item.strip() for item in text.split(",")]
    values = []
    for item in items:
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not 0 <= value <= MAX_SOFTCAP:  # NaN too
            raise KvbenchError(f"--softcap: {item!r} is not 0 (no cap) or a number in (0, {MAX_SOFTCAP:g}]")
        values.append(value)
    check_distinct("--softcap", items, float)
    return values


def powers_of_two(option: str, text: str, low: int, high: int) -> list[int]:
    values = positive_ints(option, text)
    for value in values:
        if value & (value - 1) or not low <= value <= high:
            raise KvbenchError(f"{option}: {value} is not a power of two in {low}..{high}")
    return values


def cell_pairs(text: str) -> list[tuple[int, int]]:
    """`"8x1024,64x4096"` -> `[(8, 1024), (64, 4096)]`: (batch, context) pairs."""
    items = [item.strip() for item in text.split(",")]
    pairs = []
    for item in items:
        batch, sep, context = item.partition("x")
        if not sep:
            raise KvbenchError(f"--cells: {item!r} is not BATCHxCONTEXT (e.g. 8x1024)")
        pairs.append((positive_ints("--cells", batch)[0], positive_ints("--cells", context)[0]))
    check_distinct("--cells", items, lambda item: tuple(int(n) for n in item.split("x")))
    return pairs


def backend_names(text: str | None, cpu: bool) -> tuple[str, ...]:
    if text is None:
        return _CPU_BACKENDS if cpu else _BACKENDS
    names = tuple(name.strip() for name in text.split(","))
    check_distinct("--backends", names)
    for name in names:
        if name not in _BACKENDS:
            raise KvbenchError(f"--backends: unknown backend {name!r}; choose from {', '.join(_BACKENDS)}")
    if cpu and not set(names) & set(_CPU_BACKENDS):
        raise KvbenchError(f"--backends: the CPU smoke run has only {', '.join(_CPU_BACKENDS)}")
    return names


@opt.user_errors
def kernels(
    ctx: typer.Context,
    batch: Annotated[str, typer.Option(help="Batch sizes, comma separated.")] = "8,32,64,256",
    context: Annotated[
        str, typer.Option(help="Context lengths, comma separated.")
    ] = "1024,2048,4096,8192,16384",
    cells: Annotated[
        str | None,
        typer.Option(help="Exact BATCHxCONTEXT pairs (e.g. 8x1024,64x4096) instead of --batch × --context."),
    ] = None,
    block_size: Annotated[
        str, typer.Option(help="Block sizes, powers of two in 1..256, comma separated.")
    ] = "16",
    gqa: Annotated[
        str, typer.Option(help="Query heads per KV head (powers of two up to 16), comma separated.")
    ] = "4",
    kv_heads: Annotated[int, typer.Option(help="KV heads.")] = 8,
    head_dim: Annotated[int, typer.Option(help="Head dimension (a power of two in 16..256).")] = 128,
    dtype: Annotated[str, typer.Option(help="bfloat16 or float16.")] = "bfloat16",
    ragged: Annotated[bool, typer.Option(help="Context lengths uniform in [1, L] instead of all L.")] = False,
    window: Annotated[
        str,
        typer.Option(
            help="Sliding windows, comma separated (0: full attention); each cell runs at each, windows "
            "on kvbench's kernels only (e.g. 0,4096 at --context 8192,16384,32768)."
        ),
    ] = "0",
    softcap: Annotated[
        str,
        typer.Option(
            help="Score caps (Gemma 2's c x tanh(s / c)), comma separated (0: none); each cell runs at "
            "each, caps on kvbench's kernels only (e.g. 0,50: Gemma 2's attention layers)."
        ),
    ] = "0",
    mla: Annotated[
        bool,
        typer.Option(
            help="Also time DeepSeek-V2-Lite's MLA decode (16 heads over one latent 512 + rope 64 vector "
            "per token, --dtype) on kvbench's paged and contiguous kernels at each batch, context and "
            "block size, beside the K/V cells."
        ),
    ] = False,
    repeats: Annotated[int, typer.Option(help="Timed calls per cell and backend (median reported).")] = 50,
    warmup: Annotated[int, typer.Option(help="Untimed calls before timing.")] = 5,
    backends: Annotated[
        str | None, typer.Option(help=f"Comma list from {', '.join(_BACKENDS)} (default: all available).")
    ] = None,
    max_gib: Annotated[float, typer.Option(help="Skip cells whose inputs need more device memory.")] = 64.0,
    seed: Annotated[int, typer.Option(help="Seed of lengths, page order and inputs.")] = 0,
    out: Annotated[
        Path, typer.Option(help="Folder for kernels.csv, bandwidth.json, env.json, plots.")
    ] = Path("runs/kernels"),
    device: Annotated[str, typer.Option(help="CUDA device: cuda or cuda:N.")] = "cuda",
) -> None:
    """Time decode attention (paged, contiguous, SDPA, FlexAttention, FlashInfer) on a grid of shapes."""
    cpu = os.environ.get("TRITON_INTERPRET") == "1"
    ignored = [f"--{name}" for name in ("batch", "context") if cells and opt.given(ctx, name)]
    if ignored:  # --cells names every (batch, context) pair: the grid flags would be dropped
        raise KvbenchError(f"--cells gives the exact BATCHxCONTEXT pairs: drop {' and '.join(ignored)}")
    pairs = cell_pairs(cells) if cells else [
        (b, c) for b in positive_ints("--batch", batch) for c in positive_ints("--context", context)
    ]  # fmt: skip
    block_sizes = powers_of_two("--block-size", block_size, 1, 256)
    gqas = powers_of_two("--gqa", gqa, 1, 16)
    windows = window_sizes(window)
    caps = softcaps(softcap)
    positive_ints("--kv-heads", str(kv_heads))
    powers_of_two("--head-dim", str(head_dim), 16, 256)
    if dtype not in _DTYPES:
        raise KvbenchError(f"--dtype: {dtype!r} is not one of {', '.join(_DTYPES)}")
    # --repeats, --warmup, --max-gib, --kv-heads, --seed: their ranges are kvbench.flag_ranges'
    names = backend_names(backends, cpu)
    if mla and not {"kvbench-paged", "kvbench-contiguous"} & set(names):
        raise KvbenchError("--mla: MLA runs on kvbench-paged and kvbench-contiguous; --backends has neither")
    if not cpu and not re.fullmatch(r"cuda(:[0-9]{1,3})?", device):
        raise KvbenchError(f"--device: {device!r} is not cuda or cuda:N (CPU runs need TRITON_INTERPRET=1)")

    prepare_out(out, "kernels")  # before torch is imported: a bad --out costs no start-up
    import torch

    from kernels import bench
    from kvbench.report.kernel_plot import plot_all

    if cpu:
        typer.echo("TRITON_INTERPRET=1: a CPU smoke run in the Triton interpreter; CPU timings mean nothing.")
        if dtype == "bfloat16":
            typer.echo("note: Triton's interpreter computes bf16 tl.dot wrongly; use --dtype float16 here")
        skipped = [n for n in names if n not in _CPU_BACKENDS]
        if skipped:
            typer.echo(f"not on the CPU: {', '.join(skipped)}")
        names, device = tuple(n for n in names if n in _CPU_BACKENDS), "cpu"
    elif not torch.cuda.is_available():
        raise KvbenchError(
            "kvbench kernels needs a CUDA device (torch.cuda.is_available() is False; "
            "TRITON_INTERPRET=1 runs a CPU smoke test)"
        )
    elif ":" in device and int(device.split(":")[1]) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise KvbenchError(
            f"--device {device}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        )
    if not cpu and any(n.startswith("flashinfer") for n in names) and not _importable("flashinfer"):
        typer.echo("flashinfer not importable: its columns are absent")
        names = tuple(n for n in names if not n.startswith("flashinfer"))
    grid = bench.grid(
        pairs, block_sizes, gqas, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, ragged=ragged,
        windows=windows, mla=mla, softcaps=caps,
    )  # fmt: skip
    config = bench.BenchConfig(
        cells=grid, backends=names, device=device, repeats=repeats, warmup=warmup, seed=seed, max_gib=max_gib
    )
    typer.echo(f"{len(grid)} cells x {len(names)} backends ({', '.join(names)})")
    rows = bench.run_benchmark(config, out, log=typer.echo)
    typer.echo("\n" + bench.format_table(rows))
    try:
        paths = plot_all(out / "kernels.csv", out)
    except KvbenchError as error:  # the measurements are saved; a plot problem must not hide them
        typer.echo(f"plots skipped: {error}")
        paths = []
    typer.echo(
        f"\nresults: {out / 'kernels.csv'}, {out / 'bandwidth.json'}" + "".join(f", {p}" for p in paths)
    )


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except Exception:
        return False
    return True
