"""Host time of a mixed step's addressing: every KV table's slots and kernel block tables.

Before a prefill or mixed step runs, the real runner turns each table's rows (one table, or one
per KV group table under `hybrid` and `jenga`) into the arena slots its new tokens go to and the
`[B, max blocks]` block table its kernels read (`kvbench.real.model_runner._step_addressing`).
That host work precedes the step's launches, so it adds to the step. This times it on the shapes
of Gemma 3 12B's chunked long-context run (results/reference/hybrid-long-chunked-warm-real): 34
running sequences of 2,000 to 30,000 tokens in the budget an H200 leaves the model, 33 decode
rows and one 2,015-token chunk, block 16, for `hybrid` (six tables: vLLM splits the groups into
sub-groups of 8 layers) and `jenga` (two), at the same block ids.

    PYTHONPATH=. python benchmarks/prefill_addressing.py [--repeats 30] [--seed 0]

Prints the best time of `--repeats` per engine on this machine's CPU; it tests nothing.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from engines.allocator import BlockTable
from engines.hybrid import HybridAllocator, JengaAllocator
from kvbench.budget import budget_from_gib
from kvbench.models import get_model
from kvbench.real.model_runner import _step_addressing
from kvbench.requests import Request
from kvbench.sequence import Sequence

GIB = 95.9  # the KV budget the H200 left Gemma 3 12B in that run
ROWS = 34
ENGINES = {"hybrid": HybridAllocator, "jenga": JengaAllocator}


def tables_of(engine: str, seed: int) -> tuple[list[list[BlockTable]], list[np.ndarray]]:
    """`[table][seq]` addressing of ROWS admitted sequences, and each row's positions this step."""
    model = get_model("gemma-3-12b")
    slots = budget_from_gib(GIB, model).num_slots
    alloc = ENGINES[engine](slots, 16, model.groups, watermark=0.0)
    rng = np.random.default_rng(seed)
    seqs = []
    for i in range(ROWS):
        seq = Sequence(Request(i, 0.0, int(rng.integers(2000, 30000)), 100))
        alloc.allocate(seq)
        seq.advance(1, 0.0)
        alloc.append(seq)
        seqs.append(seq)
    rows = [alloc.memory_tables(seq) for seq in seqs]  # [seq][table]
    tables = [[BlockTable(tuple(row[t]), 16) for row in rows] for t in range(len(rows[0]))]
    decodes = [np.arange(s.num_computed, s.num_computed + 1) for s in seqs[:-1]]
    last = seqs[-1].num_computed
    return tables, [*decodes, np.arange(last - 2015, last)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cpu = torch.device("cpu")
    for engine in ENGINES:
        tables, positions = tables_of(engine, args.seed)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for table in tables:
                _step_addressing(table, positions, cpu)
            times.append(time.perf_counter() - start)
        entries = sum(len(t.blocks) for t in tables[0])
        print(
            f"{engine:7s} {len(tables)} tables of {entries:6d} block ids: {1e3 * min(times):6.2f} ms a step"
        )


if __name__ == "__main__":
    main()
