"""Anchors: kvbench's paged engine beside transformers' generate and continuous batching.

The reference workload (`benchmarks/real_decode.py: reference_trace`:
256 requests at once, `llama-1b-ref`, bf16 on CUDA, random weights, 8 GiB of KV) through
`paged`, `hf-generate` (padded batches of `--hf-batch-size`) and `hf-cb` (transformers'
continuous batching, its cache sized to the same KV budget), each via `kvbench run`'s code path
(`run_real`), so every engine gets the same trace, weights, prompt ids and metrics. Prints a
table and writes it as JSON: output tokens/s (output tokens over the makespan on the run's
clock), mean TTFT and TPOT, the ratio to paged, peak torch memory, and how many requests'
greedy tokens differ from paged's (bf16 kernels differ between the engines, so some may;
in float32 on the CPU none do).

    PYTHONPATH=. python benchmarks/anchors.py --json anchors.json [--out runs/anchors]
    PYTHONPATH=. python benchmarks/anchors.py --device cpu --model tiny-llama --num-requests 8   # smoke test
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.real_decode import reference_trace
from kvbench.config import RunConfig
from kvbench.real.run import run_real
from kvbench.simulate import write_result
from workloads.spec import WorkloadSpec
from workloads.tracefile import write_trace

COLUMNS = ("output_tokens_per_s", "ratio_to_paged", "mean_ttft_s", "mean_tpot_s", "makespan_s", "wall_s")


def run_engine(engine: str, trace_file: Path, args: argparse.Namespace) -> tuple[dict, list[list[int]]]:
    """One engine through `run_real`; its row of the table and its output ids (trace order)."""
    config = RunConfig(
        engine=engine, model=args.model, workload=WorkloadSpec(source=str(trace_file)),
        kv_cache_gib=args.kv_cache_gib, device=args.device, dtype=args.dtype, collectors=args.collectors,
        hf_batch_size=args.hf_batch_size, hf_block_size=args.hf_block_size, hf_memory=args.hf_memory,
        hf_attn=args.hf_attn,
    )  # fmt: skip
    start = time.perf_counter()
    result = run_real(config)
    wall = time.perf_counter() - start
    if args.out:
        write_result(result, Path(args.out) / engine)
    s = result.summary
    row = {
        "output_tokens_per_s": s["output_token_throughput"],
        "mean_ttft_s": s["mean_ttft_s"],
        "mean_tpot_s": s["mean_tpot_s"],
        "makespan_s": s["makespan_s"],
        "wall_s": wall,  # setup included (model build, graph capture, warmup)
        "completed": s["completed"],
        "peak_batched_requests": s["peak_batched_requests"],
        "torch_peak_allocated_bytes": s.get("torch_peak_allocated_bytes"),
        "torch_peak_reserved_bytes": s.get("torch_peak_reserved_bytes"),
        "attention": s.get("attention"),
    }
    return row, [list(seq.output_ids) for seq in result.run.sequences]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA, fp32 on the CPU")
    parser.add_argument("--model", default="llama-1b-ref")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--kv-cache-gib", type=float, help="default: 8 on CUDA, 0.02 on the CPU")
    parser.add_argument("--engines", default="paged,hf-generate,hf-cb")
    parser.add_argument(
        "--collectors", default="none", help="kvbench's collectors for paged (torch,nvml,...)"
    )
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--hf-block-size", type=int, default=None)
    parser.add_argument("--hf-memory", type=float, default=None)
    parser.add_argument("--hf-attn", default="paged|sdpa")
    parser.add_argument("--out", help="also write each engine's results folder under this one")
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args()
    if args.kv_cache_gib is None:
        args.kv_cache_gib = 8.0 if args.device.startswith("cuda") else 0.02
    trace = reference_trace(args.num_requests)
    total_out = sum(r.output_len for r in trace.requests)
    print(f"{len(trace)} requests, {total_out} output tokens, {args.model} on {args.device}")
    rows, tokens = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        trace_file = write_trace(trace, Path(tmp) / "reference.jsonl")
        for engine in args.engines.split(","):
            rows[engine], tokens[engine] = run_engine(engine, trace_file, args)
            print(
                engine,
                json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[engine].items()}),
            )
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    base = rows.get("paged", {}).get("output_tokens_per_s")
    for engine, row in rows.items():
        row["ratio_to_paged"] = row["output_tokens_per_s"] / base if base else None
        if "paged" in tokens:
            differ = sum(a != b for a, b in zip(tokens[engine], tokens["paged"], strict=True))
            row["requests_differing_from_paged"] = differ
    print("\n| engine | " + " | ".join(COLUMNS) + " |\n|---|" + "---:|" * len(COLUMNS))
    for engine, row in rows.items():
        cells = [f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS]
        print(f"| {engine} | " + " | ".join(cells) + " |")
    if args.json:
        import transformers

        gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
        meta = {"num_requests": len(trace), "output_tokens": total_out, "model": args.model, "gpu": gpu}
        meta |= {"device": args.device, "torch": torch.__version__, "transformers": transformers.__version__}
        Path(args.json).write_text(json.dumps({"rows": rows, **meta}, indent=2) + "\n")


if __name__ == "__main__":
    main()
