"""The paper's multi-GPU settings: OPT-66B on 4 GPUs and OPT-175B on 8, split by tensor parallelism.

Random fp16 weights (the preset's seeded ones, cut into shards), the paper's KV budgets
(Table 1: 21 GiB for OPT-66B, 264 GiB for OPT-175B, for the whole model, i.e. 9,557 and
60,074 slots), block size 16, `sharegpt-paper` at the paper's sustained vLLM rate of each
model (Figure 12: 0.94 and 2.38 req/s), through `paged` and `orca-oracle`. One tensor-parallel
group serves every engine of a model (spawned, and its weights drawn, once).

    python benchmarks/tensor_parallel.py --model opt-66b --out results/reference/tensor-parallel
    python benchmarks/tensor_parallel.py --model opt-175b --out results/reference/tensor-parallel
    # a CPU smoke run of the same code:
    python benchmarks/tensor_parallel.py --model tiny-opt --tensor-parallel 2 --device cpu \\
        --dtype float32 --kv-cache-gib 0.01 --trace uniform:prompt=4..40,output=2..20 \\
        --num-requests 16 --rate 10 --collectors none --out /tmp/tp

Each run lands in OUT/<model>-tp<N>/<engine>/ (the usual run files); OUT/<model>-tp<N>/README.md
gets a table of the runs and the command line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.models import get_model
from kvbench.parallel.session import open_session
from kvbench.real.run import resolve_device, resolve_dtype, run_real
from kvbench.simulate import write_result
from workloads.spec import WorkloadSpec

# model -> (GPUs, KV budget in GiB from the paper's Table 1, paged's sustained rate in Figure 12)
SETTINGS = {"opt-66b": (4, 21.0, 0.94), "opt-175b": (8, 264.0, 2.38)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="opt-66b", help="opt-66b, opt-175b, or any preset with the flags below"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--engines", default="paged,orca-oracle")
    parser.add_argument("--tensor-parallel", type=int, help="GPUs (default: the paper's for the model)")
    parser.add_argument("--kv-cache-gib", type=float, help="the whole model's (default: the paper's)")
    parser.add_argument("--rate", type=float, help="requests/s (default: the paper's sustained vLLM rate)")
    parser.add_argument("--trace", default="sharegpt-paper", help="a preset or spec, as kvbench run's")
    parser.add_argument("--num-requests", type=int, default=300)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--collectors", default="torch,nvml,roofline")
    parser.add_argument("--seed", type=int, default=0, help="of the trace, the weights and sampling")
    args = parser.parse_args()
    size, gib, rate = SETTINGS.get(args.model, (None, None, None))
    size, gib, rate = args.tensor_parallel or size, args.kv_cache_gib or gib, args.rate or rate
    if None in (size, gib, rate):
        parser.error(f"--model {args.model}: give --tensor-parallel, --kv-cache-gib and --rate")
    spec = get_model(args.model)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    folder = args.out / f"{args.model}-tp{size}"
    rows = []
    setup = time.perf_counter()
    with open_session(
        args.model, spec, tensor_parallel=size, dtype=dtype, device=device, seed=args.seed
    ) as session:
        setup = time.perf_counter() - setup
        print(f"{args.model} on {size} ranks: shards built in {setup:.1f} s", flush=True)
        for engine in args.engines.split(","):
            workload = WorkloadSpec(args.trace, num_requests=args.num_requests, rate=rate, seed=args.seed)
            config = RunConfig(
                engine=engine, model=args.model, workload=workload, kv_cache_gib=gib, device=args.device,
                dtype=args.dtype, tensor_parallel=size, collectors=args.collectors, weights_seed=args.seed,
            )  # fmt: skip
            start = time.perf_counter()
            result = run_real(config, session=session)
            wall = time.perf_counter() - start
            write_result(result, folder / engine)
            rows.append(_row(engine, result.summary, wall))
            print(rows[-1], flush=True)
    table = [
        "| engine | completed | output tok/s | req/s | batched req. | token states % "
        "| normalized latency s/tok | preemptions | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    (folder / "README.md").write_text(
        f"# {args.model} on {size} ranks, {gib:g} GiB of KV, {args.trace} at {rate:g} req/s\n\n"
        + "\n".join(table)
        + f"\n\nShards built in {setup:.1f} s. Command: `python {' '.join(sys.argv)}`\n"
    )
    print(f"results: {folder}")


def _row(engine: str, s: dict, wall: float) -> str:
    tokens = 100 * s["occupancy"].get("token_states", float("nan"))
    return (
        f"| {engine} | {s['completed']}/{s['num_requests']} | {s['output_token_throughput']:.1f} | "
        f"{s['request_throughput']:.3f} | {s['mean_batched_requests']:.1f} | {tokens:.1f} | "
        f"{s['normalized_latency_s']:.3f} | {s.get('num_preemptions') or 0} | {wall:.0f} |"
    )


if __name__ == "__main__":
    main()
