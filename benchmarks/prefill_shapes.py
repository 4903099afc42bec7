"""Does an eager prefill pay for seeing a new token count? Timed on a GPU.

An eager prefill's linears see a new M (the batch's token count) nearly every step, so any
per-shape setup in the GEMM library (algorithm heuristics) is paid again each time. This times
one-sequence prefill forwards of a random-weight model over token counts drawn fresh (every
count new) and the same counts rounded up to a multiple of `--bucket` (after a warm-up over the
buckets), each as wall time to the result and as host time (until the call returns, no sync);
and `F.linear` alone at a fixed M (512, repeated) and at a new M each call (3,000-9,000: the
sizes differ too, so this part shows the order of the cost, the forward pass measures it).

    python benchmarks/prefill_shapes.py [--model opt-125m] [--bucket 64] [--count 60]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.weights import random_model
from kvbench.models import get_model


def prefill_ms(model, arena, tokens: int) -> tuple[float, float]:
    """(host ms, wall ms) of one prefill forward of `tokens` new tokens of one sequence."""
    dev = arena.k.device
    positions = torch.arange(tokens, device=dev)  # [T]
    meta = AttentionMetadata(
        True, positions.clone(), torch.tensor([0, tokens], device=dev),
        torch.tensor([tokens], dtype=torch.int32, device=dev),
        starts=torch.zeros(1, dtype=torch.int64, device=dev), max_new=tokens, backend="triton",
    )  # fmt: skip
    ids = torch.randint(0, model.spec.vocab, (tokens,), device=dev)  # [T]
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        logits = model(ids, positions, meta, arena)  # [1, V]
    host = time.perf_counter() - start
    logits.argmax().item()
    return 1e3 * host, 1e3 * (time.perf_counter() - start)


def linear_us(m_values: list[int], weight: torch.Tensor, bias: torch.Tensor) -> float:
    """Mean host microseconds per `F.linear` over `m_values` rows (inputs made beforehand)."""
    inputs = [torch.randn(m, weight.shape[1], device=weight.device, dtype=weight.dtype) for m in m_values]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for x in inputs:
        F.linear(x, weight, bias)
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e6 * host / len(inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--bucket", type=int, default=64)
    parser.add_argument("--count", type=int, default=60)
    args = parser.parse_args()
    if args.bucket < 1 or 2048 % args.bucket:
        parser.error("--bucket must divide 2048 (a bucket past the model's positions would not run)")
    if not 1 <= args.count <= 1985:
        parser.error("--count must be in [1, 1985]: distinct token counts in [64, 2048]")
    device = torch.device("cuda")
    spec = get_model(args.model)
    model = random_model(spec, torch.bfloat16, device, seed=0)
    arena = KVArena(spec, 4096, torch.bfloat16, device)
    rng = np.random.default_rng(0)
    fresh = [int(t) for t in rng.choice(np.arange(64, 2049), size=args.count, replace=False)]
    bucketed = [-(-t // args.bucket) * args.bucket for t in fresh]
    for t in sorted(set(bucketed)):  # warm-up: Triton compiles, every bucket's shape seen once
        prefill_ms(model, arena, t)
    for label, counts in (("fresh token counts", fresh), (f"rounded up to {args.bucket}", bucketed)):
        runs = [prefill_ms(model, arena, t) for t in counts]
        host = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"{args.model} prefill, {label}: median host {host:.2f} ms, wall {wall:.2f} ms "
              f"(mean tokens {statistics.mean(counts):.0f})")  # fmt: skip
    weight = torch.randn(4 * spec.hidden, spec.hidden, device=device, dtype=torch.bfloat16)
    bias = torch.randn(4 * spec.hidden, device=device, dtype=torch.bfloat16)
    changing = [int(m) for m in rng.choice(np.arange(3000, 9000), size=200, replace=False)]
    linear_us([512] * 20, weight, bias)
    fixed, new = linear_us([512] * 200, weight, bias), linear_us(changing, weight, bias)
    print(
        f"F.linear [{spec.hidden} -> {4 * spec.hidden}] host time: fixed M {fixed:.1f} us, new M {new:.1f} us"
    )


if __name__ == "__main__":
    main()
