"""Decode steps against the roofline, and the host's share of a step, on a GPU.

Part 1 (roofline): OPT-13B fp16 decode steps replayed as CUDA graphs at batch 8/32/64/128,
every sequence at context 512, paged (random block order, block 16) and contiguous. A step
must move the weights once plus the K/V it reads and writes; over the read bandwidth measured
in the same run that is the step's floor, and `efficiency = floor / measured`.

Part 2 (host share): every engine decodes 64 requests (prompt 512, 64 outputs, all at once)
through the real engine loop, in multi-step segments (the default) and one step per engine
call (`--step-by-step`, the worst case). The host's share of a decode step is
`1 - gpu / step`, where `step` is the loop's mean decode-step wall time at batch 64 and `gpu`
the same step replayed back to back with nothing else (mid-run context, 544).

Part 3 (`--profile`): the GPU kernels of eager decode steps at batch 16 (context 512), summed per
step by name: where a small model's step goes (kernel count x launch latency, or the weights).

    python benchmarks/decode_step.py [--model opt-13b] [--json out.json] [--profile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from engines import ENGINES, EngineOptions
from engines.allocator import BlockTable, Extent
from engines.scheduler import SchedulerConfig
from kernels.bandwidth import measure_read_bandwidth, time_cuda
from kvbench.engine import Engine
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.real.decode_loop import DecodeLoop
from kvbench.real.model_runner import ModelRunner
from kvbench.requests import Request, Trace

BLOCK = 16


def step_slots(batch: int, max_len: int) -> int:
    """Slots `gpu_step_s` addresses: `batch` sequences of `max_len` rounded up to whole blocks."""
    return batch * (-(-max_len // BLOCK) * BLOCK)


def gpu_step_s(
    model, arena, batch: int, context: int, paged: bool, max_len: int, repeats: int = 30, graphs: bool = True
) -> float:
    """Median time of one decode step at `batch` x `context` (nothing else), replayed from a CUDA
    graph (`graphs`) or run eagerly.

    The kernels index the arena unchecked, so a smaller arena than `step_slots` is refused here
    rather than read and written past its end."""
    needed = step_slots(batch, max_len)
    if arena.num_slots < needed:
        raise ValueError(f"arena of {arena.num_slots} slots; a {batch} x {max_len} step addresses {needed}")
    loop = DecodeLoop(
        model, arena, max_batch=batch, max_len=max_len, block_size=BLOCK, paged=paged, backend="triton",
        temperature=0.0, seed=0,
    )  # fmt: skip
    if graphs:
        loop.capture([batch])
    per_seq = -(-max_len // BLOCK) * BLOCK
    if paged:  # every sequence's blocks scattered over the arena
        order = np.random.default_rng(0).permutation(batch * per_seq // BLOCK)
        width = per_seq // BLOCK
        addressing = [
            BlockTable(tuple(order[b * width : (b + 1) * width].tolist()), BLOCK) for b in range(batch)
        ]
    else:
        addressing = [Extent(b * per_seq, per_seq, per_seq) for b in range(batch)]
    rng = np.random.default_rng(1)
    loop.load(batch, rng.integers(0, 1000, batch), [context - 1] * batch, list(range(batch)), addressing)

    def step() -> None:
        loop.positions[:batch].fill_(context - 1)  # every replay at the same context
        loop.run_step(batch)

    return statistics.median(time_cuda([step], warmup=3, repeats=repeats))


def roofline(model, arena, spec, bandwidth: float, weight_bytes: int) -> list[dict]:
    rows = []
    context = 512
    for batch in (8, 32, 64, 128):
        kv = spec.kv_bytes_per_token * batch * (context - 1 + 1)  # read context - 1, write 1
        floor = (weight_bytes + kv) / bandwidth
        for paged in (True, False):
            measured = gpu_step_s(model, arena, batch, context, paged, max_len=context + 8)
            rows.append({
                "batch": batch, "context": context, "addressing": "paged" if paged else "contiguous",
                "step_ms": 1e3 * measured, "floor_ms": 1e3 * floor, "efficiency": floor / measured,
            })  # fmt: skip
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()}))
    return rows


def kernel_profile(model, arena, batch: int = 16, context: int = 512, steps: int = 5) -> list[dict]:
    """Kernels of `steps` eager paged decode steps: per-step count and device time, by name."""
    from torch.profiler import ProfilerActivity, profile

    loop = DecodeLoop(
        model, arena, max_batch=batch, max_len=context + 8, block_size=BLOCK, paged=True, backend="triton",
        temperature=0.0, seed=0,
    )  # fmt: skip
    per_seq = -(-(context + 8) // BLOCK)
    addressing = [BlockTable(tuple(range(b * per_seq, (b + 1) * per_seq)), BLOCK) for b in range(batch)]
    loop.load(batch, list(range(batch)), [context - 1] * batch, list(range(batch)), addressing)
    for _ in range(3):  # warm-up: Triton compiles, cuBLAS picks
        loop.positions[:batch].fill_(context - 1)
        loop.run_step(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            loop.positions[:batch].fill_(context - 1)
            loop.run_step(batch)
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        total_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if total_us and event.count:
            rows.append({"kernel": event.key[:90], "per_step": event.count / steps,
                         "us_per_step": total_us / steps})  # fmt: skip
    rows.sort(key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    launches = sum(r["per_step"] for r in rows)
    print(f"eager decode step, batch {batch}, context {context}: {launches:.0f} device ops, "
          f"{total / 1e3:.3f} ms of device time per step")  # fmt: skip
    for row in rows[:25]:
        print(f"  {row['us_per_step']:9.1f} us  x{row['per_step']:5.1f}  {row['kernel']}")
    return rows


def host_share(model, arena, spec, engines: list[str]) -> list[dict]:
    batch, prompt, output = 64, 512, 64
    trace = Trace("host-64", tuple(Request(i, 0.0, prompt, output) for i in range(batch)))
    mid = prompt + output // 2
    gpu = {
        paged: gpu_step_s(model, arena, batch, mid, paged, max_len=prompt + output + 8)
        for paged in (True, False)
    }
    rows = []
    for engine in engines:
        for coalesce in (True, False):
            options = EngineOptions(
                num_slots=arena.num_slots, max_len=spec.max_len, block_size=BLOCK,
                scheduler=SchedulerConfig(max_num_seqs=batch),
            )  # fmt: skip
            sched = ENGINES[engine].build(options)
            runner = ModelRunner(model, arena, sched.allocator, max_batch=batch, max_len=prompt + output + 1)
            start = time.perf_counter()
            run = Engine(sched, runner, coalesce=coalesce).run(trace)
            wall = time.perf_counter() - start
            full = [row for row in run.steps if row.kind == "decode" and row.batch_size == batch]
            steps = sum(row.num_steps for row in full)
            step_s = sum(row.duration_s for row in full) / steps
            floor = gpu[engine.startswith("paged")]
            rows.append({
                "engine": engine, "segments": coalesce, "steps_at_64": steps, "engine_calls": len(full),
                "step_ms": 1e3 * step_s, "gpu_step_ms": 1e3 * floor, "host_share": 1 - floor / step_s,
                "wall_s": wall,
            })  # fmt: skip
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-13b")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--engines", default="static,orca-max,orca-pow2,orca-oracle,paged")
    parser.add_argument("--skip-roofline", action="store_true")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--profile", action="store_true", help="also list an eager step's kernels")
    args = parser.parse_args()
    device = torch.device("cuda")
    spec = get_model(args.model)
    model = random_model(spec, getattr(torch, args.dtype), device, seed=0)
    weight_bytes = sum(p.nbytes for p in model.parameters())
    bandwidth = measure_read_bandwidth(device)
    print(f"{torch.cuda.get_device_name()}: read bandwidth {bandwidth / 1e12:.2f} TB/s; "
          f"{args.model} weights {weight_bytes / 1e9:.1f} GB")  # fmt: skip
    # the largest need: a max-length reservation for each of the 64 requests (orca-max)
    arena = KVArena(spec, 64 * spec.max_len + BLOCK, model.lm_head.weight.dtype, device)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
              "read_bandwidth_Bps": bandwidth, "weight_bytes": weight_bytes}  # fmt: skip
    if not args.skip_roofline:
        result["roofline"] = roofline(model, arena, spec, bandwidth, weight_bytes)
    if args.profile:
        result["profile"] = kernel_profile(model, arena)
    if args.engines:
        result["host_share"] = host_share(model, arena, spec, [e for e in args.engines.split(",") if e])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
