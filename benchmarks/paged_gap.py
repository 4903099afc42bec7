"""Where paged's end-to-end gap to orca-oracle comes from, on the reference workload.

On the reference workload (`benchmarks/real_decode.py`: `llama-1b-ref`, bf16, 256 requests at
once) paged and orca-oracle decode the same batches and produce the same greedy tokens, yet
end-to-end output tokens/s differed by 7-10 % while the kernel benchmark puts paged attention
within 3 % of contiguous. This benchmark attributes the gap:

1. **Runs, alternated.** One uncounted warm-up run per engine (Triton compiles its kernels,
   cuBLAS picks its algorithms, both for every engine alike), then paged and orca-oracle
   alternately, `--repeats` times each, so drift and clocks hit both the same. Each run's wall
   time is split from its step records into prefill (the engine calls that prefill), decode
   (the decode segments' measured durations) and host (the engine loop between calls: wall
   minus the calls' durations).
2. **Decode kernels alone.** Every decode segment of the run is replayed on the GPU with nothing
   else: its batch's graph (padded to its bucket, as the run did) for its number of steps,
   starting at its mean context, K/V addressed through a block table (paged: blocks of the
   arena in random order) or an extent (contiguous). Its sum is the decode time of the kernels
   and the graphs alone; the run's decode time minus it is the host's work inside decode
   segments (loading the batch, uploading block tables, sampling results back).
3. **The attribution.** gap = prefill gap + decode-kernel gap + in-segment host gap + between-call
   host gap, each in ms and as a share of the end-to-end gap, with the spread over the repeats.

    python benchmarks/paged_gap.py [--repeats 3] [--num-requests 256] [--device cuda] [--json gap.json]

On a CPU (tests, smoke runs) the replay is eager and the figures mean nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from benchmarks.real_decode import reference_trace
from engines import ENGINES, EngineOptions
from engines.allocator import BlockTable, Extent
from kvbench.engine import Engine
from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import resolve_backend
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.real.decode_loop import DecodeLoop
from kvbench.real.model_runner import ModelRunner

ENGINES_COMPARED = ("paged", "orca-oracle")
BLOCK = 16


def run_once(engine: str, model, arena, spec, trace, max_len: int, cuda_graphs: bool) -> dict:
    """One real run of `engine`: wall time split into prefill, decode and host; its decode segments."""
    sched = ENGINES[engine].build(EngineOptions(num_slots=arena.num_slots, max_len=spec.max_len))
    runner = ModelRunner(model, arena, sched.allocator, max_batch=len(trace), max_len=max_len,
                         cuda_graphs=cuda_graphs)  # fmt: skip
    start = time.perf_counter()
    run = Engine(sched, runner).run(trace)
    _sync(arena.k.device)
    wall = time.perf_counter() - start
    prefill = sum(row.duration_s for row in run.steps if row.kind == "prefill")
    decode = sum(row.duration_s for row in run.steps if row.kind == "decode")
    segments = [  # (rows, steps, mean context at the segment's first step)
        (row.batch_size, row.num_steps, _first_context(row))
        for row in run.steps
        if row.kind == "decode"
    ]
    return {
        "engine": engine, "wall_s": wall, "prefill_s": prefill, "decode_s": decode,
        "host_s": wall - prefill - decode, "engine_calls": len(run.steps),
        "decode_steps": sum(s[1] for s in segments),
        "output_tokens_per_s": sum(r.output_len for r in trace.requests) / wall,
        "segments": segments, "tokens": [s.output_ids for s in run.sequences],
    }  # fmt: skip


def _first_context(row) -> int:
    """Mean context of a segment's first step: its K/V reads grow by one row per step."""
    n, k = row.batch_size, row.num_steps
    # context_tokens = k * n * c0 + n * k (k - 1) / 2 over the segment's k steps
    return max(1, round((row.context_tokens - n * k * (k - 1) / 2) / (n * k)))


def replay_decode(model, arena, segments, paged: bool, max_len: int, cuda_graphs: bool, vocab: int) -> float:
    """Seconds the GPU takes for `segments` with nothing else: each replayed from its bucket's graph."""
    device = arena.k.device
    max_batch = max(rows for rows, _, _ in segments)
    loop = DecodeLoop(model, arena, max_batch=max_batch, max_len=max_len, block_size=BLOCK, paged=paged,
                      backend=resolve_backend("auto", device), temperature=0.0, seed=0)  # fmt: skip
    if cuda_graphs and device.type == "cuda":
        loop.capture()
    per_seq = -(-max_len // BLOCK) * BLOCK
    rng = np.random.default_rng(0)
    width = per_seq // BLOCK
    order = rng.permutation(max_batch * width)  # paged: every sequence's blocks scattered
    addressing = [
        BlockTable(tuple(order[b * width : (b + 1) * width].tolist()), BLOCK) if paged
        else Extent(b * per_seq, per_seq, per_seq)
        for b in range(max_batch)
    ]  # fmt: skip
    total = 0.0
    for rows, steps, context in segments:
        padded = loop.rows_for(rows)
        tokens = rng.integers(0, vocab, rows)
        loop.load(padded, tokens, [context - 1] * rows, list(range(rows)), addressing[:rows])
        _sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            loop.run_step(padded)
        _sync(device)
        total += time.perf_counter() - start
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attribute(runs: list[dict], replay: dict[str, float]) -> dict:
    """The gap paged - orca-oracle in seconds, part by part: means over the repeats, with spreads."""

    def mean(engine: str, key: str) -> float:
        return statistics.fmean(r[key] for r in runs if r["engine"] == engine)

    def spread(engine: str, key: str) -> float:
        values = [r[key] for r in runs if r["engine"] == engine]
        return statistics.stdev(values) if len(values) > 1 else 0.0

    paged, oracle = ENGINES_COMPARED
    parts = {
        "prefill": mean(paged, "prefill_s") - mean(oracle, "prefill_s"),
        "decode kernels and graphs": replay[paged] - replay[oracle],
        "host inside decode segments": (mean(paged, "decode_s") - replay[paged])
        - (mean(oracle, "decode_s") - replay[oracle]),
        "host between engine calls": mean(paged, "host_s") - mean(oracle, "host_s"),
    }
    gap = mean(paged, "wall_s") - mean(oracle, "wall_s")
    return {
        "gap_s": gap,
        "gap_share_of_oracle_wall": gap / mean(oracle, "wall_s"),
        "parts_s": parts,
        "unattributed_s": gap - sum(parts.values()),
        "wall_s": {e: mean(e, "wall_s") for e in ENGINES_COMPARED},
        "wall_stdev_s": {e: spread(e, "wall_s") for e in ENGINES_COMPARED},
        "output_tokens_per_s": {e: mean(e, "output_tokens_per_s") for e in ENGINES_COMPARED},
        "replayed_decode_s": replay,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--model", default="llama-1b-ref")
    parser.add_argument("--kv-cache-gib", type=float, default=8.0)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    graphs = not args.no_cuda_graphs and device.type == "cuda"
    spec = get_model(args.model)
    trace = reference_trace(args.num_requests)
    model = random_model(spec, dtype, device, seed=0)
    arena = KVArena(spec, int(args.kv_cache_gib * 2**30 // spec.kv_bytes_per_token), dtype, device)
    max_len = max(r.kv_len for r in trace.requests) + 1
    for engine in ENGINES_COMPARED:  # warm-up, not counted
        run_once(engine, model, arena, spec, trace, max_len, graphs)
    runs = []
    for index in range(args.repeats):
        for engine in ENGINES_COMPARED if index % 2 == 0 else ENGINES_COMPARED[::-1]:
            runs.append(run_once(engine, model, arena, spec, trace, max_len, graphs))
            shown = {k: round(v, 4) for k, v in runs[-1].items() if isinstance(v, float)}
            print(engine, json.dumps(shown), flush=True)
    same_batches = len({tuple(r["segments"]) for r in runs}) == 1
    same_tokens = all(r["tokens"] == runs[0]["tokens"] for r in runs)
    segments = {e: next(r["segments"] for r in runs if r["engine"] == e) for e in ENGINES_COMPARED}
    replay = {
        e: replay_decode(model, arena, segments[e], e == "paged", max_len, graphs, spec.vocab)
        for e in ENGINES_COMPARED
    }
    result = attribute(runs, replay)
    result.update(same_decode_segments=same_batches, identical_tokens=same_tokens, repeats=args.repeats,
                  device=str(device), torch=torch.__version__,
                  gpu=torch.cuda.get_device_name() if device.type == "cuda" else None)  # fmt: skip
    gap = result["gap_s"]
    print(f"paged - orca-oracle: {1e3 * gap:+.1f} ms end to end "
          f"({100 * result['gap_share_of_oracle_wall']:+.1f} % of orca-oracle's wall time)")  # fmt: skip
    for part, seconds in [*result["parts_s"].items(), ("unattributed", result["unattributed_s"])]:
        share = f"{100 * seconds / gap:+.0f} % of the gap" if gap else ""
        print(f"  {part:30s} {1e3 * seconds:+8.1f} ms  {share}")
    print(f"same decode segments in every run: {same_batches}; identical tokens: {same_tokens}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
