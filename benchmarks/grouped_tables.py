"""Host time of the block tables of a model with several KV groups: a prefill step's, a decode step's.

`hybrid` and `jenga` keep a block table per KV group table (`HybridAllocator.memory_layout`):
Gemma 3 12B has six under `hybrid` (vLLM splits its groups into sub-groups of 8 layers) and two
under `jenga`. The host work on them precedes each step's launches, so it adds to the step. This
times it on the shapes of Gemma 3 12B's chunked long-context run
(results/reference/hybrid-long-chunked-warm-real), in the budget an H200 leaves the model, block 16:

- **prefill**: a mixed step of 33 decode rows and one 2,015-token chunk (34 sequences of 2,000
  to 30,000 tokens): every table's slots and kernel block table
  (`kvbench.real.model_runner._step_addressing`), best of `--repeats`;
- **decode**: `--steps` decode steps of 22 sequences of 2,000 to 25,000 tokens, each step's
  `DeviceBlockTables.update` of every table, the rows compared with what they hold (`compare`)
  or skipped where the allocator's version says they did not change (`versions`, as the runner
  does since `HybridAllocator.memory_versions`), the median step (a mean over a shared
  machine's steps moved by a third from run to run). The upload itself is left out
  (on a GPU it is an asynchronous copy; on a CPU a plain one that would dominate).

    PYTHONPATH=. python benchmarks/grouped_tables.py [--repeats 30] [--steps 600] [--seed 0]

Prints; it tests nothing.
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
from kvbench.real.block_tables import DeviceBlockTables
from kvbench.real.model_runner import _step_addressing
from kvbench.requests import Request
from kvbench.sequence import Sequence

GIB = 95.9  # the KV budget the H200 left Gemma 3 12B in that run
ENGINES = {"hybrid": HybridAllocator, "jenga": JengaAllocator}
CPU = torch.device("cpu")


class _NoUpload(DeviceBlockTables):
    """The host side of an update only: the mirror's rows are written, not copied anywhere."""

    def _upload(self, lo: int, hi: int) -> None:
        pass


def admitted(engine: str, count: int, longest: int, output: int, seed: int) -> tuple:
    model = get_model("gemma-3-12b")
    alloc = ENGINES[engine](budget_from_gib(GIB, model).num_slots, 16, model.groups, watermark=0.0)
    rng = np.random.default_rng(seed)
    seqs = []
    for i in range(count):
        seq = Sequence(Request(i, 0.0, int(rng.integers(2000, longest)), output))
        alloc.allocate(seq)
        seq.advance(1, 0.0)
        alloc.append(seq)
        seqs.append(seq)
    return alloc, seqs


def prefill_ms(engine: str, repeats: int, seed: int) -> float:
    alloc, seqs = admitted(engine, 34, 30000, 100, seed)
    rows = [alloc.memory_tables(seq) for seq in seqs]  # [seq][table]
    tables = [[BlockTable(tuple(row[t]), 16) for row in rows] for t in range(len(rows[0]))]
    last = seqs[-1].num_computed
    positions = [np.arange(s.num_computed, s.num_computed + 1) for s in seqs[:-1]]
    positions.append(np.arange(last - 2015, last))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for table in tables:
            _step_addressing(table, positions, CPU)
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def decode_ms(engine: str, steps: int, seed: int, versions: bool) -> float:
    alloc, seqs = admitted(engine, 22, 25000, steps + 10, seed)
    count = len(alloc.memory_layout())
    width = max(len(alloc.memory_tables(seq)[0]) for seq in seqs) + steps // 16 + 2
    tables = [_NoUpload(32, width, CPU) for _ in range(count)]
    keys = [seq.sample_key for seq in seqs]
    times = []
    for _ in range(steps):
        assert alloc.append_all(seqs) is not None
        start = time.perf_counter()
        rows = [alloc.memory_tables(seq) for seq in seqs]
        stamps = alloc.memory_versions(seqs) if versions else None
        for t, device in enumerate(tables):
            device.update([row[t] for row in rows], 32, keys, stamps)
        times.append(time.perf_counter() - start)
        for seq in seqs:
            seq.advance(1, 0.0)
    return 1e3 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for engine in ENGINES:
        alloc, _ = admitted(engine, 1, 3000, 1, args.seed)
        tables = len(alloc.memory_layout())
        prefill = prefill_ms(engine, args.repeats, args.seed)
        compare = decode_ms(engine, args.steps, args.seed, versions=False)
        versions = decode_ms(engine, args.steps, args.seed, versions=True)
        print(
            f"{engine:7s} {tables} tables: prefill {prefill:6.2f} ms a step (best of {args.repeats}); "
            f"decode {compare:6.3f} ms a step compared, {versions:6.3f} by version (medians)"
        )


if __name__ == "__main__":
    main()
