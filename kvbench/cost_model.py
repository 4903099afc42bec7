"""Step-time cost model and the runner that simulates with it.

    step time = fixed_s + per_token_s x tokens fed + per_kv_token_s x K/V tokens attended

(a calibrated model may price a prefill step's tokens apart, `per_prefill_token_s`, and add
`per_prefill_s` per prefill step; the roofline does neither).

Default constants are a roofline of the model on the emulated GPU's datasheet numbers:

- `fixed_s`: every step reads all weights once: weight bytes / HBM bandwidth.
- `per_token_s`: each token fed costs 2 FLOPs per parameter: 2 x params / fp16 FLOP/s.
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engines.scheduler import Batch
from kvbench.budget import GpuSpec
from kvbench.models import ModelSpec
from kvbench.runner import StepResult, step_ends

SWAP_LATENCY_S = 10e-6  # per device<->host copy: launch and DMA setup
HOST_LINK_BANDWIDTH = 25e9  # bytes/s, PCIe 4 x16 in practice


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
        bandwidth = gpu.read_bandwidth * bandwidth_efficiency
        return cls(
            fixed_s=model.weight_bytes / bandwidth,
            per_token_s=2 * model.num_params / (gpu.fp16_flops * compute_efficiency),
            per_kv_token_s=model.kv_bytes_per_token / bandwidth,
            per_swap_block_s=SWAP_LATENCY_S + block_size * model.kv_bytes_per_token / HOST_LINK_BANDWIDTH,
            per_copy_slot_s=2 * model.kv_bytes_per_token / bandwidth,
        )


class CostModelRunner:
    """Simulates steps by the cost model: no tensors, many steps per call."""

    allocates_ahead = False

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def run(self, batch: Batch, max_steps: int, start_s: float, until_s: float) -> StepResult:
        c = self.cost
        tokens = batch.num_tokens
        context = batch.num_context  # K/V attended in step 0
        swaps = len(batch.swaps)
        first = c.fixed_s + c.per_token(batch.is_prefill) * tokens + c.per_kv_token_s * context
        first += c.per_swap_block_s * swaps
        first += c.per_copy_slot_s * batch.copied_slots
        first += c.per_prefill_s * batch.is_prefill
        if max_steps == 1:
            return StepResult(np.array([first]))
        # later steps are decodes: one token per sequence, context one longer each step
        n = len(batch.seqs)
        growth = c.per_kv_token_s * n * np.arange(max_steps)  # (k,)
        durations = c.fixed_s + c.per_token_s * n + c.per_kv_token_s * context + growth
        durations[0] = first  # step 0 also pays the swaps and copies scheduled with it
        if math.isfinite(until_s):
            ends = step_ends(start_s, durations)  # [k] absolute
            durations = durations[: int(np.searchsorted(ends, until_s)) + 1]
        return StepResult(durations)
