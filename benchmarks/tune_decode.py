"""Pick the decode-attention launch (tile, warps, stages) and split count on this GPU.

Times `kernels.decode_attention` over the kernels issue's cells (bf16, 32 query heads, 8 KV
heads, head dim 128, block 16, random page order) for each launch configuration, paged and
contiguous, as a fraction of the read bandwidth measured in the same run; then, for the
chosen launch, each split count against the heuristic's. Prints a table; the winner is what
`kernels.decode_attention.LAUNCH` and `kernels.splits` should say.

    python benchmarks/tune_decode.py
"""

from __future__ import annotations

import itertools
import statistics

import numpy as np
import torch

from kernels.bandwidth import measure_read_bandwidth, time_cuda
from kernels.decode_attention import decode_attention
from kernels.splits import choose_num_splits

CELLS = [(8, 1024), (8, 8192), (64, 1024), (64, 4096), (256, 1024), (256, 2048), (32, 16384)]
LAUNCHES = list(itertools.product((32, 64, 128), (4, 8), (2, 3)))
HEADS, KV_HEADS, DIM, BS = 32, 8, 128, 16


def inputs(batch: int, context: int, copies: int):
    """`copies` independent (q, k, v, table, starts) sets, so the L2 cache holds none."""
    dev = torch.device("cuda")
    rng = np.random.default_rng(batch * 7 + context)
    slots = batch * context
    out = []
    for _ in range(copies):
        k = torch.randn(slots, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16)
        v = torch.randn(slots, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16)
        q = torch.randn(batch, HEADS, DIM, device=dev, dtype=torch.bfloat16)
        table = torch.tensor(rng.permutation(slots // BS).reshape(batch, -1), dtype=torch.int32, device=dev)
        starts = torch.arange(batch, device=dev) * context
        out.append((q, k, v, table, starts))
    return out


def fraction(batch, context, sets, bandwidth, *, paged, launch, splits):
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")

    def call(q, k, v, table, starts):
        addressing = {"block_tables": table, "block_size": BS} if paged else {"starts": starts}
        return lambda: decode_attention(
            q, k, v, lens, scale=DIM**-0.5, num_splits=splits, launch=launch, **addressing
        )

    seconds = statistics.median(time_cuda([call(*s) for s in sets], warmup=3, repeats=20))
    return 2 * batch * context * KV_HEADS * DIM * 2 / seconds / bandwidth


def main() -> None:
    device = torch.device("cuda")
    bandwidth = measure_read_bandwidth(device)
    print(f"read bandwidth {bandwidth / 1e12:.2f} TB/s")
    scores: dict[tuple, list[float]] = {launch: [] for launch in LAUNCHES}
    cells = {}
    for batch, context in CELLS:
        copies = max(1, min(4, int(4 * 50e6 // (2 * batch * context * KV_HEADS * DIM * 2)) + 1))
        sets = inputs(batch, context, copies)
        splits = choose_num_splits(batch, KV_HEADS, context, device)
        cells[batch, context] = (sets, splits)
        for launch in LAUNCHES:
            paged = fraction(batch, context, sets, bandwidth, paged=True, launch=launch, splits=splits)
            contiguous = fraction(batch, context, sets, bandwidth, paged=False, launch=launch, splits=splits)
            scores[launch].append(paged)
            print(f"B{batch} L{context} splits {splits} launch {launch}: paged {paged:.3f} contiguous "
                  f"{contiguous:.3f} ratio {contiguous / paged:.3f}")  # fmt: skip
    best = max(LAUNCHES, key=lambda launch: float(np.exp(np.mean(np.log(scores[launch])))))
    print(f"best launch (geomean of paged fractions): {best}")
    for (batch, context), (sets, heuristic) in cells.items():
        row = []
        for splits in (1, 2, 4, 8, 16, 32):
            share = fraction(batch, context, sets, bandwidth, paged=True, launch=best, splits=splits)
            row.append(f"{splits}:{share:.3f}")
        print(f"B{batch} L{context} heuristic {heuristic}; paged fraction by splits: {' '.join(row)}")


if __name__ == "__main__":
    main()
