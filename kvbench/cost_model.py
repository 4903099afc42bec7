"""Step-time cost model and the runner that simulates with it.

    step time = fixed_s + per_token_s x tokens fed + per_kv_token_s x K/V tokens attended

(a calibrated model may price a prefill step's tokens apart, `per_prefill_token_s`, add
`per_prefill_s` per prefill step, and price the query-key pairs its attention scores,
`per_attention_pair_s` x `KvReads.pairs`, quadratic in a prompt's length; the roofline does
none of these).

A chunked-prefill mixed step (`Batch.chunks`: prompt chunks beside 1-token decode rows) is priced
as a prefill step of all its tokens: a real runner runs it through the prefill path, eagerly,
every row's tokens in one packed batch, so its decode rows are prefill tokens too (no graph
padding, no knee, no per-segment host cost), and its context is each row's length after the
step (a chunk's end, not its prompt's).

Default constants are a roofline of the model on the emulated GPU's datasheet numbers:

- `fixed_s`: every step reads all weights once: weight bytes / HBM bandwidth (a MoE model's
  routed experts apart, below).
- `per_token_s`: each token fed costs 2 FLOPs per parameter it runs: 2 x params / fp16 FLOP/s,
  a MoE model's counting only the routed experts a token runs (`ModelSpec.active_params`).
- `routed_experts_s`, `expert_pick`: a MoE model's routed experts are read by a step only where
  one of its token rows picks them, as a grouped dispatch runs them: reading all of them once
  costs `routed_experts_s`, and a step of r rows pays the share 1 - (1 - pick)^r of it, pick
  being top-k / experts (`expert_reads`). DeepSeek-V2-Lite (6 of 64 a token, 14.4 of its 15.7 B
  parameters routed experts): 9 % at one row, 55 % at 8, 96 % at 32 (`routed_share`: rows
  picking independently and uniformly, an upper bound for a router that favours some). The roofline is
  the grouped dispatch's, kvbench's default on a MoE model; the dense one (`--expert-dispatch
  dense`: every expert over every row) reads and runs every expert each step, which a fit to its
  runs absorbs (pick 1 in a file prices it). A dense model has neither term.
- `per_kv_token_s`: attention reads each context token's K/V: KV bytes per token / bandwidth.

Swap preemption adds `per_swap_block_s` per block copied: a fixed transfer latency (10 µs) plus
the block's bytes over the host link (PCIe 4 x16, 25 GB/s), so small blocks swap slowly (the
paper's Figure 19). Copies inside the arena (paged copy-on-write, a contiguous engine copying a
parent's K/V for a parallel sample or a beam) add `per_copy_slot_s` per slot: its bytes read
and written once. The roofline terms divide by an efficiency (`bandwidth_efficiency` 0.8,
`compute_efficiency` 0.6: what well-tuned kernels reach). For OPT-13B on an A100-40GB a
decode step of 30 sequences at 400 tokens of context models at 32.7 ms (20.7 ms of it
weights). `kvbench calibrate` replaces these constants by ones fitted to real
runs.

A fitted model may charge a decode segment (one call of the runner, k steps) `per_segment_s`
once, on its first step: a real runner's host work per call, which short segments pay often.

A fitted model may bend its decode cost where the GPU does: past `knee_batch` rows a decode
step costs `per_row_above_knee_s` more per row (a convex, roofline-shaped step: weight-bound
below the knee, compute-bound above it; OPT-13B on the H200 measures 9.9 ms at batch 8, 11.8 at
32, 14.9 at 64 and 21.4 at 128, 0.08 ms per row below 32 and 0.10 above). The roofline has
no knee.

The vAttention-style engine (`vmm`) maps and unmaps physical pages through the CUDA driver:
`per_map_page_s` per driver page mapped (map + set access) and `per_unmap_page_s` per page
unmapped, charged for the pages a batch's scheduling mapped (`Batch.mapped_pages`,
`unmapped_pages`) and for those each later step of a decode segment maps as its sequences grow
(`Batch.map_plan`), so a coalesced segment costs what its steps one by one would. The roofline
takes the H200's measured driver costs on 2 MiB pages, a reused handle
(results/reference/vmm-probe: 35.5 us map + set access, 22.3 us unmap, medians); a model built
by hand charges none unless given them.

A real runner on a GPU replays each decode step from a CUDA graph captured for a bucket of
rows (1, 2, 4, then every multiple of 8: `kvbench.real.decode_loop`), so a batch of 9 runs 16
rows through the GEMMs and the sampler. A model fitted to such runs prices decode rows as the
rows the graph runs (`pads_decode`, `graph_rows`), not the batch: fitted on the batch, the
per-row cost of small padded batches (ShareGPT's Figure 2 runs: 1-36 rows) was spread over
fewer rows than ran and overpriced large ones (Alpaca's 60-130 rows, padded by 3 % or less).
OPT-13B on the H200 (results/reference/calibration-opt13b/orca-queueing.md): a decode step of
57 to 64 rows at 60 tokens of context takes 9.58-9.64 ms, one of 65 rows 9.98 ms. The roofline
prices the batch.

`assumed` names the constants of a calibrated model that no run measured (no run swapped, so
the swap cost is the roofline's): verdicts that rest on them say so.

K/V is read per layer group (`KvReads`). `per_kv_token_s` prices one token of *every* layer's
K/V (a slot: `ModelSpec.kv_bytes_per_token`, an MLA layer's latent included), so a model whose
layers all keep every token pays it per context token, as it always did. A sliding-window group
is that price times its share of a slot's bytes, per token it reads: a row whose step feeds t
tokens over a context of c reads min(c, W + t - 1) of them (min(c, W) at decode), not c. Gemma 3
12B (five window layers of 1,024 tokens per full one, 5/6 of a slot's bytes) at 32K tokens of
context reads 1,024 x 5/6 + 32,768 x 1/6 = 6,315 slots' worth per row, a fifth of what pricing
every layer as full says. A fit (`kvbench calibrate`) counts the same tokens: steps.csv's
`kv_tokens_read`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from engines.hybrid import GroupShape
from engines.scheduler import Batch
from kvbench.budget import GpuSpec
from kvbench.models import ModelSpec
from kvbench.runner import StepResult, step_ends

SWAP_LATENCY_S = 10e-6  # per device<->host copy: launch and DMA setup
HOST_LINK_BANDWIDTH = 25e9  # bytes/s, PCIe 4 x16 in practice
# CUDA driver, per 2 MiB page, H200 (results/reference/vmm-probe, medians of 1,000 remaps)
MAP_PAGE_S = 35.5e-6  # cuMemMap + cuMemSetAccess, handle reused
UNMAP_PAGE_S = 22.3e-6  # cuMemUnmap
GRAPH_BUCKET = 8  # decode graphs past 4 rows are captured every 8 rows (kvbench.real.decode_loop)
GRAPH_BATCH_LIMIT = 512  # larger decode batches run eagerly, unpadded (kvbench.real.decode_loop)
DEFAULT_SOURCES = {  # where the roofline's constants come from, for a fit that could not measure one
    "per_swap_block_s": f"roofline: {SWAP_LATENCY_S * 1e6:g} us + a block's bytes at "
    f"{HOST_LINK_BANDWIDTH / 1e9:g} GB/s",
    "per_copy_slot_s": "roofline: a slot's K/V read and written at 0.8 x HBM bandwidth",
    "per_map_page_s": "H200 driver, results/reference/vmm-probe (map + set access, median)",
    "per_unmap_page_s": "H200 driver, results/reference/vmm-probe (unmap, median)",
    "per_prefill_s": "none: 0 (no prefill row to fit)",
    "per_prefill_token_s": "none: decode rows' per-token cost (no prefill row to fit)",
}


@dataclass(frozen=True)
class CostModel:
    fixed_s: float  # per step, whatever its size (weight reads, launches)
    per_token_s: float  # per token fed through the model (matmul FLOPs)
    per_kv_token_s: float  # per token of context attended (K/V reads)
    per_swap_block_s: float = 0.0  # per block copied between device and host (swap preemption)
    per_copy_slot_s: float = 0.0  # per token slot copied inside the arena (forks, copy-on-write)
    per_prefill_s: float = 0.0  # more per prefill step (a real runner's eager launches; 0 in the roofline)
    # per prompt token of a prefill step, where it differs from a decode row's `per_token_s`: a
    # real runner's prefill tokens go through large, efficient GEMMs, while each decode row also
    # pays its share of small GEMMs, sampling over the vocabulary and attention launches (on the
    # H200, OPT-1.3B: about 3 us per prefill token, 12 per decode row); None: `per_token_s`
    per_prefill_token_s: float | None = None
    per_map_page_s: float = 0.0  # vmm: per driver page mapped (map + set access); roofline: MAP_PAGE_S
    per_unmap_page_s: float = 0.0  # vmm: per driver page unmapped; roofline: UNMAP_PAGE_S
    per_row_above_knee_s: float = 0.0  # decode: more per row beyond `knee_batch` rows (a convex step)
    knee_batch: int | None = None  # None: decode cost linear in the batch
    # more per decode segment (one runner call: a steps.csv decode row of k steps), on its first
    # step: the host work a real runner pays once per call (the batch's inputs and block tables,
    # the launch, the sync at its end). OPT-13B on the H200: about 0.6 ms, which a run of short
    # segments (arrivals every few steps, as at Alpaca's rates) pays nearly every step
    per_segment_s: float = 0.0
    # decode rows priced as the CUDA graph's bucket the batch pads to (`graph_rows`): a model
    # fitted to real GPU runs that replay graphs; False (the roofline, CPU runs): the batch
    pads_decode: bool = False
    # per query-key pair a prefill or mixed step's attention scores (`KvReads.pairs`): what makes a
    # long prompt's tokens dearer than a short one's (quadratic attention) and a chunk deep in a
    # prompt dearer than its first; 0 in the roofline and in files fitted before it was recorded
    per_attention_pair_s: float = 0.0
    # MoE: reading every routed expert's weights once, beyond `fixed_s`; a step pays the share its
    # rows pick (`expert_reads`). 0 for a dense model and in fitted files (a fit's `fixed_s` and
    # `per_token_s` hold what its runs' expert reads cost)
    routed_experts_s: float = 0.0
    expert_pick: float = 0.0  # the share of the routed experts one token row picks (top-k / experts)
    assumed: tuple[str, ...] = ()  # fields no run measured (a calibrated model's; see DEFAULT_SOURCES)

    def takes_time(self) -> bool:
        """Whether a step costs anything: with the fixed, per-row, per-context-token and expert-read
        costs all 0, every decode step is free and a simulation's latencies come out 0, which looks
        like a result (a flag or a fit that gives it is refused, never run)."""
        return self.fixed_s + self.per_token_s + self.per_kv_token_s + self.routed_experts_s > 0

    def above_knee(self, rows: int) -> float:
        """The decode step's extra cost for `rows` rows past the knee (0 without one)."""
        if self.knee_batch is None:
            return 0.0
        return self.per_row_above_knee_s * max(rows - self.knee_batch, 0)

    def decode_rows(self, batch: int) -> int:
        """The rows a decode step of `batch` sequences runs: its graph's bucket under `pads_decode`."""
        return graph_rows(batch) if self.pads_decode else batch

    def expert_reads(self, rows: float) -> float:
        """Seconds of routed-expert weight reads in a step of `rows` token rows: each routed
        expert is read when at least one row picks it (`routed_share`)."""
        if not self.routed_experts_s:
            return 0.0
        return self.routed_experts_s * routed_share(self.expert_pick, rows)

    def per_token(self, prefill: bool) -> float:
        """The cost of one token fed in a prefill step (`prefill`) or one decode row."""
        if prefill and self.per_prefill_token_s is not None:
            return self.per_prefill_token_s
        return self.per_token_s

    @classmethod
    def roofline(
        cls,
        model: ModelSpec,
        gpu: GpuSpec,
        block_size: int = 16,
        bandwidth_efficiency: float = 0.8,
        compute_efficiency: float = 0.6,
    ) -> CostModel:
        """The datasheet roofline of `model` on `gpu` (the module docstring gives each term); a MoE
        model's experts as the grouped dispatch runs them, kvbench's default for one."""
        bandwidth = gpu.read_bandwidth * bandwidth_efficiency
        routed = model.routed_expert_params if model.expert_pick else 0  # top-k unknown: all in fixed_s
        return cls(
            fixed_s=(model.num_params - routed) * model.dtype_bytes / bandwidth,
            routed_experts_s=routed * model.dtype_bytes / bandwidth,
            expert_pick=model.expert_pick,
            per_token_s=2 * model.active_params / (gpu.fp16_flops * compute_efficiency),
            per_kv_token_s=model.kv_bytes_per_token / bandwidth,
            per_swap_block_s=SWAP_LATENCY_S + block_size * model.kv_bytes_per_token / HOST_LINK_BANDWIDTH,
            per_copy_slot_s=2 * model.kv_bytes_per_token / bandwidth,
            per_map_page_s=MAP_PAGE_S,
            per_unmap_page_s=UNMAP_PAGE_S,
        )


def routed_share(pick: float, rows: float) -> float:
    """The expected share of a MoE layer's routed experts that `rows` token rows pick between
    them, each row a share `pick` of them, rows independent and uniform: an expert no row picks
    has probability (1 - pick)^rows. For independent rows a router that favours some experts
    reaches fewer distinct ones in expectation, so as a share of weights read it is an upper
    bound of the expected share (not of one step's: rows picking apart reach min(1, rows x pick))."""
    return 1.0 - (1.0 - pick) ** rows


def graph_rows(batch: int) -> int:
    """The rows a decode step of `batch` sequences runs when replayed from a CUDA graph: 1, 2 or
    4, else the next multiple of `GRAPH_BUCKET`; past `GRAPH_BATCH_LIMIT` it runs eagerly, as is.
    The padding rows read no K/V (context 0), so only the per-row term counts them."""
    if batch > GRAPH_BATCH_LIMIT:
        return batch
    if batch <= 4:
        return 1 << max(batch - 1, 0).bit_length()  # 1, 2, 4 (3 -> 4)
    return -(-batch // GRAPH_BUCKET) * GRAPH_BUCKET


@dataclass(frozen=True)
class KvReads:
    """What a step's attention does not read of its rows' contexts: the tokens sliding-window
    layers skip, in slots (tokens of every layer's K/V, so that `per_kv_token_s` keeps its one
    meaning, calibrated or not). The query at position p of a window-W layer reads p - W + 1 .. p,
    so a row with context c whose step feeds t tokens skips max(c - (W + t - 1), 0) of them in
    each window group, each worth the group's share of a slot's bytes. No window groups (OPT,
    Llama, MLA): nothing skipped, and every cost is what it was before groups were priced."""

    windows: tuple[tuple[int, float], ...] = ()  # per window group: (W, its bytes / a slot's)

    @classmethod
    def of(cls, shapes: Seq[GroupShape]) -> KvReads:
        """The window groups of a model's KV group shapes (`engines.hybrid.group_shapes`)."""
        slot = sum(shape.bytes_per_token for shape in shapes)
        return cls(tuple((s.window, s.bytes_per_token / slot) for s in shapes if s.window))

    def pairs(self, batch: Batch) -> float:
        """Query-key pairs a prefill (or mixed) step's attention scores, in slots' worth (each
        layer group weighted by its share of a slot's bytes, as `skipped` is); 0 for a decode
        step. A row feeding t tokens that end at c positions scores t x c - t (t - 1) / 2 pairs
        in a full-attention layer (the query at position p sees p + 1 keys) and, in a window-W
        layer, the sum of min(p + 1, W) over its queries."""
        if not batch.is_prefill:
            return 0.0
        context = np.array(batch.computed_to(), dtype=np.float64)  # [n] c: positions after the step
        fed = context - np.array([seq.num_computed for seq in batch.seqs], dtype=np.float64)  # [n] t
        full = 1.0 - sum(share for _, share in self.windows)
        total = full * float((fed * context - fed * (fed - 1) / 2).sum())
        for window, share in self.windows:
            total += share * float(capped_sum(context - fed + 1, context, window).sum())
        return total

    def skipped(self, batch: Batch, steps: int) -> np.ndarray:
        """Slots of K/V the window layers skip in each of `steps` steps of `batch` (`[steps]`):
        step 0 as scheduled, later steps decodes (one token fed, the context one longer)."""
        skipped = np.zeros(steps)
        if not self.windows:
            return skipped
        context = np.array(batch.computed_to(), dtype=np.int64)  # [n] after step 0 (a chunk's end)
        fed = context - np.array([seq.num_computed for seq in batch.seqs], dtype=np.int64)  # [n]
        later = np.arange(1, steps)  # [k - 1]
        for window, share in self.windows:
            skipped[0] += share * float(np.maximum(context - (window + fed - 1), 0).sum())
            if steps > 1:  # row r skips max(c_r + j - W, 0) at step j: sum over rows by sorted thresholds
                start = np.sort(window - context)  # [n] the step from which each row skips
                past = np.searchsorted(start, later, side="left")  # [k - 1] rows with start < j
                before = np.concatenate(([0], np.cumsum(start)))  # [n + 1]
                skipped[1:] += share * (past * later - before[past])
        return skipped


def capped_sum(low: np.ndarray, high: np.ndarray, cap: int) -> np.ndarray:
    """The sum of min(v, cap) over the integers v in [low, high] for each row (`[n]` each; 0
    where high < low)."""
    top = np.minimum(high, cap)  # [n] the last value under the cap
    below = np.where(top >= low, (low + top) * (top - low + 1) / 2, 0.0)
    above = np.maximum(high - np.maximum(low, cap + 1) + 1, 0.0) * cap
    return below + above


class CostModelRunner:
    """Simulates steps by the cost model: no tensors, many steps per call. `reads` says what
    the model's window layers skip (default: none, every layer reads its whole context).

    `lookahead` (vmm with `--vmm-map ahead`: its `VirtualAllocator`): after each decode segment
    is priced, the allocator reserves the pages the batch reaches in another segment as long
    (`VirtualAllocator.look_ahead`), at the point a real runner does (after the segment is
    launched, its slots allocated ahead), so the simulation makes the real run's allocation
    decisions. Those maps are made while the segment runs: no step pays them, because they are
    in no batch's `mapped_pages` nor in `map_plan`; every page a step does map or unmap
    (admissions, growth past the reservation, a reservation given up to another sequence's
    growth, idle pages reclaimed) is priced inside it, as without mapping ahead."""

    allocates_ahead = False

    def __init__(self, cost: CostModel, reads: KvReads | None = None, *, lookahead=None) -> None:
        self.cost = cost
        self.reads = reads or KvReads()
        self.lookahead = lookahead  # a VirtualAllocator that maps ahead (None: none does)
        if lookahead is not None:
            self.allocates_ahead = True  # its reservations go on top of the segment's growth

    def run(self, batch: Batch, max_steps: int, start_s: float, until_s: float) -> StepResult:
        c = self.cost
        tokens = batch.num_tokens
        context = batch.num_context  # K/V positions attended in step 0, every layer as full
        skipped = self.reads.skipped(batch, max_steps)  # [k] slots the window layers do not read
        swaps = len(batch.swaps)
        n = len(batch.seqs)
        rows = c.decode_rows(n)  # a decode step's rows (its graph's, padded); a prefill's tokens below
        fed = tokens if batch.is_prefill else rows
        # the graph's padding rows are all one token at one position: one more pick between them
        picks = n + (rows > n)
        first = c.fixed_s + c.per_token(batch.is_prefill) * fed + c.per_kv_token_s * context
        first += c.expert_reads(tokens if batch.is_prefill else picks)
        first -= c.per_kv_token_s * skipped[0]
        first += c.per_swap_block_s * swaps
        first += c.per_copy_slot_s * batch.copied_slots
        first += c.per_prefill_s * batch.is_prefill
        first += c.per_map_page_s * batch.mapped_pages + c.per_unmap_page_s * batch.unmapped_pages
        first += 0.0 if batch.is_prefill else c.above_knee(rows) + c.per_segment_s
        if c.per_attention_pair_s:
            first += c.per_attention_pair_s * self.reads.pairs(batch)
        if max_steps == 1:
            return self._ahead(batch, StepResult(np.array([first])))
        # later steps are decodes: one token per sequence, context one longer each step
        growth = c.per_kv_token_s * n * np.arange(max_steps)  # (k,)
        per_step = c.fixed_s + c.per_token_s * rows + c.above_knee(rows) + c.per_kv_token_s * context
        per_step += c.expert_reads(picks)
        durations = per_step + growth
        durations -= c.per_kv_token_s * skipped
        durations[0] = first  # step 0 also pays the swaps, copies and page maps scheduled with it
        if batch.map_plan is not None and c.per_map_page_s:
            durations += c.per_map_page_s * batch.map_plan(max_steps)  # pages later steps map as they grow
        if math.isfinite(until_s):
            ends = step_ends(start_s, durations)  # [k] absolute
            durations = durations[: int(np.searchsorted(ends, until_s)) + 1]
        return self._ahead(batch, StepResult(durations))

    def _ahead(self, batch: Batch, result: StepResult) -> StepResult:
        """Reserve a decode segment's next pages once its length is known (mapping ahead)."""
        if self.lookahead is not None and not batch.is_prefill:
            self.lookahead.look_ahead(batch.seqs, len(result.durations))
        return result
