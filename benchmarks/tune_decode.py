"""Pick the decode-attention launch (tile, warps, stages) and split count on this GPU.

Times `kernels.decode_attention` over the reference kernel cells (bf16, 32 query heads, 8 KV
heads, head dim 128, block 16, random page order) for each launch configuration, paged and
contiguous, as a fraction of the read bandwidth measured in the same run; then, for the
chosen launch, each split count against the heuristic's. Prints a table; the winner is what
`kernels.splits` (its launches and split rule) should say.

    python benchmarks/tune_decode.py
    python benchmarks/tune_decode.py --cells 8x8192,64x1024 --launches 64-4-2,128-4-2 --splits 2,4,8 \
        --repeats 60 --rounds 2

`--splits` replaces the second table's split counts; `--rounds` times every (launch, split)
point that many times, interleaved, so run-to-run noise shows beside the differences.
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import numpy as np
import torch

from kernels.bandwidth import measure_read_bandwidth, time_cuda
from kernels.decode_attention import decode_attention
from kernels.splits import choose_num_splits

CELLS = [(8, 1024), (8, 8192), (64, 1024), (64, 4096), (256, 1024), (256, 2048), (32, 16384)]
LAUNCHES = list(itertools.product((32, 64, 128), (4, 8), (2, 3)))
HEADS, KV_HEADS, DIM = 32, 8, 128


def inputs(batch: int, context: int, copies: int, block_size: int):
    """`copies` independent (q, k, v, table, starts) sets, so the L2 cache holds none."""
    dev = torch.device("cuda")
    rng = np.random.default_rng(batch * 7 + context)
    slots = batch * context
    out = []
    for _ in range(copies):
        k = torch.randn(slots, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16)
        v = torch.randn(slots, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16)
        q = torch.randn(batch, HEADS, DIM, device=dev, dtype=torch.bfloat16)
        pages = rng.permutation(slots // block_size).reshape(batch, -1)  # [B, L / bs] random page order
        table = torch.tensor(pages, dtype=torch.int32, device=dev)
        starts = torch.arange(batch, device=dev) * context
        out.append((q, k, v, table, starts))
    return out


def fraction(batch, context, sets, bandwidth, *, paged, launch, splits, repeats=20, block_size=16):
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")

    def call(q, k, v, table, starts):
        addressing = {"block_tables": table, "block_size": block_size} if paged else {"starts": starts}
        return lambda: decode_attention(
            q, k, v, lens, scale=DIM**-0.5, num_splits=splits, launch=launch, **addressing
        )

    seconds = statistics.median(time_cuda([call(*s) for s in sets], warmup=3, repeats=repeats))
    return 2 * batch * context * KV_HEADS * DIM * 2 / seconds / bandwidth


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=",".join(f"{b}x{c}" for b, c in CELLS), help="BxL,...")
    parser.add_argument("--launches", default=None, help="tile-warps-stages,... (default: a 12-point grid)")
    parser.add_argument("--splits", default="1,2,4,8,16,32", help="split counts of the second table")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    args.cells = [tuple(map(int, cell.split("x"))) for cell in args.cells.split(",")]
    launches = args.launches.split(",") if args.launches else []
    args.launches = [tuple(map(int, launch.split("-"))) for launch in launches] or LAUNCHES
    args.splits = [int(n) for n in args.splits.split(",")]
    return args


def main() -> None:
    args = parse_args()
    device = torch.device("cuda")
    bandwidth = measure_read_bandwidth(device)
    print(f"read bandwidth {bandwidth / 1e12:.2f} TB/s")
    scores: dict[tuple, list[float]] = {launch: [] for launch in args.launches}
    cells = {}
    for batch, context in args.cells:
        copies = max(1, min(4, int(4 * 50e6 // (2 * batch * context * KV_HEADS * DIM * 2)) + 1))
        sets = inputs(batch, context, copies, args.block_size)
        splits = choose_num_splits(batch, KV_HEADS, context, device)
        cells[batch, context] = (sets, splits)
        for launch in args.launches:
            paged, contiguous = (
                fraction(batch, context, sets, bandwidth, paged=mode, launch=launch, splits=splits,
                         repeats=args.repeats, block_size=args.block_size)
                for mode in (True, False)
            )  # fmt: skip
            scores[launch].append(paged)
            print(f"B{batch} L{context} splits {splits} launch {launch}: paged {paged:.3f} contiguous "
                  f"{contiguous:.3f} ratio {contiguous / paged:.3f}")  # fmt: skip
    best = max(args.launches, key=lambda launch: float(np.exp(np.mean(np.log(scores[launch])))))
    print(f"best launch (geomean of paged fractions): {best}")
    for (batch, context), (sets, heuristic) in cells.items():
        for launch in args.launches if args.rounds > 1 else [best]:
            row = []
            for splits in args.splits:
                shares = [
                    fraction(batch, context, sets, bandwidth, paged=True, launch=launch, splits=splits,
                             repeats=args.repeats, block_size=args.block_size)
                    for _ in range(args.rounds)
                ]  # fmt: skip
                row.append(f"{splits}:" + "/".join(f"{share:.3f}" for share in shares))
            print(f"B{batch} L{context} launch {launch} heuristic {heuristic}; paged fraction by splits: "
                  f"{' '.join(row)}")  # fmt: skip


if __name__ == "__main__":
    main()
