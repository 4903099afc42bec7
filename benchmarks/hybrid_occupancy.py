"""Allocators for mixed KV layers on Gemma 3 12B: paged (window layers kept whole) beside hybrid
(vLLM v1) and jenga (SOSP 2025), with orca-oracle for scale, in simulation.

Every engine shares the model (gemma-3-12b: 40 window layers of 1,024 tokens, 8 full ones), the
budget (12 GiB), the cost model of an H200, the trace and its seed; each cell runs with 3 seeds
(trace draw and arrivals) and prints the mean and 95 % confidence interval. Occupancy is printed
saturated-weighted (over the steps during which a request waited) and busy-weighted (every
step), with the `outside_window` category: the slots window layers hold for tokens older than their
window (paged and orca-oracle keep every one; hybrid and jenga the older tokens of the block the
window starts in). `behind window %` is that category, busy-weighted. Decode steps are coalesced;
the engine integrates every category exactly over them. The traces are read through
`KVBENCH_TRACE_DIR`.

    python benchmarks/hybrid_occupancy.py [--num-requests 600] [--seeds 0,1,2] [--out table.md]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.metrics.occupancy import CATEGORIES
from kvbench.simulate import simulate
from kvbench.sweep.stats import mean_ci95
from workloads.spec import WorkloadSpec

MODEL = "gemma-3-12b"
GIB = 12.0
TRACES = (("sharegpt-paper", 40.0), ("arxiv-sum", 12.0))  # (trace, req/s): both saturate the 12 GiB
ENGINES = ("paged", "hybrid", "jenga", "orca-oracle")
COLUMNS = tuple(c for c in CATEGORIES if c != "mapped_idle")  # vmm's alone
WEIGHTINGS = {
    "occupancy_saturated": "saturated-weighted: over the steps during which a request waited",
    "occupancy": "busy-weighted: over every step",
}


def cell(engine: str, trace: str, rate: float, seed: int, requests: int) -> dict:
    workload = WorkloadSpec(trace, num_requests=requests, seed=seed, rate=rate)
    config = RunConfig(
        engine=engine, model=MODEL, kv_cache_gib=GIB, emulate_gpu="h200-141gb", workload=workload
    )
    return simulate(config).summary


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
            _ci([100 * r["occupancy"]["outside_window"] for r in cells]),
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
