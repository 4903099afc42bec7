"""Host time of a paged decode segment's block tables: built from scratch vs updated in place.

At each decode segment's start the real runner puts every row's block table into the decode
buffers (`DecodeLoop.load`). This times only that work, for realistic shapes, on whatever
device is given (the CPU by default: the work is host-side Python and numpy; on a GPU the upload
is asynchronous), two ways on the same segments:

- **scratch** (the runner's path before `kvbench.real.block_tables.DeviceBlockTables`): the
  allocator's tables, a padded `[rows, W]` array built by `block_table_array`, the whole of it
  copied into the device table;
- **update** (the runner's path now): the allocator's own block lists
  (`PagedAllocator.block_lists`, no tuple and no `BlockTable` per request) handed to
  `DeviceBlockTables.update`, which writes only the entries that changed and uploads the rows
  between the first and last it touched.

Scratch includes the allocator's `addressing` of every request (reported alone too). The
segments come from the real `PagedAllocator` driven as the engine loop drives it: 256
requests at once (a prompt of 200 to 1,800 tokens, 16 to 240 outputs: contexts of a few
hundred to 2K tokens), block 16; each segment runs until its next request finishes (at most
`--max-steps`), its blocks grown ahead and trimmed as `kvbench.engine` does, a finished request
freed and the next one admitted at the batch's end (so every row after it shifts). Every
segment's updated table is checked equal to the scratch one (outside the timed work).

    python benchmarks/host_path.py [--requests 256] [--segments 300] [--repeats 5] [--device cpu]

Figures are medians over `--repeats` replays of the same segments; this prints, it tests nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from engines.paged import PagedAllocator
from kvbench.real.block_tables import DeviceBlockTables, block_table_array
from kvbench.real.decode_loop import graph_buckets
from kvbench.requests import Request
from kvbench.sequence import sequence_for

BLOCK = 16
MAX_LEN = 2048


def _requests(count: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    prompts, outputs = rng.integers(200, 1801, count), rng.integers(16, 241, count)
    return [Request(i, 0.0, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]


def replay(args: argparse.Namespace, device: torch.device) -> dict[str, list[float]]:
    """One replay of the segments: seconds per segment of each timed part."""
    queue = _requests(args.requests * 4, seed=0)
    alloc = PagedAllocator(args.requests * 4 * MAX_LEN, BLOCK)
    width = -(-MAX_LEN // BLOCK)
    rows_max = graph_buckets(args.requests)[-1]
    scratch_table = torch.zeros((rows_max, width), dtype=torch.int32, device=device)
    tables = DeviceBlockTables(rows_max, width, device)
    batch = []

    def admit() -> None:
        seq = sequence_for(queue.pop(0))
        alloc.allocate(seq)  # the prompt's blocks (its prefill)
        seq.advance(1, 0.0, 0.0)
        batch.append(seq)

    while len(batch) < args.requests:
        admit()
    times: dict[str, list[float]] = {"addressing": [], "scratch": [], "update": []}
    for _ in range(args.segments):
        for seq in batch:
            alloc.append(seq)
        k = min(args.max_steps, min(seq.remaining for seq in batch))
        k = alloc.growth_horizon(batch, k)
        if k > 1:
            alloc.grow(batch, k)
        seqs = tuple(batch)
        rows = next(n for n in graph_buckets(args.requests) if n >= len(seqs))
        keys = [seq.sample_key for seq in seqs]

        start = time.perf_counter()
        where = [alloc.addressing(seq) for seq in seqs]
        middle = time.perf_counter()
        host = block_table_array(where, rows, width)
        scratch_table[:rows].copy_(torch.from_numpy(host), non_blocking=True)
        end = time.perf_counter()
        tables.update(alloc.block_lists(seqs), rows, keys)
        done = time.perf_counter()
        times["addressing"].append(middle - start)
        times["scratch"].append(end - start)
        times["update"].append(done - end)

        if not torch.equal(tables.table[:rows].cpu(), torch.from_numpy(host)):
            raise AssertionError("the updated table differs from the one built from scratch")
        alloc.trim(k)
        for seq in seqs:
            if seq.advance(k, 0.0):
                alloc.free(seq)
                batch.remove(seq)
                if queue:
                    admit()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--segments", type=int, default=300)
    parser.add_argument("--max-steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    runs = [replay(args, device) for _ in range(args.repeats)]
    print(f"{args.requests} requests, block {BLOCK}, {args.segments} segments, {args.repeats} replays, "
          f"device {device}, torch {torch.__version__}")  # fmt: skip
    for part in ("addressing", "scratch", "update"):
        per_segment = statistics.median(statistics.median(run[part]) for run in runs)
        total = statistics.median(sum(run[part]) for run in runs)
        print(f"  {part:10s} median {1e6 * per_segment:8.1f} us per segment, {1e3 * total:7.2f} ms in all")
    scratch = statistics.median(sum(run["scratch"]) for run in runs)
    update = statistics.median(sum(run["update"]) for run in runs)
    print(f"  update / scratch: {update / scratch:.2f}")


if __name__ == "__main__":
    main()
