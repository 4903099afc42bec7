"""What a swap preemption's copies cost in kvbench's real runner, against what the link allows.

Figure 19 prices a swap preemption by the blocks it moves, so the runner's copies must cost what
moving those bytes costs, not what the harness adds around them. This times the runner's own
`_swap` (kvbench/real/kv_copies.py) on a real arena of the model's geometry and the real paged
allocator's host space: `--tokens` tokens' worth of blocks swapped out and back in, at each
block size, with the host blocks consecutive (one copy a direction) and in a random order (one
copy a block), beside one pinned copy of the same bytes each way (the link's bound in this
process). Prints a table of GB/s and the ratio to the bound, median of `--repeats`, and writes it
as JSON.

    PYTHONPATH=. python benchmarks/swap_copies.py [--model opt-13b] [--block-sizes 1,16,256] [--out swap.json]
    PYTHONPATH=. python benchmarks/swap_copies.py --device cpu --model tiny-llama --tokens 64   # smoke test
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from pathlib import Path

import torch

from engines.batch import Batch
from engines.paged import PagedAllocator
from kvbench.modeling.arena import KVArena
from kvbench.models import ModelSpec, get_model
from kvbench.real.kv_copies import ArenaCopies
from kvbench.results.files import write_text


def swaps(to_host: bool, device_blocks: list[int], host_blocks: list[int]) -> Batch:
    """A batch that only swaps, in this order: (to_host, source block, target block)."""
    pairs = (
        zip(device_blocks, host_blocks, strict=True)
        if to_host
        else zip(host_blocks, device_blocks, strict=True)
    )
    return Batch(
        seqs=(), is_prefill=False, num_tokens=0, num_context=0, swaps=tuple((to_host, *p) for p in pairs)
    )


class SwapSpace(ArenaCopies):
    """The real runner's copy methods over a real arena and paged allocator, without a model:
    what a swap moves depends on the arena's geometry and the host space, not on the weights."""

    def __init__(
        self, spec: ModelSpec, block_size: int, blocks: int, host_blocks: int, dtype, device
    ) -> None:
        self.device = torch.device(device)
        self.allocator = PagedAllocator(blocks * block_size, block_size, host_blocks=host_blocks)
        self.arena = KVArena(spec, blocks * block_size, dtype, self.device)
        self._host = self._swap_space()

    def block(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One device block's K and V, all layers: `[L, bs, Hkv, D]` each (copies)."""
        bs = self.allocator.block_size
        return tuple(kv[:, block * bs : (block + 1) * bs].clone() for kv in (self.arena.k, self.arena.v))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of `fn` over `repeats`, after one warm-up call, the device synchronized."""
    fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(spec: ModelSpec, block_size: int, tokens: int, args: argparse.Namespace) -> list[dict]:
    """Rows for one block size: the runner's swap out and in (consecutive and random host order)
    and one pinned copy of the same bytes each way."""
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    n = -(-tokens // block_size)
    space = SwapSpace(spec, block_size, blocks=2 * n, host_blocks=2 * n, dtype=dtype, device=device)
    nbytes = n * block_size * (space.arena.k[0, 0].nbytes + space.arena.v[0, 0].nbytes) * spec.num_layers
    rng = random.Random(0)
    device_blocks = rng.sample(range(2 * n), n)  # a preempted sequence's blocks lie anywhere
    rows = []
    for order in ("consecutive", "random"):
        host = list(range(n)) if order == "consecutive" else rng.sample(range(2 * n), n)
        for to_host in (True, False):
            seconds = timed(
                lambda h=host, t=to_host: space._swap(swaps(t, device_blocks, h)), device, args.repeats
            )
            copy = f"swap {'out' if to_host else 'in'}"
            rows.append({"block_size": block_size, "copy": copy, "host_order": order, "seconds": seconds,
                         "gb_per_s": nbytes / seconds / 1e9})  # fmt: skip
    flat = space.arena.k.new_empty(nbytes // space.arena.k.element_size())  # [bytes / element]
    pinned = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=device.type == "cuda")
    for name, target, source in (("bound out", pinned, flat), ("bound in", flat, pinned)):
        seconds = timed(lambda t=target, s=source: t.copy_(s, non_blocking=True), device, args.repeats)
        rows.append({"block_size": block_size, "copy": name, "host_order": "-", "seconds": seconds,
                     "gb_per_s": nbytes / seconds / 1e9})  # fmt: skip
    bound = {True: rows[-2]["gb_per_s"], False: rows[-1]["gb_per_s"]}
    for row in rows:
        row["of_bound"] = row["gb_per_s"] / bound[row["copy"].endswith("out")]
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="opt-13b")
    parser.add_argument("--block-sizes", default="1,16,256")
    parser.add_argument(
        "--tokens", type=int, default=4096, help="tokens swapped each way (a few long requests)"
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    spec = get_model(args.model)
    rows = [row for bs in args.block_sizes.split(",") for row in measure(spec, int(bs), args.tokens, args)]
    print(
        f"{args.model}: {args.tokens} tokens a way, {args.dtype} on {args.device}, median of {args.repeats}"
    )
    columns = [
        ("block", "block_size", ">6"), ("copy", "copy", "<10"), ("host order", "host_order", "<12"),
        ("ms", "ms", ">9.2f"), ("GB/s", "gb_per_s", ">8.2f"), ("of bound", "of_bound", ">9.2f"),
    ]  # fmt: skip
    print_rows([{**r, "ms": 1e3 * r["seconds"]} for r in rows], columns)
    if args.out:
        write_text(args.out, json.dumps({"model": args.model, "tokens": args.tokens, "rows": rows}, indent=1))
    return rows


def print_rows(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """`rows` as a text table: one (header, key, format spec) a column, each header aligned and
    as wide as its column's spec."""
    print(" ".join(f"{header:{re.match(r'[<>^]?[0-9]*', spec).group()}}" for header, _, spec in columns))
    for row in rows:
        print(" ".join(f"{row[key]:{spec}}" for _, key, spec in columns))


if __name__ == "__main__":
    main()
