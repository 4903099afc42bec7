"""`kvbench kernels`: decode attention timed on a grid of shapes, beside other implementations.

The question is what paging costs the attention kernel itself: the same decode step runs
over a paged cache (a block table in random page order, the worst case for locality) and
over the same bytes laid out contiguously (one extent per sequence, no table), beside
PyTorch SDPA, FlexAttention and FlashInfer. Every time is also a fraction of the read
bandwidth measured in the same run, since decode attention is memory-bound: 1.0 would be
reading each KV byte once at the speed of a streaming read. A cell with a sliding window runs
kvbench's kernels only (the others have no window); its useful bytes are the window's, and
`vs_full` is its time over the same backend's full-attention time at the same context (when
the run holds that cell: `--window 0,4096`).

`--mla` adds, after the K/V cells of each (batch, context, block size), a cell of DeepSeek-V2-Lite's
absorbed MLA decode (16 heads over one cached latent 512 + rope 64 vector per token,
`kernels/mla_decode.py`) on kvbench's paged and contiguous addressing. Its useful bytes are
what MLA must read, one such vector per context token, plus q and out; its `vs_full` is its
time over the same backend's on the first K/V cell of the same (batch, context, block size),
by default Llama-3-8B's layer (32 query / 8 KV heads of 128).

One cell's memory (S token slots, read by the paged and the contiguous backends alike):

    arena [S, Hkv, D]   paged:      seq b, position p -> table[b, p // bs] * bs + p % bs
                        contiguous: seq b, position p -> starts[b] + p   (back to back)

Several independent copies of q and the arena are cycled while timing so that the L2 cache
(50 MB on an H200) never holds the KV the next call reads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from kernels.bandwidth import GIB, cpu_read_bandwidth_report, read_bandwidth_report, time_cuda, time_host
from kernels.bench_backends import BUILDERS
from kernels.bench_types import (  # noqa: F401 (BACKENDS, CPU_BACKENDS: this module's public names)
    ATOL,
    BACKENDS,
    CPU_BACKENDS,
    DTYPES,
    L2_MULTIPLE,
    MAX_COPIES,
    MLA_BACKENDS,
    WINDOW_BACKENDS,
    BenchConfig,
    Cell,
    Context,
    Copy,
    Layout,
    Row,
    scale_of,
)  # fmt: skip
from kvbench.results.files import environment, write_csv, write_json


def grid(
    pairs, block_sizes, gqas, *, kv_heads: int, head_dim: int, dtype: str, ragged: bool, windows=(0,),
    mla: bool = False, softcaps=(0.0,),
):  # fmt: skip
    """Every (batch, context) pair × block size × GQA ratio × window × score cap, nested in that
    order (an uncapped full-attention cell, window 0 and cap 0, comes before the cells it is
    compared with); with `mla`, each (batch, context, block size) ends with DeepSeek-V2-Lite's
    MLA cell."""
    cells = []
    for b, ctx in pairs:
        for bs in block_sizes:
            cells += [
                Cell(b, ctx, bs, kv_heads, g, head_dim, dtype, ragged, w, softcap=c)
                for g in gqas
                for w in windows
                for c in softcaps
            ]
            if mla:
                cells.append(Cell.mla(b, ctx, bs, dtype, ragged))
    return tuple(cells)


def run_benchmark(config: BenchConfig, out: Path, log: Callable[[str], None] = print) -> list[Row]:
    """Measure the read bandwidth, then every cell; kernels.csv is rewritten after each cell."""
    device = torch.device(config.device)
    out.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)  # events, streams and Triton launches follow the current device
        bandwidth = read_bandwidth_report(device, int(config.bandwidth_gib * GIB))
    else:
        bandwidth = cpu_read_bandwidth_report()
    read_bw = bandwidth["read_bandwidth_bytes_per_s"]
    log(f"read bandwidth: {read_bw / 1e12:.3f} TB/s ({bandwidth['method']}, {bandwidth['device']})")
    _atomic(out / "bandwidth.json", partial(write_json, data=bandwidth))
    _atomic(out / "env.json", partial(write_json, data=_environment(device)))
    context = Context.create(device, config.backends)
    rows: list[Row] = []
    full: dict[tuple[str, str], float] = {}  # (full-attention cell, backend) -> its median time
    beside: dict[tuple, float] = {}  # (batch, context, block size, backend) -> the first K/V cell's time
    for i, cell in enumerate(config.cells):
        cell_rows = run_cell(cell, config, context, read_bw)
        if cell.window or cell.softcap:
            key = replace(cell, window=0, softcap=0.0).label
            cell_rows = [replace(r, vs_full=r.us / full.get((key, r.backend), math.nan)) for r in cell_rows]
        elif cell.latent:
            where = (cell.batch, cell.context, cell.block_size)
            cell_rows = [
                replace(r, vs_full=r.us / beside.get((*where, r.backend), math.nan)) for r in cell_rows
            ]
        else:
            full |= {(cell.label, r.backend): r.us for r in cell_rows}
            for r in cell_rows:
                beside.setdefault((cell.batch, cell.context, cell.block_size, r.backend), r.us)
        rows += cell_rows
        _atomic(out / "kernels.csv", partial(write_csv, rows=list(rows), row_type=Row))
        timed = [f"{r.backend} {r.us:.1f} us" for r in cell_rows if r.status in ("ok", "wrong")]
        failed = [f"{r.backend} failed" for r in cell_rows if r.status == "failed"]
        log(f"[{i + 1}/{len(config.cells)}] {cell.label}: {', '.join(timed + failed) or cell_rows[0].note}")
    return rows


def run_cell(cell: Cell, config: BenchConfig, context: Context, read_bw: float) -> list[Row]:
    """Every backend of the config on one cell: build, check against the reference, time.

    Lengths and inputs are drawn from (seed, batch, context) alone, so cells that differ only
    in block size or GQA ratio see the same ragged lengths.
    """
    device = context.device
    rng = np.random.default_rng([config.seed, cell.batch, cell.context])
    input_seed = int(rng.integers(2**62))
    elt = DTYPES[cell.dtype].itemsize
    too_big = _skipped_unseen(cell, config, elt)
    if too_big:
        return too_big
    layout = make_layout(cell, rng, device)
    qo_bytes = cell.qo_bytes(elt)
    attended = layout.lens.clamp(max=cell.window) if cell.window else layout.lens  # [B] positions read
    useful = int(attended.sum()) * cell.kv_values_per_token * elt + qo_bytes  # MLA: one vector a token
    arena_bytes = layout.num_slots * cell.kv_values_per_token * elt
    per_copy = arena_bytes + qo_bytes + _sdpa_extra_bytes(cell, context, config.backends)
    copies = _copies(arena_bytes, per_copy, config.max_gib, context.l2_bytes, device)
    base = dict(useful_bytes=useful, moved_bytes=useful, atol=ATOL[cell.dtype], copies=copies)
    if copies == 0:
        note = f"skipped: one input copy needs {per_copy / GIB:.1f} GiB > --max-gib {config.max_gib:g}"
        return [_row(cell, b, "skipped", note=note, **base) for b in config.backends]
    gen = torch.Generator(device=device).manual_seed(input_seed)
    inputs = [_make_copy(cell, layout.num_slots, device, gen) for _ in range(copies)]
    references: dict[str, torch.Tensor] = {}
    try:
        rows = [
            _run_backend(name, cell, layout, inputs, context, config, references, base)
            for name in sorted(config.backends, key=lambda b: b != "kvbench-contiguous")
        ]
    finally:
        del inputs, references
        if device.type == "cuda":
            torch.cuda.empty_cache()
    contiguous = [r.us for r in rows if r.backend == "kvbench-contiguous" and r.status in ("ok", "wrong")]
    rows = [_finish(r, read_bw, contiguous[0] if contiguous else math.nan) for r in rows]
    return sorted(rows, key=lambda r: config.backends.index(r.backend))


def _run_backend(name, cell, layout, inputs, context, config, references, base) -> Row:
    if cell.window and name not in WINDOW_BACKENDS:
        return _row(cell, name, "skipped", note="no sliding window", **base)
    if cell.softcap and name not in WINDOW_BACKENDS:
        return _row(cell, name, "skipped", note="no score cap", **base)
    if cell.latent and name not in MLA_BACKENDS:
        return _row(cell, name, "skipped", note="no MLA (latent) decode", **base)
    try:
        built = BUILDERS[name](cell, layout, inputs, context)
        output = built.calls[0]()  # [B, Hq, D]; also the compile / JIT warm-up
        if built.addressing not in references:
            references[built.addressing] = _reference(cell, layout, inputs[0], built.addressing)
        err = float((output.float() - references[built.addressing].float()).abs().max())
        err = err if math.isfinite(err) else math.inf
        timer = time_cuda if context.device.type == "cuda" else time_host
        seconds = timer(built.calls, warmup=config.warmup, repeats=config.repeats)
    except Exception as error:  # one backend failing on one cell must not end the run
        if context.device.type == "cuda" and isinstance(error, torch.OutOfMemoryError):
            torch.cuda.empty_cache()
        return _row(cell, name, "failed", note=_one_line(error), **base)
    p50, p10, p90 = (float(x) for x in np.percentile(np.array(seconds) * 1e6, [50, 10, 90]))
    status = "ok" if err <= base["atol"] else "wrong"
    values = {**base, "moved_bytes": built.moved_bytes or base["useful_bytes"]}
    return _row(
        cell, name, status, us=p50, us_p10=p10, us_p90=p90, max_abs_err=err, note=built.note, **values
    )


def make_layout(cell: Cell, rng: np.random.Generator, device: torch.device) -> Layout:
    """Lengths, a block table over a random permutation of the blocks, and back-to-back starts."""
    if cell.ragged:
        lens = rng.integers(1, cell.context + 1, size=cell.batch)
    else:
        lens = np.full(cell.batch, cell.context)
    blocks = -(-lens // cell.block_size)  # [B] blocks each sequence holds
    order = rng.permutation(int(blocks.sum()))  # the physical block of each logical block
    table = np.zeros((cell.batch, int(blocks.max())), dtype=np.int32)  # [B, max_blocks], padded with 0
    ends = np.cumsum(blocks)
    for b in range(cell.batch):
        table[b, : blocks[b]] = order[ends[b] - blocks[b] : ends[b]]
    starts = np.cumsum(lens) - lens  # [B]

    def on_device(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)

    num_slots = int(blocks.sum()) * cell.block_size
    return Layout(
        on_device(lens), on_device(table), on_device(starts), num_slots, cell.block_size, int(lens.max())
    )


def _make_copy(cell: Cell, num_slots: int, device: torch.device, gen: torch.Generator) -> Copy:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=DTYPES[cell.dtype])

    if cell.latent:  # one cache of [latent + rope] vectors, read as keys and (its latent) values
        cache = randn(num_slots, 1, cell.head_dim)  # [S, 1, latent + rope]
        q, out = randn(cell.batch, cell.q_heads, cell.head_dim), randn(cell.batch, cell.q_heads, cell.latent)
        return Copy(q=q, k=cache, v=cache, out=out)
    return Copy(
        q=randn(cell.batch, cell.q_heads, cell.head_dim),  # [B, Hq, D]
        k=randn(num_slots, cell.kv_heads, cell.head_dim),  # [S, Hkv, D]
        v=randn(num_slots, cell.kv_heads, cell.head_dim),  # [S, Hkv, D]
        out=randn(cell.batch, cell.q_heads, cell.head_dim),  # [B, Hq, D], overwritten
    )


def _reference(cell: Cell, layout: Layout, copy: Copy, addressing: str) -> torch.Tensor:
    """decode_attention_ref on copy 0, a slice of sequences at a time to bound its memory; a
    window or capped cell: the PyTorch window attention (the path such layers take without the kernels);
    an MLA cell: mla_decode_attention_ref (its float32 vectors are gathered once, not per head)."""
    from kernels.reference import decode_attention_ref
    from kvbench.modeling.window_attention import decode_window_attention

    if cell.latent:  # k is the one cache (v the same tensor)
        attend = partial(_mla_reference, latent=cell.latent)
    elif cell.window or cell.softcap:
        attend = partial(decode_window_attention, window=cell.window, softcap=cell.softcap)
    else:
        attend = decode_attention_ref

    per_token = 2 * cell.q_heads * cell.head_dim * 4  # its float32 K and V, expanded to the query heads
    chunk = max(1, (1 << 31) // (per_token * layout.max_len))  # sequences per call: about 2 GiB of it
    parts = []
    for b0 in range(0, cell.batch, chunk):
        rows = slice(b0, b0 + chunk)
        if addressing == "paged":
            where = dict(block_tables=layout.block_tables[rows], block_size=cell.block_size)
        else:
            where = dict(starts=layout.starts[rows])
        lens = layout.lens[rows]
        parts.append(attend(copy.q[rows], copy.k, copy.v, lens, scale=scale_of(cell), **where))
    return torch.cat(parts)  # [B, Hq, D]


def _mla_reference(q, k, v, lens, *, latent: int, **kwargs) -> torch.Tensor:
    from kernels.reference import mla_decode_attention_ref

    return mla_decode_attention_ref(q, k, lens, latent=latent, **kwargs)


def _skipped_unseen(cell: Cell, config: BenchConfig, elt: int) -> list[Row]:
    """The cell's skipped rows where even its least input copy is over --max-gib, else []."""
    least = _least_copy_bytes(cell, elt)
    if least <= config.max_gib * GIB:
        return []
    note = f"skipped: one input copy needs at least {least / GIB:.1f} GiB > --max-gib {config.max_gib:g}"
    base = dict(useful_bytes=least, moved_bytes=least, atol=ATOL[cell.dtype], copies=0)
    return [_row(cell, b, "skipped", note=note, **base) for b in config.backends]


def _least_copy_bytes(cell: Cell, elt: int) -> int:
    """What one input copy needs at the least, known before the layout is drawn: q and out, the
    block table (padded to the longest sequence, which a ragged draw of a large batch reaches) and,
    where every sequence holds `context` tokens, the whole arena. Drawing the layout of a cell far
    over --max-gib would itself exhaust the host's memory before the copy's size could be checked."""
    blocks = -(-cell.context // cell.block_size)
    arena = 0 if cell.ragged else cell.batch * blocks * cell.block_size * cell.kv_values_per_token * elt
    return cell.qo_bytes(elt) + cell.batch * blocks * 4 + arena


def _copies(arena_bytes: int, per_copy: int, max_gib: float, l2_bytes: int, device: torch.device) -> int:
    """Copies that together hold L2_MULTIPLE L2s, within the memory cap (0: not even one fits)."""
    want = 1 if device.type == "cpu" else min(MAX_COPIES, math.ceil(L2_MULTIPLE * l2_bytes / arena_bytes))
    return min(max(1, want), int(max_gib * GIB // per_copy))


def _sdpa_extra_bytes(cell: Cell, context: Context, backends: tuple[str, ...]) -> int:
    """SDPA's own cache per copy: padded when ragged, its heads expanded without enable_gqa."""
    expand = cell.gqa > 1 and not context.sdpa_gqa
    if "torch-sdpa" not in backends or cell.latent or not (cell.ragged or expand):
        return 0
    heads = cell.q_heads if expand else cell.kv_heads
    return 2 * cell.batch * cell.context * heads * cell.head_dim * DTYPES[cell.dtype].itemsize


def _row(cell: Cell, backend: str, status: str, **values) -> Row:
    nan = math.nan
    filled = dict(
        us=nan, us_p10=nan, us_p90=nan, gbps=nan, bw_fraction=nan, vs_contiguous=nan, vs_full=nan,
        max_abs_err=nan,
    )  # fmt: skip
    filled["note"] = ""
    filled.update(values)
    return Row(
        cell=cell.label, batch=cell.batch, context=cell.context, block_size=cell.block_size,
        q_heads=cell.q_heads, kv_heads=cell.kv_heads, gqa=cell.gqa, head_dim=cell.head_dim,
        dtype=cell.dtype, ragged=cell.ragged, window=cell.window, softcap=cell.softcap, latent=cell.latent,
        backend=backend,
        status=status, **filled,
    )  # fmt: skip


def _finish(row: Row, read_bw: float, contiguous_us: float) -> Row:
    """Add the rates: useful bytes over the median time, and the time against contiguous."""
    if not math.isfinite(row.us):
        return row
    gbps = row.useful_bytes / (row.us * 1e-6) / 1e9
    return replace(row, gbps=gbps, bw_fraction=gbps * 1e9 / read_bw, vs_contiguous=row.us / contiguous_us)


def _one_line(error: BaseException) -> str:
    lines = f"{type(error).__name__}: {error}".strip().splitlines()
    return lines[0][:300]


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary sibling and rename: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def _environment(device: torch.device) -> dict:
    import triton

    env = environment() | {"torch": torch.__version__, "triton": triton.__version__, "device": str(device)}
    if device.type == "cuda":
        env |= {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    try:
        import flashinfer

        env["flashinfer"] = getattr(flashinfer, "__version__", "unknown")
    except Exception:
        env["flashinfer"] = None
    return env


def format_table(rows: list[Row]) -> str:
    """The end-of-run summary: one line per (cell, backend)."""
    head = (
        f"{'cell':<22} {'backend':<24} {'us':>9} {'GB/s':>7} {'of read':>7} {'vs contig':>9} {'max err':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.status in ("skipped", "failed"):
            lines.append(f"{r.cell:<22} {r.backend:<24} {r.status:>9}  {r.note[:100]}")
            continue
        lines.append(
            f"{r.cell:<22} {r.backend:<24} {r.us:>9.1f} {r.gbps:>7.0f} {r.bw_fraction:>7.2f} "
            f"{r.vs_contiguous:>9.2f} {r.max_abs_err:>8.1e}"
            + ("" if r.status == "ok" else "  ABOVE ATOL")
            + (f"  {r.vs_full:.2f} x full attention's time" if r.window or r.softcap else "")
            + (f"  {r.vs_full:.2f} x the K/V cell's time" if r.latent else "")
        )
    return "\n".join(lines)
