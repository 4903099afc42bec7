"""Simulation speed: a 20,000-request sharegpt-paper trace through every engine.

OPT-13B, a 12 GiB KV budget, Poisson arrivals at 10 req/s (several times what the fastest
engine sustains, so every engine runs saturated). Prints wall time per engine (trace
generation included) and the total; the target is under 30 s in total on a 2-core machine.

    python benchmarks/sim_speed.py [--num-requests N] [--rate R]
"""

from __future__ import annotations

import argparse
import time

from kvbench.config import RunConfig
from kvbench.simulate import simulate
from workloads.spec import WorkloadSpec

ENGINES = ("static", "orca-max", "orca-pow2", "orca-oracle", "paged")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=10.0)
    args = parser.parse_args()
    total = 0.0
    print(f"{'engine':<12} {'seconds':>8} {'steps':>9} {'rows':>7} {'batched':>8} {'preempt':>8}")
    for engine in ENGINES:
        workload = WorkloadSpec(num_requests=args.num_requests, rate=args.rate)
        config = RunConfig(engine=engine, workload=workload, kv_cache_gib=12.0)
        start = time.perf_counter()
        result = simulate(config)
        elapsed = time.perf_counter() - start
        total += elapsed
        s = result.summary
        print(
            f"{engine:<12} {elapsed:8.2f} {s['num_steps']:9d} {len(result.run.steps):7d} "
            f"{s['mean_batched_requests']:8.2f} {s['num_preemptions']:8d}"
        )
    print(f"{'total':<12} {total:8.2f}  ({args.num_requests} requests, rate {args.rate}/s)")


if __name__ == "__main__":
    main()
