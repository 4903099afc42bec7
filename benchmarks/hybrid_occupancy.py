"""Allocators for mixed KV layers on Gemma 3 12B: paged (window layers kept whole) beside hybrid
(vLLM v1) and jenga (SOSP 2025), with orca-oracle for scale, in simulation.

Every engine shares the model (gemma-3-12b: 40 window layers of 1,024 tokens, 8 full ones), the
budget (12 GiB), the cost model of an H200, the trace and its seed; each cell runs with 3 seeds
(trace draw and arrivals) and prints the mean and 95 % confidence interval. Occupancy is printed
saturated-weighted (over the steps during which a request waited) and busy-weighted (every
step), beside the share of the arena window layers hold for tokens in blocks wholly behind their
window (`behind window`: measured at every step, before it runs, weighted by its duration; for
orca-oracle: every token behind the window, its reservation being one extent). Runs are step by
step, so that share is exact. The traces are read through `KVBENCH_TRACE_DIR`.

    python benchmarks/hybrid_occupancy.py [--num-requests 600] [--seeds 0,1,2] [--out table.md]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from engines.hybrid import blocks_behind_window, group_shapes
from kvbench.config import RunConfig, prepare
from kvbench.cost_model import CostModelRunner
from kvbench.simulate import execute
from kvbench.sweep.stats import mean_ci95
from workloads.spec import WorkloadSpec

MODEL = "gemma-3-12b"
GIB = 12.0
TRACES = (("sharegpt-paper", 40.0), ("arxiv-sum", 12.0))  # (trace, req/s): both saturate the 12 GiB
ENGINES = ("paged", "hybrid", "jenga", "orca-oracle")
COLUMNS = ("token_states", "reservation", "internal_frag", "allocator_overhead", "external_frag", "free")
WEIGHTINGS = {
    "occupancy_saturated": "saturated-weighted: over the steps during which a request waited",
    "occupancy": "busy-weighted: over every step",
}


class BehindWindow(CostModelRunner):
    """The cost model, integrating the slots window layers hold behind their window over time."""

    def __init__(self, cost, scheduler, shapes, slot_bytes: int) -> None:
        super().__init__(cost)
        self.allocator = scheduler.allocator
        self.shapes, self.slot_bytes = shapes, slot_bytes
        self.slot_seconds = 0.0

    def run(self, batch, max_steps, start_s, until_s):
        result = super().run(batch, max_steps, start_s, until_s)
        self.slot_seconds += self.behind(batch) * float(result.durations.sum())
        return result

    def behind(self, batch) -> float:
        if hasattr(self.allocator, "outside_window_slots"):  # hybrid, jenga: what they still hold
            return self.allocator.outside_window_slots()
        bs = getattr(self.allocator, "block_size", 1)  # a contiguous extent: token by token
        total = 0.0
        for seq in batch.seqs:
            for shape in self.shapes:
                blocks = blocks_behind_window(shape, bs, seq.num_computed)
                total += blocks * bs * shape.bytes_per_token / self.slot_bytes
        return total


def cell(engine: str, trace: str, rate: float, seed: int, requests: int) -> dict:
    workload = WorkloadSpec(trace, num_requests=requests, seed=seed, rate=rate)
    config = RunConfig(
        engine=engine, model=MODEL, kv_cache_gib=GIB, emulate_gpu="h200-141gb", workload=workload
    )
    prepared = prepare(config)
    shapes = group_shapes(prepared.model.groups)
    runners = []

    def make(scheduler):
        runner = BehindWindow(prepared.cost, scheduler, shapes, prepared.model.kv_bytes_per_token)
        runners.append(runner)
        return runner

    summary = execute(config, make, mode="simulated", coalesce=False, prepared=prepared).summary
    busy = summary["busy_s"] * summary["num_slots"]
    summary["behind_window"] = runners[0].slot_seconds / busy
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=600)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {
        (trace, engine): [cell(engine, trace, rate, seed, args.num_requests) for seed in seeds]
        for trace, rate in TRACES
        for engine in ENGINES
    }
    head = "| trace (req/s) | engine | batched req. | req/s | output tok/s | behind window % |"
    lines = [f"{MODEL}, {GIB:g} GiB, H200 cost model; mean ± 95 % CI over seeds {args.seeds}:", "", head]
    lines.append("|---|---|---|---|---|---|")
    rates = dict(TRACES)
    for (trace, engine), cells in runs.items():
        values = [
            _ci([r["mean_batched_requests"] for r in cells]),
            _ci([r["request_throughput"] for r in cells], 2),
            _ci([r["output_token_throughput"] for r in cells], 0),
            _ci([100 * r["behind_window"] for r in cells]),
        ]
        lines.append(f"| {trace} ({rates[trace]:g}) | {engine} | " + " | ".join(values) + " |")
    parts = ["\n".join(lines)]
    for key, weighting in WEIGHTINGS.items():
        head = "| trace | engine | " + " | ".join(f"{c} %" for c in COLUMNS) + " |"
        lines = [
            f"Occupancy {weighting} (`{key}`), mean ± 95 % CI:",
            "",
            head,
            "|" + "---|" * (2 + len(COLUMNS)),
        ]
        for (trace, engine), cells in runs.items():
            # a run that never saturated has no such share: NaN, never another one
            values = [_ci([100 * (r[key] or {}).get(c, math.nan) for r in cells]) for c in COLUMNS]
            lines.append(f"| {trace} | {engine} | " + " | ".join(values) + " |")
        parts.append("\n".join(lines))
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


def _ci(values: list[float], digits: int = 1) -> str:
    mean, half = mean_ci95(values)
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


if __name__ == "__main__":
    main()
