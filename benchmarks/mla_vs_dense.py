"""An MLA model beside a dense GQA Llama at the same KV budget: how many requests fit, and what
a decode step costs at that batch, on a GPU.

DeepSeek-V2-Lite (`deepseek-v2-lite`: 27 layers, one latent of 512 plus a 64-wide rotary key per
token and layer, 31,104 bytes a token in bf16) and a dense model of similar serving size
(`--dense`, default `llama-3.1-8b`: 32 layers of 8 KV heads of 128, 131,072 bytes a token), both
bf16 with seeded random weights. For each model and context C, the KV arena of `--kv-cache-gib`
holds S = budget // bytes-per-token slots, so floor(S / C) requests of C tokens fit (capped at
`--max-batch`). One decode step at that batch, every sequence at context C in a contiguous
layout, is timed alone (median of 30 after warm-up):

- `eager`: both models, the same Python forward launched kernel by kernel;
- `graphs`: replayed from a CUDA graph (the default of a real run).

An MoE model's step is timed once per `--expert-dispatch` (`kvbench.modeling.mla.MoE`): `dense`
runs every routed expert over every row, weighted 0 where not chosen (at these batches nearly
every expert's weights are read anyway, but the compute is 64 / 6 of the chosen experts'),
`grouped` each (row, choice) pair once through two grouped matmuls over the rows sorted by
expert (the chosen experts' compute only). The attention's own cost is in
results/reference/kernels-window-mla.

Output tokens per second at the fitted batch are batch / step. The ratio of batches is exact
(arena arithmetic); the step times are one run each.

    PYTHONPATH=. python benchmarks/mla_vs_dense.py --out mla_vs_dense.json [--contexts 2048,8192]
    PYTHONPATH=. python benchmarks/mla_vs_dense.py --device cpu --models tiny-llama,tiny-opt \\
        --kv-cache-gib 0.001 --contexts 64 --max-batch 8    # a smoke test of the script
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable without PYTHONPATH too

from benchmarks.decode_step import gpu_step_s, step_slots
from kvbench.modeling.arena import KVArena
from kvbench.modeling.mla import set_expert_dispatch
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.results.files import write_json

GIB = 2**30


def fit(spec, kv_gib: float, context: int, max_batch: int) -> tuple[int, int]:
    """(slots of the budget, requests of `context` tokens they hold, at most `max_batch`)."""
    slots = int(kv_gib * GIB) // spec.kv_bytes_per_token
    return slots, min(slots // context, max_batch)


def step_ms(model, arena, batch: int, context: int, graphs: bool, device: torch.device) -> float:
    if device.type != "cuda":  # the CPU smoke test: one eager step, untimed
        return float("nan")
    return 1e3 * gpu_step_s(model, arena, batch, context, paged=False, max_len=context + 8, graphs=graphs)


def measure(name: str, args: argparse.Namespace, device: torch.device) -> list[dict]:
    spec = get_model(name)
    model = random_model(spec, torch.bfloat16 if device.type == "cuda" else torch.float32, device, seed=0)
    rows = []
    for context in (int(c) for c in args.contexts.split(",")):
        slots, batch = fit(spec, args.kv_cache_gib, context, args.max_batch)
        if batch < 1:
            print(f"{name} at {context}: not one request fits in {args.kv_cache_gib} GiB", flush=True)
            continue
        arena = KVArena(spec, step_slots(batch, context + 8), next(model.parameters()).dtype, device)
        graphs = device.type == "cuda"
        for dispatch in args.expert_dispatch.split(",") if spec.moe else (None,):
            if dispatch:
                set_expert_dispatch(model, dispatch)
            row = {
                "model": name, "kv_bytes_per_token": spec.kv_bytes_per_token, "context": context,
                "slots": slots, "batch": batch, "expert_dispatch": dispatch,
                "eager_ms": step_ms(model, arena, batch, context, False, device),
                "graphs_ms": step_ms(model, arena, batch, context, True, device) if graphs else None,
            }  # fmt: skip
            best = row["graphs_ms"] or row["eager_ms"]
            row["output_tokens_per_s"] = 1e3 * batch / best
            rows.append(row)
            print(row, flush=True)
        del arena
        if device.type == "cuda":
            torch.cuda.empty_cache()
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the rows")
    parser.add_argument("--models", default="deepseek-v2-lite,llama-3.1-8b", help="MLA model, dense model")
    parser.add_argument("--kv-cache-gib", type=float, default=12.0)
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--expert-dispatch",
        default="dense,grouped",
        help="MoE models: ways a decode step runs the routed experts, each timed",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda: no CUDA device here (--device cpu smoke-tests the script)")
    rows = [row for name in args.models.split(",") for row in measure(name, args, device)]
    head = ("model", "experts", "context", "bytes/tok", "batch", "eager ms", "graphs ms", "tok/s")
    print("\n" + f"{head[0]:<20}" + "".join(f"{h:>10}" for h in head[1:]))
    for r in rows:
        graphs = f"{r['graphs_ms']:.2f}" if r["graphs_ms"] else "-"
        cells = (r["expert_dispatch"] or "-", r["context"], r["kv_bytes_per_token"], r["batch"],
                 f"{r['eager_ms']:.2f}", graphs, f"{r['output_tokens_per_s']:.0f}")  # fmt: skip
        print(f"{r['model']:<20}" + "".join(f"{c:>10}" for c in cells))
    if args.out:
        gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
        setting = vars(args) | {"out": str(args.out)}
        write_json(args.out, {"gpu": gpu, "torch": torch.__version__, "args": setting, "rows": rows})


if __name__ == "__main__":
    main()
