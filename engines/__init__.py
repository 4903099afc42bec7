"""Engines by name: each is an allocator x a scheduler, nothing else (DESIGN.md, principle 1).

| engine        | allocator                               | scheduler        |
|---------------|-----------------------------------------|------------------|
| static        | contiguous, max length                  | request-level    |
| orca-max      | contiguous (buddy), max length          | iteration-level  |
| orca-pow2     | contiguous (buddy), next power of two   | iteration-level  |
| orca-oracle   | contiguous (buddy), exact true length   | iteration-level  |
| paged         | blocks, block tables, ref counts        | iteration-level  |
| paged-static  | blocks (ablation)                       | request-level    |
| paged-prefix  | blocks + prefix cache (beyond paper)    | iteration-level  |
| vmm           | virtual ranges, pages mapped on demand  | iteration-level  |
| hybrid        | per-KV-group blocks, equal-byte pages   | iteration-level  |
| jenga         | per-KV-group blocks, LCM pages shared   | iteration-level  |
| hybrid-prefix | hybrid + a prefix cache per KV group    | iteration-level  |
| jenga-prefix  | jenga + a prefix cache per KV group     | iteration-level  |

`paged-prefix` is vLLM with automatic prefix caching: requests share computed prompt blocks
by content (shared prefixes, Mooncake block hashes, earlier chat turns); `paged` is the
paper's vLLM, which computes and stores every prompt itself, as the contiguous engines do.
`vmm` is vAttention (ASPLOS 2025): each request's K/V contiguous in a virtual range, physical
pages mapped under it as it grows and kept mapped for reuse when it finishes.
`hybrid` (vLLM v1) and `jenga` (SOSP 2025) keep a block table per KV group of a model with
sliding-window layers and free blocks that leave the window (`engines.hybrid`, docs/HYBRID.md);
`paged` on such a model is the baseline that treats window layers as full. `hybrid-prefix` and
`jenga-prefix` add prefix caching to them as vLLM v1 does for such models: each group caches its
prompt blocks, a window group only needing those of its window (`engines.hybrid_prefix`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from engines.allocator import KVAllocator
from engines.arena import BuddyArena, FirstFitArena, SlotArena
from engines.batch import DEFAULT_MAX_NUM_SEQS
from engines.chunked import ChunkedScheduler
from engines.contiguous import (
    ContiguousAllocator,
    MaxReservation,
    OracleReservation,
    Pow2Reservation,
    ReservationPolicy,
)
from engines.hybrid import HybridAllocator, JengaAllocator
from engines.hybrid_prefix import HybridPrefixAllocator, JengaPrefixAllocator
from engines.paged import PagedAllocator
from engines.paged_prefix import PrefixCachingAllocator
from engines.scheduler import IterationScheduler, RequestScheduler, Scheduler, SchedulerConfig
from engines.vmm import VirtualAllocator
from kvbench.errors import KvbenchError
from kvbench.kvspec.layers import KVGroup

ARENAS: dict[str, Callable[[int], SlotArena]] = {"buddy": BuddyArena, "first-fit": FirstFitArena}

# The `EngineOptions` fields a user's flags set that only some engines read (`EngineSpec.reads`):
# a flag no engine of a run reads would be ignored while config.json recorded it as if it had
# shaped the run, so the CLI refuses it (`kvbench.cli.options.refuse_unread_engine_flags`)
FIT = "contiguous_fit"  # contiguous engines' arena: buddy or first-fit
BLOCKS = "block_size"  # block-table engines' slots per block
WATERMARK = "watermark"  # free memory kept at admission
SWAP = "host_blocks"  # host memory that preempted sequences' blocks are swapped to
PAGES = "page_tokens"  # the vmm engine's virtual arena: its layout, page size and mapping


@dataclass(frozen=True)
class EngineOptions:
    """Everything an engine is built from; the same for every engine of a comparison."""

    num_slots: int  # KV arena size, from the byte budget
    max_len: int  # model maximum length: what `max` reservations take
    block_size: int = 16  # paged engines: slots per block (vLLM's default)
    contiguous_fit: str = "buddy"  # contiguous engines: "buddy" (the paper's Orca) or "first-fit"
    watermark: float = 0.01  # paged engines: fraction of blocks kept free at admission
    host_blocks: int = 0  # paged engines: swap space in host memory, in blocks
    hash_block_size: int | None = None  # prefix caching: tokens per `block_hashes` entry (the trace's)
    page_tokens: int | Fraction = 0  # vmm: slots one physical page holds, maybe a fraction (0: block_size)
    num_pages: int | None = None  # vmm: whole pages the byte budget holds (None: num_slots // page_tokens)
    driver_pages: int = 1  # vmm: driver pages one page maps (per-layer: 2 x layers; layers for MLA)
    kv_groups: tuple[KVGroup, ...] = ()  # hybrid engines: the model's KV groups (none: one full group)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


def _contiguous(policy: Callable[[EngineOptions], ReservationPolicy]):
    def build(options: EngineOptions) -> KVAllocator:
        arena = ARENAS[options.contiguous_fit](options.num_slots)
        return ContiguousAllocator(arena, policy(options))

    return build


def _paged(options: EngineOptions) -> KVAllocator:
    return PagedAllocator(options.num_slots, options.block_size, options.watermark, options.host_blocks)


def _paged_prefix(options: EngineOptions) -> KVAllocator:
    return PrefixCachingAllocator(
        options.num_slots, options.block_size, options.watermark, options.host_blocks, options.hash_block_size
    )


def _vmm(options: EngineOptions) -> KVAllocator:
    page = options.page_tokens or options.block_size
    pages = int(options.num_slots / Fraction(page)) if options.num_pages is None else options.num_pages
    ranges = options.scheduler.max_num_seqs or DEFAULT_MAX_NUM_SEQS  # one per running sequence
    return VirtualAllocator(
        options.num_slots, page, pages, options.max_len, ranges, options.watermark,
        driver_pages=options.driver_pages,
    )  # fmt: skip


def _step_tokens(options: EngineOptions) -> int:
    """Hybrid engines under chunked prefill: the step's token budget, which bounds what a window
    group takes ahead (`HybridAllocator.target_blocks`); 0 when a prompt is prefilled whole."""
    scheduler = options.scheduler
    return (scheduler.max_num_batched_tokens or 0) if scheduler.chunked_prefill else 0


def _hybrid(options: EngineOptions) -> KVAllocator:
    return HybridAllocator(
        options.num_slots, options.block_size, options.kv_groups, options.watermark, _step_tokens(options)
    )


def _jenga(options: EngineOptions) -> KVAllocator:
    return JengaAllocator(
        options.num_slots, options.block_size, options.kv_groups, options.watermark, _step_tokens(options)
    )


def _hybrid_prefix(options: EngineOptions) -> KVAllocator:
    return HybridPrefixAllocator(
        options.num_slots, options.block_size, options.kv_groups, options.watermark, options.hash_block_size,
        _step_tokens(options),
    )  # fmt: skip


def _jenga_prefix(options: EngineOptions) -> KVAllocator:
    return JengaPrefixAllocator(
        options.num_slots, options.block_size, options.kv_groups, options.watermark, options.hash_block_size,
        _step_tokens(options),
    )  # fmt: skip


@dataclass(frozen=True)
class EngineSpec:
    name: str
    summary: str  # one line for --help and reports
    allocator: Callable[[EngineOptions], KVAllocator]
    scheduler: Callable[[KVAllocator, SchedulerConfig], Scheduler]
    reads: frozenset[str]  # of FIT, BLOCKS, WATERMARK, SWAP, PAGES: those its allocator is built from

    def build(self, options: EngineOptions) -> Scheduler:
        scheduler = self.scheduler
        if options.scheduler.chunked_prefill:  # a continuous engine's admission and release, chunked
            if scheduler is not IterationScheduler:
                raise KvbenchError(
                    f"--chunked-prefill: engine {self.name} batches statically; it applies to continuous "
                    "engines only"
                )
            scheduler = ChunkedScheduler
        return scheduler(self.allocator(options), options.scheduler)


_max = _contiguous(lambda o: MaxReservation(o.max_len))
_CONTIGUOUS = frozenset({FIT})  # extents in an arena: no blocks, no watermark, never swapped
_PAGED = frozenset({BLOCKS, WATERMARK, SWAP})
_GROUPED = frozenset({BLOCKS, WATERMARK})  # a block table per KV group; victims are recomputed
ENGINES: dict[str, EngineSpec] = {
    e.name: e
    for e in (
        EngineSpec(
            "static",
            "FasterTransformer-style: static batches, max-length reservations",
            _max,
            RequestScheduler,
            _CONTIGUOUS,
        ),
        EngineSpec(
            "orca-max",
            "Orca: continuous batching, max-length reservations",
            _max,
            IterationScheduler,
            _CONTIGUOUS,
        ),
        EngineSpec(
            "orca-pow2",
            "Orca: continuous batching, power-of-two reservations",
            _contiguous(lambda o: Pow2Reservation(o.max_len)),
            IterationScheduler,
            _CONTIGUOUS,
        ),
        EngineSpec(
            "orca-oracle",
            "Orca: continuous batching, exact-length reservations",
            _contiguous(lambda o: OracleReservation()),
            IterationScheduler,
            _CONTIGUOUS,
        ),
        EngineSpec(
            "paged", "vLLM: continuous batching, paged blocks, preemption", _paged, IterationScheduler, _PAGED
        ),
        EngineSpec(
            "paged-static", "ablation: paged blocks with static batches", _paged, RequestScheduler, _PAGED
        ),
        EngineSpec(
            "paged-prefix",
            "vLLM with prefix caching: computed prompt blocks shared by content, LRU eviction",
            _paged_prefix,
            IterationScheduler,
            _PAGED,
        ),
        EngineSpec(
            "vmm",
            "vAttention: continuous batching, virtual ranges with physical pages mapped on demand",
            _vmm,
            IterationScheduler,
            frozenset({WATERMARK, PAGES}),
        ),
        EngineSpec(
            "hybrid",
            "vLLM v1 hybrid: a block table per KV group, window blocks freed, equal-byte pages",
            _hybrid,
            IterationScheduler,
            _GROUPED,
        ),
        EngineSpec(
            "jenga",
            "Jenga: a block table per KV group, window blocks freed, LCM pages shared by groups",
            _jenga,
            IterationScheduler,
            _GROUPED,
        ),
        EngineSpec(
            "hybrid-prefix",
            "vLLM v1 hybrid with prefix caching: each KV group caches its prompt blocks, windows only theirs",
            _hybrid_prefix,
            IterationScheduler,
            _GROUPED,
        ),
        EngineSpec(
            "jenga-prefix",
            "Jenga with prefix caching: each KV group caches its prompt blocks, windows only theirs",
            _jenga_prefix,
            IterationScheduler,
            _GROUPED,
        ),
    )
}


def get_engine(name: str) -> EngineSpec:
    try:
        return ENGINES[name]
    except KeyError:
        raise KvbenchError(f"unknown --engine {name!r}; choose one of: {', '.join(ENGINES)}") from None
