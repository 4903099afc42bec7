"""Where a real run's time goes: prefill and decode steps, and the host functions behind them.

Runs one engine with real decoding twice: first on another seed's trace (it compiles the Triton
kernels and captures the CUDA graphs, without showing cuBLAS this trace's prefill shapes), then
on the trace under cProfile, which slows host-bound code (compare runs with each other only).
Prints each step kind's mean wall time and token count, then the functions that took the most
time of their own (a GPU wait shows up as the call that synchronises: `tolist`, `item`,
`synchronize`) and the most time with callees.

    python benchmarks/step_profile.py [--model opt-125m] [--kv-cache-gib GIB] [--engine paged]
        [--trace sharegpt-paper] [--num-requests 100] [--rate 160] [--device cuda] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from dataclasses import replace

from kvbench.config import RunConfig
from kvbench.real_run import run_real
from kvbench.reproduce import GPU_SETTINGS
from workloads.spec import WorkloadSpec


def step_table(run) -> list[str]:
    """Mean wall time per step and tokens per step, by kind."""
    lines = []
    for kind in ("prefill", "decode"):
        rows = [row for row in run.steps if row.kind == kind]
        steps = sum(row.num_steps for row in rows)
        if not steps:
            continue
        seconds = sum(row.duration_s for row in rows)
        tokens = sum(row.num_tokens for row in rows)
        lines.append(
            f"{kind:8s} {steps:6d} steps  {1e3 * seconds / steps:7.3f} ms/step  "
            f"{tokens / steps:7.1f} tokens/step  {seconds:6.2f} s"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--kv-cache-gib", type=float, help="default: the reproduce GPU setting's")
    parser.add_argument("--engine", default="paged")
    parser.add_argument("--trace", default="sharegpt-paper")
    parser.add_argument("--num-requests", type=int, default=100)
    parser.add_argument("--rate", type=float, default=160.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    gib = args.kv_cache_gib
    if gib is None:
        if args.model not in GPU_SETTINGS:
            parser.error(f"--kv-cache-gib: no default for {args.model} (known: {', '.join(GPU_SETTINGS)})")
        gib = GPU_SETTINGS[args.model].kv_cache_gib
    workload = WorkloadSpec(args.trace, num_requests=args.num_requests, rate=args.rate, seed=0)
    config = RunConfig(args.engine, model=args.model, workload=workload, kv_cache_gib=gib, device=args.device)
    run_real(replace(config, workload=replace(workload, seed=1)))  # warm-up on other prompts
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    result = run_real(config)
    profiler.disable()
    wall = time.perf_counter() - start
    print(f"{args.engine} on {args.model}, {args.trace} x {args.num_requests} at {args.rate:g} req/s: "
          f"{wall:.2f} s wall (profiled), busy {result.summary['busy_s']:.2f} s")  # fmt: skip
    print("\n".join(step_table(result.run)))
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(args.top)
        body = text.getvalue()
        print(f"\n--- by {key} ---\n" + body[body.find("ncalls") :])


if __name__ == "__main__":
    main()
