"""Memory saved by sharing the KV cache: parallel sampling and beam search (the paper's Fig. 15).

For each workload (alpaca-paper, sharegpt-paper) and each sharing pattern (n = 2, 4, 6
parallel samples; beam width k = 2, 4, 6), one run of the paged engine (vLLM) on OPT-13B with
a 12 GiB KV budget measures the paper's quantity: slots saved by sharing over the slots the
sequences would hold without it, time-weighted over the run (`sharing_saved_fraction`). The
paper's number is printed beside each.

By default the runs are simulated: the real allocator and scheduler, a roofline step time,
and (for beams) seeded synthetic candidate scores through the real beam step, so beam savings
depend on that synthetic process. `--real --device cuda` decodes for real instead (the model's
own log-probabilities pick the beams; random weights unless `--model` is a checkpoint folder).

    python benchmarks/sharing_savings.py [--num-requests N] [--out results.csv]
    python benchmarks/sharing_savings.py --real --device cuda --num-requests 200
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.paper import FIG15_SAVED_PCT as PAPER
from kvbench.reproduce.sharing import FIG15_SEQUENCE_RATE as SEQUENCE_RATES
from kvbench.simulate import simulate
from workloads.spec import WorkloadSpec


def rate_of(workload: str, width: int, args: argparse.Namespace) -> float:
    return args.rate or (args.sequence_rate or SEQUENCE_RATES[workload]) / width


def run_cell(workload: str, pattern: str, width: int, args: argparse.Namespace) -> dict:
    """One run; its row of the table."""
    spec = WorkloadSpec(
        workload, num_requests=args.num_requests, seed=args.seed, rate=rate_of(workload, width, args),
        n=width if pattern == "parallel" else 1, beam_width=width if pattern == "beam" else 1,
    )  # fmt: skip
    config = RunConfig(
        engine=args.engine, model=args.model, workload=spec, kv_cache_gib=args.kv_cache_gib,
        block_size=args.block_size, device=args.device, temperature=args.temperature,
    )  # fmt: skip
    start = time.perf_counter()
    if args.real:
        from kvbench.real.run import run_real

        result = run_real(config)
    else:
        result = simulate(config)
    s = result.summary
    return {
        "workload": workload,
        "pattern": pattern,
        "width": width,
        "rate": rate_of(workload, width, args),
        "saved_pct": 100 * s["sharing_saved_fraction"],
        "paper_pct": PAPER[workload, pattern].get(width),
        "saved_saturated_pct": 100 * s["sharing_saved_fraction_saturated"],
        "mean_batched_seqs": s["mean_batched_requests"],
        "preemptions": s["num_preemptions"],
        "mode": s["mode"],
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="alpaca-paper,sharegpt-paper")
    parser.add_argument("--widths", default="2,4,6")
    parser.add_argument("--patterns", default="parallel,beam")
    parser.add_argument("--num-requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=None, help="req/s (default: per workload / width)")
    parser.add_argument(
        "--sequence-rate",
        type=float,
        default=None,
        help="sequences/s, divided by the width into req/s (default: the figure's, per workload)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", default="paged")
    parser.add_argument("--model", default="opt-13b")
    parser.add_argument("--kv-cache-gib", type=float, default=12.0)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--real", action="store_true", help="decode for real (kvbench run)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--temperature", type=float, default=1.0, help="parallel samples (real runs)")
    parser.add_argument("--out", type=Path, default=None, help="write the table as CSV")
    args = parser.parse_args()
    rows = []
    header = f"{'workload':<15} {'pattern':<9} {'width':>5} {'req/s':>6} {'kvbench %':>10} {'paper %':>8} "
    print(header + f"{'batched':>8} {'preempt':>8} {'s':>7}")
    for workload in args.workloads.split(","):
        for pattern in args.patterns.split(","):
            for width in map(int, args.widths.split(",")):
                row = run_cell(workload, pattern, width, args)
                rows.append(row)
                paper = "-" if row["paper_pct"] is None else f"{row['paper_pct']:.1f}"
                print(
                    f"{workload:<15} {pattern:<9} {width:>5} {row['rate']:6.2f} {row['saved_pct']:10.1f} "
                    f"{paper:>8} {row['mean_batched_seqs']:8.1f} {row['preemptions']:8d} "
                    f"{row['seconds']:7.1f}",
                    flush=True,
                )
    if args.out:
        with args.out.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
