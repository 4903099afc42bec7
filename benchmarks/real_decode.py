"""Real decoding through every engine: the reference workload.

Llama architecture (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, vocab
32000; preset `llama-1b-ref`), bf16, random weights; 256 requests all at once with prompt
lengths clip(int(lognormal(log 120, 0.9)), 4, 1024) and output lengths
clip(int(lognormal(log 200, 0.9)), 4, 1024) from numpy.random.default_rng(0) (prompts first).
Prints output tokens/s per engine and checks that every engine produced the same greedy tokens.

    python benchmarks/real_decode.py [--device cuda] [--engines paged,orca-oracle] [--kv-cache-gib 8]
        [--attention auto|triton|torch] [--no-cuda-graphs] [--step-by-step] [--collectors torch,nvml,roofline]

The collectors' cost: `--overhead --collectors torch,nvml,roofline` runs each engine seven times:
one uncounted warm-up run, then without and with them, alternating, three times; it prints the
throughput ratio of the warm runs. `--each` adds each collector alone to the rotation.

Throughput is output tokens over the engine loop's wall time; building the runner (capturing
its CUDA graphs) happens before and is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import numpy as np
import torch

from engines import ENGINES, EngineOptions
from engines.hybrid import group_shapes
from kvbench.cost_model import KvReads
from kvbench.engine import Engine
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.real.collectors import CollectingRunner, build_collectors, parse_collectors
from kvbench.real.model_runner import ModelRunner
from kvbench.requests import Request, Trace


def reference_trace(num: int = 256) -> Trace:
    rng = np.random.default_rng(0)
    prompts = np.clip(rng.lognormal(np.log(120), 0.9, num).astype(int), 4, 1024)
    outputs = np.clip(rng.lognormal(np.log(200), 0.9, num).astype(int), 4, 1024)
    requests = tuple(
        Request(i, 0.0, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    )
    return Trace("reference-256", requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--engines", default="paged,orca-oracle,orca-max,static")
    parser.add_argument("--kv-cache-gib", type=float, default=8.0)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--model", default="llama-1b-ref")
    parser.add_argument("--deterministic", action="store_true", help="torch deterministic algorithms")
    parser.add_argument("--attention", default="auto", help="auto, triton or torch")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--step-by-step", action="store_true", help="one engine call per step")
    parser.add_argument("--collectors", default="none", help="torch,nvml,roofline or none")
    parser.add_argument("--overhead", action="store_true", help="each engine without and with --collectors")
    parser.add_argument("--each", action="store_true", help="--overhead: also each collector alone")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.deterministic:  # needs CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment on CUDA
        torch.use_deterministic_algorithms(True)
    spec = get_model(args.model)
    trace = reference_trace(args.num_requests)
    total_out = sum(r.output_len for r in trace.requests)
    mean_in = np.mean([r.prompt_len for r in trace.requests])
    mean_out = np.mean([r.output_len for r in trace.requests])
    print(f"{len(trace)} requests, mean {mean_in:.0f} in / {mean_out:.0f} out, {total_out} output tokens")
    model = random_model(spec, dtype, device, seed=0)
    num_slots = int(args.kv_cache_gib * 2**30 // spec.kv_bytes_per_token)
    arena = KVArena(spec, num_slots, dtype, device)
    max_len = max(r.kv_len for r in trace.requests) + 1
    collect = parse_collectors(args.collectors)
    bandwidth = None
    if "roofline" in collect:
        from kernels.bandwidth import measure_read_bandwidth

        bandwidth = measure_read_bandwidth(device)
    figures, tokens = {}, {}
    plan = [(engine, ()) for engine in args.engines.split(",")]
    if args.overhead:  # a warm-up run (compilation), then without and with the collectors, three times
        # --each: every collector alone too, so a cost can be pinned on one of them
        kinds = [collect] + ([(name,) for name in collect] if args.each else [])
        plan = [
            (engine, names)
            for engine, _ in plan
            for names in [("warmup",)] + [n for _ in range(3) for kind in kinds for n in ((), kind)]
        ]
    else:
        plan = [(engine, collect) for engine, _ in plan]
    for index, (engine, names) in enumerate(plan):
        sched = ENGINES[engine].build(EngineOptions(num_slots=num_slots, max_len=spec.max_len))
        setup = time.perf_counter()
        runner = ModelRunner(
            model, arena, sched.allocator, max_batch=len(trace), max_len=max_len,
            attention=args.attention, cuda_graphs=not args.no_cuda_graphs,
        )  # fmt: skip
        setup = time.perf_counter() - setup
        collectors = build_collectors(
            tuple(n for n in names if n != "warmup"), device=device,
            weight_bytes=sum(p.nbytes for p in model.parameters()),
            kv_bytes_per_token=spec.kv_bytes_per_token, read_bandwidth=bandwidth,
            reads=KvReads.of(group_shapes(spec.groups)),  # window layers read their window only
        )  # fmt: skip
        driven = CollectingRunner(runner, collectors) if collectors else runner
        start = time.perf_counter()
        run = Engine(sched, driven, coalesce=not args.step_by_step).run(trace)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        steps = [row.duration_s for row in run.steps if row.kind == "decode"]
        decode_steps = sum(row.num_steps for row in run.steps if row.kind == "decode")
        key = engine if engine not in figures else f"{engine}#{index}"
        if names == ("warmup",):
            key = f"{engine}#warmup"
        measured = driven.finish() if collectors else {}
        figures[key] = {
            "collectors": [type(c).__name__ for c in collectors],
            "roofline_efficiency": measured.get("roofline_efficiency"),
            "energy_per_output_token_j": measured.get("energy_j", float("nan")) / total_out,
            "attention": runner.backend,
            "cuda_graphs": runner.cuda_graphs,
            "runner_setup_s": setup,
            "wall_s": wall,
            "output_tokens_per_s": total_out / wall,
            "steps": sum(row.num_steps for row in run.steps),
            "engine_calls": len(run.steps),
            "mean_decode_step_ms": 1e3 * sum(steps) / decode_steps if decode_steps else None,
            "preemptions": sum(s.num_preemptions for s in run.sequences),
            "peak_running": run.peak_running,
        }
        tokens[key] = [s.output_ids for s in run.sequences]
        print(
            key, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures[key].items()})
        )
    if args.overhead:
        for engine in dict.fromkeys(args.engines.split(",")):
            runs = [figures[key] for key in figures if key.split("#")[0] == engine and "warmup" not in key]
            speed = defaultdict(list)  # collectors' class names -> output tokens/s of each run
            for run in runs:
                speed[",".join(run["collectors"])].append(run["output_tokens_per_s"])
            bare = np.mean(speed.pop("", [np.nan]))
            if not speed:
                print(f"{engine}: no collector runs on {device.type}")
            for names, values in speed.items():
                drop = 1 - np.mean(values) / bare
                print(f"{engine}: {names} cost {100 * drop:.2f} % of output tokens/s "
                      f"({bare:.0f} without, {np.mean(values):.0f} with)")  # fmt: skip
    first = next(iter(tokens.values()))
    same = all(t == first for t in tokens.values())
    print(f"greedy tokens identical across engines: {same}")
    for key, toks in tokens.items():
        differ = sum(a != b for a, b in zip(toks, first, strict=True))
        print(f"  {key}: {differ} of {len(first)} requests differ from the first run")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"figures": figures, "identical_tokens": same, "device": str(device),
                       "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
                       "torch": torch.__version__}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
