"""`kvbench kernels`: decode attention timed on a grid of shapes, beside other implementations.

The question is what paging costs the attention kernel itself: the same decode step runs
over a paged cache (a block table in random page order, the worst case for locality) and
over the same bytes laid out contiguously (one extent per sequence, no table), beside
PyTorch SDPA, FlexAttention and FlashInfer. Every time is also a fraction of the read
bandwidth measured in the same run, since decode attention is memory-bound: 1.0 would be
reading each KV byte once at the speed of a streaming read.

One cell's memory (S token slots, read by the paged and the contiguous backends alike):

    arena [S, Hkv, D]   paged:      seq b, position p -> table[b, p // bs] * bs + p % bs
                        contiguous: seq b, position p -> starts[b] + p   (back to back)

Several independent copies of q and the arena are cycled while timing so that the L2 cache
(50 MB on an H200) never holds the KV the next call reads.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from kernels.bandwidth import GIB, cpu_read_bandwidth_report, read_bandwidth_report, time_cuda, time_host
from kvbench.results import environment, write_csv, write_json

BACKENDS = (  # every backend, in the order of the CSV; BUILDERS (at the end) builds each
    "kvbench-paged", "kvbench-contiguous", "torch-sdpa", "flex-paged",
    "flashinfer-cuda-cores", "flashinfer-tensor-cores",
)  # fmt: skip
CPU_BACKENDS = ("kvbench-paged", "kvbench-contiguous", "torch-sdpa")  # the interpreter smoke test's
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
ATOL = {"bfloat16": 2e-2, "float16": 5e-3}  # max |out - reference| accepted (N(0, 1) inputs)
L2_DEFAULT = 50 * 10**6  # bytes: an H100/H200's L2, when the device does not say
L2_MULTIPLE = 4  # the cycled copies together hold at least this many L2s of KV ...
MAX_COPIES = 16  # ... with at most this many copies


@dataclass(frozen=True)
class Cell:
    """One point of the grid: a decode step of `batch` sequences of up to `context` tokens."""

    batch: int
    context: int  # every sequence's length, or the top of the uniform draw when ragged
    block_size: int
    kv_heads: int
    gqa: int  # query heads per KV head
    head_dim: int
    dtype: str  # "bfloat16" | "float16"
    ragged: bool = False  # lengths uniform in [1, context] instead of all equal to it

    @property
    def q_heads(self) -> int:
        return self.kv_heads * self.gqa

    @property
    def label(self) -> str:
        return f"B{self.batch} L{self.context} bs{self.block_size} g{self.gqa}"


@dataclass(frozen=True)
class BenchConfig:
    cells: tuple[Cell, ...]
    backends: tuple[str, ...]  # a subset of BACKENDS
    device: str = "cuda"  # "cpu" only for the Triton interpreter smoke test
    repeats: int = 50  # timed calls per (cell, backend); the median is reported
    warmup: int = 5
    seed: int = 0  # with (batch, context), seeds each cell's lengths, page order and inputs
    max_gib: float = 64.0  # cells whose buffers need more device memory are skipped
    bandwidth_gib: float = 2.0  # buffer streamed by the read-bandwidth measurement


@dataclass(frozen=True)
class Row:
    """One line of kernels.csv: one backend on one cell."""

    cell: str
    batch: int
    context: int
    block_size: int
    q_heads: int
    kv_heads: int
    gqa: int
    head_dim: int
    dtype: str
    ragged: bool
    backend: str
    status: str  # ok | wrong (error above atol) | failed | skipped
    us: float  # median of the timed calls, microseconds
    us_p10: float
    us_p90: float
    useful_bytes: int  # KV of the real context lengths + q + out
    moved_bytes: int  # what the backend reads and writes, padding and expanded heads included
    gbps: float  # useful_bytes / median time, in 1e9 bytes/s
    bw_fraction: float  # gbps over this run's measured read bandwidth
    vs_contiguous: float  # time / kvbench-contiguous time on this cell (paging's cost when > 1)
    max_abs_err: float  # against kernels.reference.decode_attention_ref
    atol: float
    copies: int  # input copies cycled while timing
    note: str


@dataclass(frozen=True)
class Layout:
    """One cell's addressing, shared by every input copy (the arenas are what differ)."""

    lens: torch.Tensor  # [B] int32 context lengths
    block_tables: torch.Tensor  # [B, max_blocks] int32: a random permutation of the blocks
    starts: torch.Tensor  # [B] int32 extent starts, sequences back to back
    num_slots: int  # S: the whole blocks of every sequence
    block_size: int
    max_len: int


@dataclass(frozen=True)
class Copy:
    """One independent set of inputs."""

    q: torch.Tensor  # [B, Hq, D]
    k: torch.Tensor  # [S, Hkv, D]
    v: torch.Tensor  # [S, Hkv, D]
    out: torch.Tensor  # [B, Hq, D]


@dataclass(frozen=True)
class Context:
    """What every cell of a run shares: the device and what it offers."""

    device: torch.device
    l2_bytes: int
    sdpa_gqa: bool  # SDPA takes enable_gqa (torch 2.5+); otherwise KV heads are expanded
    flex: Callable | None  # torch.compile(flex_attention), when flex-paged runs on CUDA with torch 2.5+
    flashinfer: ModuleType | None

    @classmethod
    def create(cls, device: torch.device, backends: tuple[str, ...]) -> Context:
        l2 = L2_DEFAULT
        if device.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or L2_DEFAULT
        flex = None
        if "flex-paged" in backends and device.type == "cuda":
            try:
                from torch.nn.attention.flex_attention import flex_attention
            except ImportError:  # torch before 2.5: the flex-paged rows say "failed"
                flex_attention = None
            flex = flex_attention and torch.compile(flex_attention, dynamic=False)
        flashinfer = None
        if any(b.startswith("flashinfer") for b in backends):
            try:
                import flashinfer
            except Exception:  # its absence is reported by the CLI; the rows say "failed"
                flashinfer = None
        return cls(device, l2, _sdpa_takes_gqa(device), flex, flashinfer)


@dataclass(frozen=True)
class Built:
    """A backend ready to time on one cell."""

    calls: tuple[Callable[[], torch.Tensor], ...]  # one per copy, each returning out [B, Hq, D]
    addressing: str  # "paged" | "contiguous": the reference its output must match
    moved_bytes: int = 0  # 0: the useful bytes
    note: str = ""


def grid(pairs, block_sizes, gqas, *, kv_heads: int, head_dim: int, dtype: str, ragged: bool):
    """Every (batch, context) pair × block size × GQA ratio, nested in that order."""
    return tuple(
        Cell(b, ctx, bs, kv_heads, g, head_dim, dtype, ragged)
        for b, ctx in pairs
        for bs in block_sizes
        for g in gqas
    )


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
    for i, cell in enumerate(config.cells):
        cell_rows = run_cell(cell, config, context, read_bw)
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
    layout = make_layout(cell, rng, device)
    elt = DTYPES[cell.dtype].itemsize
    qo_bytes = 2 * cell.batch * cell.q_heads * cell.head_dim * elt
    useful = 2 * int(layout.lens.sum()) * cell.kv_heads * cell.head_dim * elt + qo_bytes
    arena_bytes = 2 * layout.num_slots * cell.kv_heads * cell.head_dim * elt
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

    return Copy(
        q=randn(cell.batch, cell.q_heads, cell.head_dim),  # [B, Hq, D]
        k=randn(num_slots, cell.kv_heads, cell.head_dim),  # [S, Hkv, D]
        v=randn(num_slots, cell.kv_heads, cell.head_dim),  # [S, Hkv, D]
        out=randn(cell.batch, cell.q_heads, cell.head_dim),  # [B, Hq, D], overwritten
    )


def _reference(cell: Cell, layout: Layout, copy: Copy, addressing: str) -> torch.Tensor:
    """decode_attention_ref on copy 0, a slice of sequences at a time to bound its memory."""
    from kernels.reference import decode_attention_ref

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
        parts.append(decode_attention_ref(copy.q[rows], copy.k, copy.v, lens, scale=_scale(cell), **where))
    return torch.cat(parts)  # [B, Hq, D]


def _copies(arena_bytes: int, per_copy: int, max_gib: float, l2_bytes: int, device: torch.device) -> int:
    """Copies that together hold L2_MULTIPLE L2s, within the memory cap (0: not even one fits)."""
    want = 1 if device.type == "cpu" else min(MAX_COPIES, math.ceil(L2_MULTIPLE * l2_bytes / arena_bytes))
    return min(max(1, want), int(max_gib * GIB // per_copy))


def _sdpa_extra_bytes(cell: Cell, context: Context, backends: tuple[str, ...]) -> int:
    """SDPA's own cache per copy: padded when ragged, its heads expanded without enable_gqa."""
    expand = cell.gqa > 1 and not context.sdpa_gqa
    if "torch-sdpa" not in backends or not (cell.ragged or expand):
        return 0
    heads = cell.q_heads if expand else cell.kv_heads
    return 2 * cell.batch * cell.context * heads * cell.head_dim * DTYPES[cell.dtype].itemsize


def _row(cell: Cell, backend: str, status: str, **values) -> Row:
    nan = math.nan
    filled = dict(
        us=nan, us_p10=nan, us_p90=nan, gbps=nan, bw_fraction=nan, vs_contiguous=nan, max_abs_err=nan
    )
    filled["note"] = ""
    filled.update(values)
    return Row(
        cell=cell.label, batch=cell.batch, context=cell.context, block_size=cell.block_size,
        q_heads=cell.q_heads, kv_heads=cell.kv_heads, gqa=cell.gqa, head_dim=cell.head_dim,
        dtype=cell.dtype, ragged=cell.ragged, backend=backend, status=status, **filled,
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
            f"{r.vs_contiguous:>9.2f} {r.max_abs_err:>8.1e}" + ("" if r.status == "ok" else "  ABOVE ATOL")
        )
    return "\n".join(lines)


# ---- the backends: each builds one callable per input copy ------------------------------------


def _scale(cell: Cell) -> float:
    return cell.head_dim**-0.5


def _build_kvbench(addressing: str):
    def build(cell: Cell, layout: Layout, inputs: list[Copy], context: Context) -> Built:
        from kernels.decode_attention import decode_attention
        from kernels.splits import choose_num_splits

        if addressing == "paged":
            where = dict(block_tables=layout.block_tables, block_size=cell.block_size)
        else:
            where = dict(starts=layout.starts)
        # the kernel's own choice, made here: left to it, it reads the lengths on the host (a sync)
        splits = choose_num_splits(cell.batch, cell.kv_heads, layout.max_len, context.device)
        run = partial(
            decode_attention, context_lens=layout.lens, scale=_scale(cell), num_splits=splits, **where
        )
        calls = tuple(partial(run, c.q, c.k, c.v, out=c.out) for c in inputs)
        note = f"{splits} KV splits" + ("; random page order" if addressing == "paged" else "")
        return Built(calls, addressing, note=note)

    return build


def _build_sdpa(cell: Cell, layout: Layout, inputs: list[Copy], context: Context) -> Built:
    """SDPA over a padded [B, H, L, D] cache: a view of the contiguous arena unless ragged."""
    length, mask = layout.max_len, None
    if cell.ragged:
        positions = torch.arange(length, device=context.device)  # [L]
        mask = (positions < layout.lens[:, None]).view(cell.batch, 1, 1, length)  # [B, 1, 1, L]: attend
    expand = cell.gqa > 1 and not context.sdpa_gqa
    calls = []
    for c in inputs:
        k, v = _padded(c.k, layout, cell), _padded(c.v, layout, cell)  # [B, Hkv, L, D]
        if expand:
            k, v = k.repeat_interleave(cell.gqa, 1), v.repeat_interleave(cell.gqa, 1)  # [B, Hq, L, D]
        gqa = cell.gqa > 1 and not expand
        calls.append(partial(_sdpa, c.q.unsqueeze(2), k, v, mask, _scale(cell), gqa))  # q [B, Hq, 1, D]
    elt = DTYPES[cell.dtype].itemsize
    kv_bytes = 2 * cell.batch * length * (cell.q_heads if expand else cell.kv_heads) * cell.head_dim * elt
    notes = ["padded to the longest, masked" if cell.ragged else "view of the contiguous arena"]
    notes.append(f"KV heads expanded x{cell.gqa} (no enable_gqa)" if expand else "enable_gqa")
    if context.device.type == "cuda":
        backend = _sdpa_backend(calls[0])
        calls = [partial(_with_sdpa_backend, backend, call) for call in calls]
        notes.append(f"SDPA backend {backend.name.lower()}")
    qo_bytes = 2 * cell.batch * cell.q_heads * cell.head_dim * elt
    return Built(tuple(calls), "contiguous", moved_bytes=kv_bytes + qo_bytes, note="; ".join(notes))


def _padded(t: torch.Tensor, layout: Layout, cell: Cell) -> torch.Tensor:
    """The arena [S, Hkv, D] as [B, Hkv, L, D]: a view when every length is L, else a gather."""
    if not cell.ragged:
        return t[: cell.batch * layout.max_len].view(cell.batch, layout.max_len, *t.shape[1:]).transpose(1, 2)
    slots = layout.starts[:, None].long() + torch.arange(layout.max_len, device=t.device)  # [B, L]
    return t[slots.clamp(max=t.shape[0] - 1)].transpose(1, 2)  # [B, Hkv, L, D]; past a length: masked


def _sdpa(q, k, v, mask, scale: float, gqa: bool) -> torch.Tensor:
    extra = {"enable_gqa": True} if gqa else {}
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **extra)
    return out.squeeze(2)  # [B, Hq, D]


def _sdpa_backend(call: Callable[[], torch.Tensor]):
    """The first SDPA backend that runs this call, in the order flash, efficient, cuDNN, math."""
    from torch.nn.attention import SDPBackend

    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
    for backend in (getattr(SDPBackend, n) for n in names if hasattr(SDPBackend, n)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _with_sdpa_backend(backend, call)
            return backend
        except RuntimeError:
            continue
    raise RuntimeError("no SDPA backend runs this shape")


def _with_sdpa_backend(backend, call: Callable[[], torch.Tensor]) -> torch.Tensor:
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return call()


def _sdpa_takes_gqa(device: torch.device) -> bool:
    q = torch.zeros(1, 2, 1, 16, device=device)  # [B, Hq, 1, D]
    kv = torch.zeros(1, 1, 4, 16, device=device)  # [B, Hkv, L, D]
    try:
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True


def _build_flex(cell: Cell, layout: Layout, inputs: list[Copy], context: Context) -> Built:
    """Compiled FlexAttention reading the paged arena through a block mask made of the table."""
    if context.flex is None:
        raise RuntimeError("flex-paged needs CUDA and torch.nn.attention.flex_attention (torch 2.5+)")
    if cell.block_size < 16:  # found on an H200 with torch 2.11: Triton rejects the kernel's tl.dot
        raise RuntimeError("flex-paged needs blocks of 16+ tokens (its decode kernel's tl.dot needs K >= 16)")
    torch._dynamo.reset()  # a fresh compile per cell: shapes change anyway, and no recompile limit
    block_mask = flex_block_mask(layout, cell.batch)
    run = partial(_flex, context.flex, block_mask=block_mask, scale=_scale(cell), gqa=cell.gqa > 1)
    calls = tuple(partial(run, c.q.unsqueeze(2), _arena_bhsd(c.k), _arena_bhsd(c.v)) for c in inputs)
    return Built(calls, "paged", note="torch.compile(flex_attention), block mask from the block table")


def _arena_bhsd(t: torch.Tensor) -> torch.Tensor:
    return t.permute(1, 0, 2).unsqueeze(0)  # [S, Hkv, D] -> [1, Hkv, S, D], a view; batch broadcast


def _flex(flex, q, k, v, *, block_mask, scale: float, gqa: bool) -> torch.Tensor:
    return flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa).squeeze(2)  # [B, Hq, D]


def flex_block_mask(layout: Layout, batch: int):
    """A FlexAttention BlockMask whose KV blocks are the table's physical blocks, in logical order.

    It is what torch's experimental `PagedAttention.convert_logical_block_mask` makes, built
    straight from our table without that class's [B, n_pages] tables: a sequence's whole
    blocks are "full" blocks (no mask evaluated on them), its partly filled last block is a
    masked one, and the mask maps a physical slot back to (sequence, position) through two
    [n_blocks] maps, so it is also right where FlexAttention applies it everywhere (eager).
    """
    from torch.nn.attention.flex_attention import BlockMask

    bs, table, lens = layout.block_size, layout.block_tables, layout.lens
    width = table.shape[1]
    blocks = (lens + bs - 1) // bs  # [B]
    held = torch.arange(width, device=lens.device)[None, :] < blocks[:, None]  # [B, max_blocks]
    physical = table[held].long()  # [sum blocks]
    owner = torch.full((layout.num_slots // bs,), -1, dtype=torch.int32, device=lens.device)  # [n_blocks]
    logical = torch.zeros_like(owner)  # [n_blocks]: the block's index in its sequence
    owner[physical] = held.nonzero()[:, 0].int()
    logical[physical] = held.nonzero()[:, 1].int()
    full = (lens // bs).int()  # [B] blocks attended in full
    partly = (lens % bs != 0).int()  # [B] 1 when the last block is partly filled
    # the partly filled block, first in a list as wide as the full one: the decode kernel
    # finds a sequence's row in both lists with the partial list's strides
    last = torch.zeros_like(table)  # [B, max_blocks]
    last[:, 0] = table.gather(1, full.clamp(max=width - 1).long()[:, None])[:, 0]

    def mask_mod(b, h, q_idx, kv_idx):
        block = kv_idx // bs
        return (owner[block] == b) & (logical[block] * bs + kv_idx % bs < lens[b])

    return BlockMask.from_kv_blocks(
        partly.view(batch, 1, 1), last.view(batch, 1, 1, width),
        full.view(batch, 1, 1), table.view(batch, 1, 1, width).contiguous(),
        BLOCK_SIZE=(128, bs), mask_mod=mask_mod, seq_lengths=(1, layout.num_slots), compute_q_blocks=False,
    )  # fmt: skip


def _build_flashinfer(tensor_cores: bool):
    def build(cell: Cell, layout: Layout, inputs: list[Copy], context: Context) -> Built:
        if context.flashinfer is None:
            raise RuntimeError("flashinfer is not importable")
        bs, dtype = cell.block_size, DTYPES[cell.dtype]
        blocks = (layout.lens + bs - 1) // bs  # [B]
        indptr = torch.nn.functional.pad(blocks.cumsum(0), (1, 0)).int()  # [B + 1]
        held = torch.arange(layout.block_tables.shape[1], device=context.device)[None, :] < blocks[:, None]
        indices = layout.block_tables[held].int()  # [sum blocks], each sequence's in logical order
        last_page_len = (layout.lens - (blocks - 1) * bs).int()  # [B], in [1, bs]
        workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=context.device)
        wrapper = context.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=tensor_cores
        )
        wrapper.plan(
            indptr, indices, last_page_len, cell.q_heads, cell.kv_heads, cell.head_dim, bs,
            pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype, sm_scale=_scale(cell),
        )  # fmt: skip
        pages = (layout.num_slots // bs, bs, cell.kv_heads, cell.head_dim)
        calls = tuple(partial(wrapper.run, c.q, (c.k.view(pages), c.v.view(pages))) for c in inputs)
        return Built(calls, "paged", note="NHD pages, random page order")

    return build


BUILDERS = {
    "kvbench-paged": _build_kvbench("paged"),
    "kvbench-contiguous": _build_kvbench("contiguous"),
    "torch-sdpa": _build_sdpa,
    "flex-paged": _build_flex,
    "flashinfer-cuda-cores": _build_flashinfer(tensor_cores=False),
    "flashinfer-tensor-cores": _build_flashinfer(tensor_cores=True),
}
