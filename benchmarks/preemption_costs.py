"""What one preemption costs on the GPU, measured each way rather than fitted: Figure 19's
microbenchmark (the paper's first panel) at a model's geometry.

A real Figure 19 cell prices its preemptions with constants fitted to its own step times: a line
(a cost per prefill step plus one per token) through prefill steps whose time is the larger of
reading the weights and computing their tokens. At OPT-13B on the H200 a prefill under ~200
tokens is bound by the weights (26 GB at 4.8 TB/s, ~5.4 ms), so the recompute cells' fitted cost
of a token, 1.6-25 us, lies at or below the ~25 us its FLOPs take at the dense fp16 peak, and the per-step
part carries the rest: what a recompute adds then depends on what else its step holds, which the
fitted constant cannot say. This times the two ways directly, for a request of `--tokens` tokens
(the prompt and the tokens generated before it was preempted) at each block size:

- swap: the request's blocks out to the host and back in through the real runner's copies
  (`kvbench/real/kv_copies.py`, the arena and host space of `benchmarks/swap_copies.py`), host
  blocks consecutive, as the paged allocator's host space hands them out to one request;
- recompute: one prefill forward of its tokens through the model (random weights) into the same
  paged arena at the same block size, its blocks scattered as a running engine leaves them.

Prints, per block size and token count, the median ms of `--repeats` each way, swap over
recompute, and the prefill's compute floor (2 FLOPs a token for each weight outside the
embeddings, at `--gpu`'s datasheet dense fp16 peak); writes the rows as JSON.

    PYTHONPATH=. python benchmarks/preemption_costs.py [--model opt-13b] [--tokens 64,256,1024] [--out F]
    PYTHONPATH=. python benchmarks/preemption_costs.py --device cpu --model tiny-llama --tokens 32  # smoke
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import torch

from benchmarks.swap_copies import SwapSpace, print_rows, swaps, timed
from engines.allocator import BlockTable
from kvbench.budget import get_gpu
from kvbench.modeling.attention import AttentionMetadata, resolve_backend
from kvbench.modeling.weights import random_model
from kvbench.models import ModelSpec, get_model
from kvbench.real.model_runner import _step_addressing
from kvbench.reproduce.sweeps import POWERS
from kvbench.results.files import write_text

FIG19_BLOCK_SIZES = ",".join(map(str, POWERS))  # the real reproduction's grid


def prefill_metadata(
    blocks: list[int], block_size: int, tokens: int, device: torch.device
) -> AttentionMetadata:
    """One sequence's prefill of `tokens` new tokens into `blocks` (its block table, in order),
    addressed as the real runner addresses a prefill step's rows."""
    slots, addressing = _step_addressing([BlockTable(tuple(blocks), block_size)], [np.arange(tokens)], device)
    return AttentionMetadata(
        True, torch.from_numpy(slots).to(device), torch.tensor([0, tokens], device=device),
        torch.tensor([tokens], dtype=torch.int32, device=device), max_new=tokens,
        backend=resolve_backend("auto", device), **addressing,
    )  # fmt: skip


def compute_floor_s(spec: ModelSpec, peak_flops: float, tokens: int) -> float:
    """The least time a prefill of `tokens` tokens takes at `peak_flops`: every layer's weights
    multiply each token once (2 FLOPs a weight), a MoE layer's only those of the experts a token
    runs (`ModelSpec.active_params`); the embeddings are only looked up."""
    return tokens * 2 * (spec.active_params - spec.embedding_params) / peak_flops


def measure(model, spec: ModelSpec, block_size: int, tokens: int, args: argparse.Namespace) -> dict:
    """One row: a `tokens`-token request preempted at `block_size`, swapped out and in, and
    recomputed."""
    device = torch.device(args.device)
    n = -(-tokens // block_size)
    space = SwapSpace(
        spec, block_size, blocks=2 * n, host_blocks=n, dtype=getattr(torch, args.dtype), device=device
    )
    rng = random.Random(0)
    blocks = rng.sample(range(2 * n), n)  # where a running engine left the request's blocks
    host = list(range(n))

    def swap() -> None:
        space._swap(swaps(True, blocks, host))
        space._swap(swaps(False, blocks, host))

    meta = prefill_metadata(blocks, block_size, tokens, device)
    ids = torch.randint(0, spec.vocab, (tokens,), device=device)  # [T]
    positions = torch.arange(tokens, device=device)  # [T]

    def recompute() -> None:
        with torch.inference_mode():
            model(ids, positions, meta, space.arena)  # [1, V]: the next token's logits

    swap_s, recompute_s = timed(swap, device, args.repeats), timed(recompute, device, args.repeats)
    floor_s = compute_floor_s(spec, get_gpu(args.gpu).fp16_flops, tokens)
    return {"block_size": block_size, "tokens": tokens, "swap_ms": 1e3 * swap_s,
            "recompute_ms": 1e3 * recompute_s, "swap_over_recompute": swap_s / recompute_s,
            "recompute_floor_ms": 1e3 * floor_s}  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="opt-13b")
    parser.add_argument("--block-sizes", default=FIG19_BLOCK_SIZES)
    parser.add_argument(
        "--tokens", default="64,256,1024", help="a preempted request's tokens, comma-separated"
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--gpu", default="h200-141gb", help="whose datasheet peak sets the compute floor")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    spec = get_model(args.model)
    model = random_model(spec, getattr(torch, args.dtype), torch.device(args.device), seed=0)
    rows = [
        measure(model, spec, int(bs), int(t), args)
        for t in args.tokens.split(",")
        for bs in args.block_sizes.split(",")
    ]
    print(f"{args.model}: one request preempted, {args.dtype} on {args.device}, median of {args.repeats}")
    columns = [
        ("tokens", "tokens", ">6"), ("block", "block_size", ">6"), ("swap ms", "swap_ms", ">9.2f"),
        ("recompute ms", "recompute_ms", ">13.2f"), ("swap/rec", "swap_over_recompute", ">9.2f"),
        ("floor ms", "recompute_floor_ms", ">9.2f"),
    ]  # fmt: skip
    print_rows(rows, columns)
    if args.out:
        write_text(args.out, json.dumps({"model": args.model, "gpu": args.gpu, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
