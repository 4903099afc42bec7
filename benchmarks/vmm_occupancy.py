"""Where vAttention's pages put the memory: vmm (both layouts, 2 MiB and simulated 64 KiB pages)
beside paged and orca-oracle on the same model, budget and traces, in simulation.

Every engine shares the model (OPT-13B), the budget (12 GiB: the paper's 15,728 slots), the
trace and its seed; each cell runs with 3 seeds (trace draw and arrivals) and prints the mean
and 95 % confidence interval. Occupancy is printed twice: saturated-weighted (over the steps
during which a request waited: the paper's Figure 2 setting) and busy-weighted (every step);
batched requests are busy-time means (the paper's Figure 13), at the paper's Figure 13 rates.

`--long` adds a long-context setting where the 2 MiB page is small beside a request: Llama-3.1-8B
(131,072-token context, 128 KiB of KV per token) with the budget an H200 leaves it (`--emulate-gpu
h200-141gb`, 90 % of memory less the weights: 94.6 GiB), on Mooncake's conversation trace
replayed whole and unfiltered at its own timestamps (12,031 requests, prompts up to 126,527
tokens; one replay, no seed to vary) and on arXiv summarization (prompts up to 4K) at 20 req/s.
The traces are read through `KVBENCH_TRACE_DIR` (`kvbench trace fetch` names them).

    python benchmarks/vmm_occupancy.py [--num-requests 1000] [--seeds 0,1,2] [--long] [--out table.md]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.simulate import simulate
from kvbench.sweep.stats import mean_ci95
from workloads.spec import WorkloadSpec


@dataclass(frozen=True)
class Setting:
    """A trace and the model, budget and GPU it is served with."""

    trace: str
    rate: float | None  # None: the trace's own timestamps
    model: str = "opt-13b"
    kv_cache_gib: float | None = 12.0  # None: what `emulate_gpu` leaves beside the weights
    emulate_gpu: str = "a100-40gb"
    replay_whole: bool = False  # every row once (no sample to draw, so one seed)


PAPER = (Setting("sharegpt-paper", 2.0), Setting("alpaca-paper", 30.0))  # the paper's Figure 13 rates
LONG = (
    Setting("mooncake-conv", None, "llama-3.1-8b", None, "h200-141gb", replay_whole=True),
    Setting("arxiv-sum", 20.0, "llama-3.1-8b", None, "h200-141gb"),
)
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


def cell(engine: str, fields: dict, setting: Setting, seed: int, requests: int) -> dict:
    count = None if setting.replay_whole else requests
    workload = WorkloadSpec(setting.trace, num_requests=count, seed=seed, rate=setting.rate)
    config = RunConfig(
        engine=engine, model=setting.model, kv_cache_gib=setting.kv_cache_gib,
        emulate_gpu=setting.emulate_gpu, workload=workload, **fields,
    )  # fmt: skip
    return simulate(config).summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--long", action="store_true", help="add the long-context setting")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = PAPER + (LONG if args.long else ())
    runs = {
        (f"{s.trace} ({s.model})", label): [
            cell(engine, fields, s, seed, args.num_requests)
            for seed in (seeds[:1] if s.replay_whole else seeds)
        ]
        for s in settings
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
