"""Capturing a family of CUDA graphs that share one memory pool (decode and prefill buckets),
and loading the static buffers they read.

Why one routine: both the decode loop (`kvbench.real.decode_loop`, a graph per batch bucket)
and the prefill graphs (`kvbench.real.prefill_graphs`, a graph per (tokens, prompts) bucket)
need the same order of things. First every bucket runs once on a side stream, so Triton
compiles every kernel variant and cuBLAS picks its algorithms outside any capture. Then the
graphs are captured largest bucket first, each into the pool of the one before, so the smaller
ones reuse the largest one's memory instead of adding their own.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np
import torch


def load_padded(buffer: torch.Tensor, values, rows: int, fill: int = 0) -> None:
    """Write `values` then `fill` up to `rows` into `buffer[:rows]`, in one host-to-device copy
    (converted to the buffer's dtype): a graph's padding rows get what its kernels skip."""
    host = np.full(rows, fill, dtype=np.int64)
    host[: len(values)] = values
    buffer[:rows].copy_(torch.from_numpy(host), non_blocking=True)


def capture_graphs(
    device: torch.device, buckets: Sequence[Hashable], run: Callable[[Hashable], torch.Tensor], *,
    keep_outputs: bool,
) -> tuple[dict[Hashable, torch.cuda.CUDAGraph], dict[Hashable, torch.Tensor]]:  # fmt: skip
    """Warm up, then capture `run(bucket)` for each of `buckets` (largest first) in one pool.
    Returns the graphs and, with `keep_outputs`, each graph's output tensor (valid after its
    replay, until another graph of the pool replays); without it each output's memory goes back
    to the pool for the next capture."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for bucket in buckets:
            run(bucket)
    torch.cuda.current_stream(device).wait_stream(side)
    graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
    outputs: dict[Hashable, torch.Tensor] = {}
    pool = None
    for bucket in buckets:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            output = run(bucket)
        if keep_outputs:
            outputs[bucket] = output
        del output
        pool = graph.pool()
        graphs[bucket] = graph
    torch.cuda.synchronize(device)
    return graphs, outputs
