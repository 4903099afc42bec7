"""The kernel benchmark's data: cells, settings, rows and the inputs each backend is built on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

BACKENDS = (  # every backend, in the order of the CSV; BUILDERS (at the end) builds each
    "kvbench-paged", "kvbench-contiguous", "kvbench-virtual", "torch-sdpa", "flex-paged",
    "flashinfer-cuda-cores", "flashinfer-tensor-cores",
)  # fmt: skip
CPU_BACKENDS = ("kvbench-paged", "kvbench-contiguous", "torch-sdpa")  # the interpreter smoke test's
WINDOW_BACKENDS = ("kvbench-paged", "kvbench-contiguous")  # those that take a sliding window or a score cap
MLA_BACKENDS = ("kvbench-paged", "kvbench-contiguous")  # those that run absorbed MLA (kernels/mla_decode.py)
# DeepSeek-V2-Lite's MLA decode (`deepseek-v2-lite`): 16 query heads over one cached vector per
# token of latent 512 + rope 64, shared by every head
MLA_HEADS, MLA_LATENT, MLA_ROPE = 16, 512, 64
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
    window: int = 0  # sliding window: the query sees its last `window` positions (0: all of them)
    # MLA (absorbed): > 0 is the latent part of the one cached vector per token, head_dim its
    # whole width (latent + rope), kv_heads 1 (every query head reads it) and gqa the query heads
    latent: int = 0
    softcap: float = 0.0  # Gemma 2's score cap: every scaled score s becomes c x tanh(s / c) (0: none)

    @classmethod
    def mla(cls, batch: int, context: int, block_size: int, dtype: str, ragged: bool = False) -> Cell:
        """DeepSeek-V2-Lite's MLA decode at (batch, context): 16 heads over latent 512 + rope 64."""
        return cls(
            batch, context, block_size, 1, MLA_HEADS, MLA_LATENT + MLA_ROPE, dtype, ragged, 0, MLA_LATENT
        )

    @property
    def q_heads(self) -> int:
        return self.kv_heads * self.gqa

    @property
    def out_dim(self) -> int:
        """Values per head of the output: the latent for MLA (its values), else the head dim."""
        return self.latent or self.head_dim

    @property
    def kv_values_per_token(self) -> int:
        """Cached values a token holds per layer: K and V per KV head, or MLA's one vector."""
        return self.head_dim if self.latent else 2 * self.kv_heads * self.head_dim

    def qo_bytes(self, elt: int) -> int:
        """q and out of one step: every query head's query and output, `elt` bytes a value."""
        return self.batch * self.q_heads * (self.head_dim + self.out_dim) * elt

    @property
    def label(self) -> str:
        if self.latent:
            return f"B{self.batch} L{self.context} bs{self.block_size} mla h{self.q_heads}"
        return (
            f"B{self.batch} L{self.context} bs{self.block_size} g{self.gqa}"
            + (f" w{self.window}" if self.window else "")
            + (f" cap{self.softcap:g}" if self.softcap else "")
        )


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
    window: int  # 0: full attention
    softcap: float  # 0: scores uncapped
    latent: int  # MLA: the cached vector's latent part (head_dim is latent + rope); 0: K and V per head
    backend: str
    status: str  # ok | wrong (error above atol) | failed | skipped
    us: float  # median of the timed calls, microseconds
    us_p10: float
    us_p90: float
    useful_bytes: int  # KV of the real context lengths (within the window; MLA: one vector) + q + out
    moved_bytes: int  # what the backend reads and writes, padding and expanded heads included
    gbps: float  # useful_bytes / median time, in 1e9 bytes/s
    bw_fraction: float  # gbps over this run's measured read bandwidth
    vs_contiguous: float  # time / kvbench-contiguous time on this cell (paging's cost when > 1)
    vs_full: float  # a window or capped row: time / the same backend's uncapped full-attention time at
    # this context;
    # an MLA row: time / the same backend's on the grid's first K/V cell of this batch, context, block
    max_abs_err: float  # against kernels.reference.decode_attention_ref (window: the PyTorch window
    # path; MLA: mla_decode_attention_ref)
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
    k: torch.Tensor  # [S, Hkv, D]; MLA: [S, 1, latent + rope], the one cache
    v: torch.Tensor  # [S, Hkv, D]; MLA: the same tensor as k (its latent part is the values)
    out: torch.Tensor  # [B, Hq, D]; MLA: [B, Hq, latent]


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
        return cls(device, l2, sdpa_takes_gqa(device), flex, flashinfer)


@dataclass(frozen=True)
class Built:
    """A backend ready to time on one cell."""

    calls: tuple[Callable[[], torch.Tensor], ...]  # one per copy, each returning out [B, Hq, D]
    addressing: str  # "paged" | "contiguous": the reference its output must match
    moved_bytes: int = 0  # 0: the useful bytes
    note: str = ""


def scale_of(cell: Cell) -> float:
    return cell.head_dim**-0.5


def sdpa_takes_gqa(device: torch.device) -> bool:
    q = torch.zeros(1, 2, 1, 16, device=device)  # [B, Hq, 1, D]
    kv = torch.zeros(1, 1, 4, 16, device=device)  # [B, Hkv, L, D]
    try:
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True
