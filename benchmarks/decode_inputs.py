"""Host time to load a decode batch's inputs (`ModelRunner._load`), per engine.

A decode segment starts by writing every row's input token, position, sampling key and K/V
addressing into the decode buffers; a beam step is a one-step segment, so it pays this every
step. The work is host-side Python and numpy, so a tiny model on the CPU measures it (on a GPU
the buffer copies are asynchronous). Every row holds a `--prompt`-token prompt.

    python benchmarks/decode_inputs.py [--rows 208] [--prompt 100] [--engines paged,orca-oracle]
"""

from __future__ import annotations

import argparse
import time

import torch

from engines import ENGINES, EngineOptions
from engines.scheduler import SchedulerConfig
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.real.model_runner import ModelRunner
from kvbench.requests import Request
from kvbench.sequence import sequence_for


def load_ms(engine: str, rows: int, prompt: int, repeats: int = 50) -> float:
    """Host milliseconds of one `_load` of `rows` sequences under `engine`."""
    spec = get_model("tiny-opt")
    model = random_model(spec, torch.float32, torch.device("cpu"))
    max_len = 2 * prompt
    room = 1 << (max_len - 1).bit_length()  # a buddy arena rounds each reservation up to a power of two
    arena = KVArena(spec, rows * room, torch.float32, torch.device("cpu"))
    scheduler = SchedulerConfig(max_num_seqs=rows)
    options = EngineOptions(num_slots=arena.num_slots, max_len=max_len, block_size=16, scheduler=scheduler)
    allocator = ENGINES[engine].build(options).allocator
    runner = ModelRunner(model, arena, allocator, max_batch=rows, max_len=max_len, attention="torch")
    seqs = tuple(sequence_for(Request(i, 0.0, prompt, prompt)) for i in range(rows))
    for seq in seqs:
        allocator.allocate(seq)
    runner._load(seqs)  # warm-up: prompt ids drawn and cached
    runs = []
    for _ in range(20):
        start = time.perf_counter()
        for _ in range(repeats):
            runner._load(seqs)
        runs.append(1e3 * (time.perf_counter() - start) / repeats)
    return min(runs)  # the least disturbed repetition: host noise only ever adds time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=208)
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--engines", default="paged,orca-oracle")
    args = parser.parse_args()
    for engine in args.engines.split(","):
        print(f"{engine}: {load_ms(engine, args.rows, args.prompt):.3f} ms to load {args.rows} rows")


if __name__ == "__main__":
    main()
