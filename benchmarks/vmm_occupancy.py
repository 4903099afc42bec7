"""Where vAttention's pages put the memory: vmm (both layouts, 2 MiB and simulated 64 KiB pages)
beside paged and orca-oracle on the same model, budget and traces, in simulation.

Every engine shares the model (OPT-13B), the budget (12 GiB: the paper's 15,728 slots), the
trace and its seed; each cell runs with 3 seeds (trace draw and arrivals) and prints the mean
and 95 % confidence interval. Occupancy is printed twice: saturated-weighted (over the steps
during which a request waited: the paper's Figure 2 setting) and busy-weighted (every step);
batched requests are busy-time means (the paper's Figure 13), at the paper's Figure 13 rates.

    python benchmarks/vmm_occupancy.py [--num-requests 1000] [--seeds 0,1,2] [--out table.md]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.simulate import simulate
from kvbench.sweep.stats import mean_ci95
from workloads.spec import WorkloadSpec

TRACES = {"sharegpt-paper": 2.0, "alpaca-paper": 30.0}  # the paper's Figure 13 rates
SETUPS = (  # (label, engine, RunConfig fields)
    ("paged (16-token blocks)", "paged", {}),
    ("orca-oracle", "orca-oracle", {}),
    ("vmm per-layer 2 MiB", "vmm", {"vmm_layout": "per-layer", "vmm_page_kib": 2048}),
    ("vmm per-request 2 MiB", "vmm", {"vmm_layout": "per-request", "vmm_page_kib": 2048}),
    ("vmm per-layer 64 KiB (simulated)", "vmm", {"vmm_layout": "per-layer", "vmm_page_kib": 64}),
)
COLUMNS = ("token_states", "reservation", "internal_frag", "mapped_idle")
WEIGHTINGS = {
    "occupancy_saturated": "saturated-weighted: over the steps during which a request waited",
    "occupancy": "busy-weighted: over every step",
}


def cell(engine: str, fields: dict, trace: str, rate: float, seed: int, requests: int) -> dict:
    workload = WorkloadSpec(trace, num_requests=requests, seed=seed, rate=rate)
    config = RunConfig(engine=engine, model="opt-13b", kv_cache_gib=12.0, workload=workload, **fields)
    return simulate(config).summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {
        (trace, label): [cell(engine, fields, trace, rate, seed, args.num_requests) for seed in seeds]
        for trace, rate in TRACES.items()
        for label, engine, fields in SETUPS
    }
    parts = []
    for key, weighting in WEIGHTINGS.items():
        head = "| trace | engine | batched req. | " + " | ".join(f"{c} %" for c in COLUMNS) + " |"
        lines = [f"Occupancy {weighting} (`{key}`), mean ± 95 % CI over seeds {args.seeds}:", "", head]
        lines.append("|" + "---|" * (3 + len(COLUMNS)))
        for (trace, label), cells in runs.items():
            values = [_ci([r["mean_batched_requests"] for r in cells])]
            for c in COLUMNS:  # a run that never saturated has no such share: NaN, never another one
                values.append(_ci([100 * (r[key] or {}).get(c, math.nan) for r in cells]))
            lines.append(f"| {trace} | {label} | " + " | ".join(values) + " |")
        parts.append("\n".join(lines))
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


def _ci(values: list[float]) -> str:
    mean, half = mean_ci95(values)
    return f"{mean:.1f} ± {half:.1f}"


if __name__ == "__main__":
    main()
