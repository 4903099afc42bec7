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

With `--long` the setting is long-context instead, where window layers matter most (a 1,024-token
window against prompts of 12K tokens on average and up to 126K): Gemma 3 12B with the KV budget
an H200 leaves it beside the weights (`emulate_gpu="h200-141gb"`, no fixed budget), on Mooncake's
conversation trace (`mooncake-conv`) replayed at its own timestamps, whole or its first
`--window-duration` seconds. One replay (no seed varies it), so no interval. Requests longer
than the model's 131,072-token context are dropped and counted (`max_total_len`; without it a
run refuses the trace, naming the first one); the header says how many (none in this trace). A
fifth row runs paged with 8 times the budget: what more memory alone would buy.

    python benchmarks/hybrid_occupancy.py --long [--window-duration 30] [--out table-long.md]

With `--real SWEEP` (repeatable: `kvbench sweep --real` folders of these engines on one model)
the rows are the real cells' summaries instead, grouped by trace and engine over their seeds,
and every cell is also simulated from its own config.json on the H200 cost model, so the table
shows what the simulator predicts for exactly the runs measured. A (trace, engine) with fewer
than 3 finished cells says so in its `runs` column.

    python benchmarks/hybrid_occupancy.py --real results/reference/hybrid-real/sharegpt-paper \
        --real results/reference/hybrid-real/arxiv-sum --out table.md
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

from kvbench.calibrate.check import read_config
from kvbench.config import RunConfig
from kvbench.metrics.occupancy import CATEGORIES
from kvbench.models import get_model
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


LONG_TRACE = "mooncake-conv"  # its own timestamps: 12,031 requests over 3,537 s
LONG_GPU = "h200-141gb"
MORE_MEMORY = 8  # the counterfactual row: paged with this many times the budget


def cell(engine: str, trace: str, rate: float, seed: int, requests: int) -> dict:
    workload = WorkloadSpec(trace, num_requests=requests, seed=seed, rate=rate)
    config = RunConfig(
        engine=engine, model=MODEL, kv_cache_gib=GIB, emulate_gpu="h200-141gb", workload=workload
    )
    return simulate(config).summary


def long_cell(engine: str, window_s: float | None = None, kv_cache_gib: float | None = None) -> dict:
    """One replay of `LONG_TRACE` (its first `window_s` seconds; None: all of it) with what an
    H200 leaves the model (`kv_cache_gib` None); requests past the context dropped and counted."""
    context = get_model(MODEL).max_len
    workload = WorkloadSpec(LONG_TRACE, window_duration_s=window_s, max_total_len=context)
    config = RunConfig(
        engine=engine, model=MODEL, kv_cache_gib=kv_cache_gib, emulate_gpu=LONG_GPU, workload=workload
    )
    return simulate(config).summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=600)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--real", type=Path, action="append", default=[], help="a real sweep folder")
    parser.add_argument("--long", action="store_true", help="Mooncake's conversations, H200 budget")
    parser.add_argument("--window-duration", type=float, default=None, help="--long: seconds replayed")
    args = parser.parse_args()
    if args.real or args.long:
        text = real_tables(args.real) if args.real else long_tables(args.window_duration)
        print(text)
        if args.out:
            args.out.write_text(text)
        return
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


def long_tables(window_s: float | None) -> str:
    """Every engine on one replay of the long-context trace, then paged with `MORE_MEMORY` times
    its budget; the same columns as the short traces' tables (one run each: no interval)."""
    runs = {engine: long_cell(engine, window_s) for engine in ENGINES}
    first = runs["paged"]
    more = f"paged, {MORE_MEMORY}x the budget"
    runs[more] = long_cell("paged", window_s, MORE_MEMORY * first["kv_budget_bytes"] / 2**30)
    span = "whole" if window_s is None else f"its first {window_s:g} s"
    lines = [
        f"{MODEL}, {first['kv_budget_bytes'] / 2**30:.2f} GiB of KV ({first['num_slots']:,} slots;"
        f" {first['kv_budget_source']}), H200 cost model; {LONG_TRACE} replayed {span} at its own"
        f" timestamps: {first['num_requests']:,} requests ({first['dropped_requests']} of the trace's"
        f" {first['dropped_of']:,} dropped as longer than {first['dropped_longer_than']:,} tokens)."
        " One replay, so no interval. `saturated %`: the share of busy time during which a request"
        " waited; `behind window %` busy-weighted.",
        "",
        "| engine | requests done | batched req. | req/s | output tok/s | behind window % | saturated %"
        " | preemptions | mean TTFT s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for engine, r in runs.items():
        values = [
            f"{r['completed']:,}",
            f"{r['mean_batched_requests']:.1f}",
            f"{r['request_throughput']:.3f}",
            f"{r['output_token_throughput']:.0f}",
            f"{100 * r['occupancy']['outside_window']:.1f}",
            f"{100 * r['saturated_s'] / r['busy_s']:.1f}",
            f"{r['num_preemptions']}",
            f"{r['mean_ttft_s']:.0f}",
        ]
        lines.append(f"| {engine} | " + " | ".join(values) + " |")
    parts = ["\n".join(lines)]
    for key, weighting in WEIGHTINGS.items():
        lines = [f"Occupancy {weighting} (`{key}`), one run:", ""]
        lines += [
            "| engine | " + " | ".join(f"{c} %" for c in COLUMNS) + " |",
            "|" + "---|" * (1 + len(COLUMNS)),
        ]
        for engine, r in runs.items():  # a run that never saturated has no such share: NaN
            values = [f"{100 * (r[key] or {}).get(c, math.nan):.1f}" for c in COLUMNS]
            lines.append(f"| {engine} | " + " | ".join(values) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def real_tables(sweeps: list[Path]) -> str:
    """The real cells of `sweeps` by (trace, engine), beside the simulator on the same configs."""
    runs: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for folder in sweeps:
        for summary in sorted((folder / "cells").glob("*/summary.json")):
            config = replace(read_config(summary.parent), emulate_gpu="h200-141gb", device="cpu")
            real = json.loads(summary.read_text()) | {"workload_seed": config.workload.seed}
            simulated = simulate(config).summary
            runs.setdefault((real["trace"], real["engine"]), []).append((real, simulated))
    sat = "occupancy_saturated"
    lines = [
        "Real cells (bf16, random weights, one H200), mean ± 95 % CI over the runs; `sim` is the"
        " simulator (H200 cost model) on each cell's own config. Saturated-weighted: over the steps"
        " during which a request waited.",
        "",
        "| trace | engine | runs | batched req. (sat.) | sim | token states % (sat.) | sim"
        " | behind window % (sat.) | req/s | sim | output tok/s | preemptions |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (trace, engine), cells in sorted(runs.items(), key=lambda item: _order(*item[0])):
        real = [r for r, _ in cells]
        sim = [s for _, s in cells]
        values = [
            f"{len(cells)}" + ("" if len(cells) > 1 else " (one run)"),
            _ci([r["mean_batched_requests_saturated"] or math.nan for r in real]),
            _ci([s["mean_batched_requests_saturated"] or math.nan for s in sim]),
            _ci([100 * (r[sat] or {}).get("token_states", math.nan) for r in real]),
            _ci([100 * (s[sat] or {}).get("token_states", math.nan) for s in sim]),
            _ci([100 * (r[sat] or {}).get("outside_window", math.nan) for r in real]),
            _ci([r["request_throughput"] for r in real], 2),
            _ci([s["request_throughput"] for s in sim], 2),
            _ci([r["output_token_throughput"] for r in real], 0),
            _ci([r["num_preemptions"] for r in real]),
        ]
        requests = real[0]["num_requests"]
        lines.append(f"| {trace} ({requests} req.) | {engine} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n\n" + _paired_ratios(runs) + "\n"


def _paired_ratios(runs: dict[tuple[str, str], list[tuple[dict, dict]]]) -> str:
    """Each engine over paged, seed by seed (the same trace draw and arrivals), then mean ± CI:
    the seeds' own spread cancels in the ratio."""
    lines = [
        "Over paged, paired by seed (mean ± 95 % CI of the per-seed ratios):",
        "",
        "| trace | engine | seeds | batched req. (sat.) | req/s | mean step s | sim req/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for (trace, engine), cells in sorted(runs.items(), key=lambda item: _order(*item[0])):
        paged = {r["workload_seed"]: (r, s) for r, s in runs.get((trace, "paged"), [])}
        pairs = [(r, s, *paged[r["workload_seed"]]) for r, s in cells if r["workload_seed"] in paged]
        if engine == "paged" or not pairs:
            continue
        values = [
            str(len(pairs)),
            _ci(
                [
                    a["mean_batched_requests_saturated"] / b["mean_batched_requests_saturated"]
                    for a, _, b, _ in pairs
                ],
                2,
            ),
            _ci([a["request_throughput"] / b["request_throughput"] for a, _, b, _ in pairs], 3),
            _ci([_step_s(a) / _step_s(b) for a, _, b, _ in pairs], 3),
            _ci([s["request_throughput"] / t["request_throughput"] for _, s, _, t in pairs], 3),
        ]
        lines.append(f"| {trace} | {engine} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def _step_s(summary: dict) -> float:
    return summary["busy_s"] / summary["num_steps"]


def _order(trace: str, engine: str) -> tuple[int, int]:
    traces = [t for t, _ in TRACES]  # the benchmark's traces and engines first, others after
    order = traces.index(trace) if trace in traces else len(traces)
    return order, ENGINES.index(engine) if engine in ENGINES else len(ENGINES)


def _ci(values: list[float], digits: int = 1) -> str:
    mean, half = mean_ci95(values)
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


if __name__ == "__main__":
    main()
