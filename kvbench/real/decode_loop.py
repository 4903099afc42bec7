"""Decode steps that stay on the device: static buffers, an in-place step, and CUDA graphs.

A decode segment (the same batch for k steps, see `kvbench.engine`) needs no host work after
its first step: each step feeds the token the last one sampled, one position further, into
slots the allocator already granted (`allocates_ahead`). So the step reads and updates static
device buffers in place::

    input_ids, positions --slot from table/start, context = position + 1--> model -> logits
        -> sample -> input_ids (next step's input), positions += 1

and the same code runs eagerly or replays as a CUDA graph captured per batch-size bucket. A
graph replays one launch instead of hundreds, which is most of a small model's step. Rows
past the real batch (padding up to the bucket) are invalid: slot -1 (never stored), context 0
(reads nothing), position held at 0. A step also hands back its logits. With `keep_logits` (a
run with beams: beam search ranks candidates by them) each graph keeps its step's logits in its
memory pool, valid until another graph replays, so a beam step replays its graph too and its
caller reads them at once; without it (the pool then holds one bucket's logits at a time, not
every bucket's) a step that needs its logits runs eagerly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from engines.allocator import BlockTable, Extent
from kernels.splits import choose_mla_splits, choose_num_splits
from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.causal_lm import CausalLM
from kvbench.modeling.sampling import sample
from kvbench.real.block_tables import DeviceBlockTables
from kvbench.real.cuda_graphs import capture_graphs, load_padded

MAX_GRAPH_BATCH = 512  # larger batches (a static engine's whole trace) run eagerly


def graph_buckets(max_batch: int) -> list[int]:
    """Batch sizes with a captured graph: 1, 2, 4, then every multiple of 8 up to `max_batch`.

    A batch pads up to the next bucket: at most 7 wasted rows, under 3 % from 256 rows on.
    """
    top = min(max_batch, MAX_GRAPH_BATCH)
    small = [n for n in (1, 2, 4) if n < top]
    return small + list(range(8, top + 8, 8))


class DecodeLoop:
    """Static decode buffers for up to `max_batch` sequences of up to `max_len` positions."""

    def __init__(
        self, model: CausalLM, arena: KVArena, *, max_batch: int, max_len: int, block_size: int,
        paged: bool, backend: str, temperature: float, seed: int, keep_logits: bool = False,
        num_tables: int = 1,
    ) -> None:  # fmt: skip
        self.model, self.arena = model, arena
        self.backend, self.temperature, self.seed = backend, temperature, seed
        self.block_size = block_size if paged else 0
        self.num_tables = num_tables  # > 1: a table per KV group (`hybrid`, `jenga`), paged only
        self.device = arena.k[0].device
        self.max_batch, self.max_len, self.paged = max_batch, max_len, paged
        self.keep_logits = keep_logits
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._graph_logits: dict[int, torch.Tensor] = {}  # [rows, V] each, in the graphs' pool
        self._buffers(max(graph_buckets(max_batch)[-1], max_batch))
        self.capture_s = 0.0

    def _buffers(self, rows: int) -> None:
        dev, paged = self.device, self.paged
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=dev)  # [N] each row's input token
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)  # [N] its position
        self.seq_ids = torch.zeros(rows, dtype=torch.int64, device=dev)  # [N] sampling keys
        self.valid = torch.zeros(rows, dtype=torch.int64, device=dev)  # [N] 1: a real row, 0: padding
        self.cu_seqlens = torch.arange(rows + 1, device=dev)  # [N + 1] one new token per row
        width = -(-self.max_len // self.block_size) if paged else 0
        # [N, W] kept between segments, updated where the tables changed (`kvbench.real.block_tables`)
        count = self.num_tables if paged else 0
        self.group_tables = [DeviceBlockTables(rows, width, dev) for _ in range(count)]
        self.block_tables = self.group_tables[0] if paged else None
        self.tables = self.block_tables.table if paged else None  # [N, W]
        self.starts = None if paged else torch.zeros(rows, dtype=torch.int64, device=dev)  # [N]
        spec, kv_heads = self.model.spec, self.arena.k[0].shape[-2]
        if spec.mla is not None:  # one program per (sequence, split) serves every head: its own cap
            splits = {n: choose_mla_splits(n, spec.num_heads, self.max_len, dev) for n in range(1, rows + 1)}
        else:
            splits = {n: choose_num_splits(n, kv_heads, self.max_len, dev) for n in range(1, rows + 1)}
        self._splits = splits

    def reserve(self, batch: int) -> None:
        """Room for `batch` rows. A batch beyond the buffers (a group's outputs can outnumber the
        requests a caller sized them for) regrows them, dropping the graphs (they hold the old ones)."""
        if batch > len(self.input_ids):
            self._graphs.clear()
            self._graph_logits.clear()
            self._buffers(batch)

    # ------------------------------------------------------------------ loading a batch
    def load(
        self, rows: int, tokens, positions, seq_ids, addressing: Sequence[Extent | BlockTable],
        versions: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        """Fill the first `rows` buffer rows: the batch, then padding (`rows` >= batch).

        Paged, `addressing` may also be each row's block ids alone (`PagedAllocator.block_lists`);
        with a table per KV group, it is `[table][row]` block ids (`ModelRunner._table_lists`), and
        `versions` each row's version of them (`HybridAllocator.memory_versions`), if known.
        """
        batch = len(tokens)
        load_padded(self.input_ids, tokens, rows)
        load_padded(self.positions, positions, rows)
        load_padded(self.seq_ids, seq_ids, rows)
        load_padded(self.valid, np.ones(batch, dtype=np.int64), rows)
        if self.num_tables > 1:
            for device_tables, tables in zip(self.group_tables, addressing, strict=True):
                device_tables.update(tables, rows, seq_ids, versions)
        elif self.block_tables is not None:
            if addressing and isinstance(addressing[0], BlockTable):
                addressing = [table.blocks for table in addressing]
            self.block_tables.update(addressing, rows, seq_ids)
        else:
            load_padded(self.starts, [where.start for where in addressing], rows)

    # ------------------------------------------------------------------ one step
    def step(self, rows: int) -> torch.Tensor:
        """One decode step of the first `rows` rows, in place (capturable: no host sync); its
        logits `[rows, V]`, sampled at the positions the step started from."""
        positions = self.positions[:rows]  # [n]
        with torch.inference_mode():
            logits = self.forward(rows)  # [n, V]
            tokens = sample(logits, self.temperature, self.seed, self.seq_ids[:rows], positions)  # [n]
            self.input_ids[:rows].copy_(tokens)
            self.positions[:rows].add_(self.valid[:rows])
        return logits

    def forward(self, rows: int) -> torch.Tensor:
        """Logits `[rows, V]` of the loaded rows' next tokens (their K/V stored); buffers unchanged."""
        positions = self.positions[:rows]  # [n]
        valid = self.valid[:rows].bool()  # [n]
        context = torch.where(valid, positions + 1, 0).to(torch.int32)  # [n]
        metas = []
        for device_tables in self.group_tables or [None]:
            if device_tables is not None:
                bs = self.block_size
                tables = device_tables.table[:rows]  # [n, W]
                blocks = tables.gather(1, (positions // bs)[:, None])[:, 0].long()  # [n]
                slots = blocks * bs + positions % bs
                starts = None
            else:
                tables, starts = None, self.starts[:rows]
                slots = starts + positions
            metas.append(
                AttentionMetadata(
                    False,
                    torch.where(valid, slots, -1),
                    self.cu_seqlens[: rows + 1],
                    context,
                    block_tables=tables,
                    block_size=self.block_size,
                    starts=starts,
                    num_splits=self._splits[rows],
                    backend=self.backend,
                )
            )
        meta = metas[0] if len(metas) == 1 else replace(metas[0], per_table=tuple(metas))
        with torch.inference_mode():
            return self.model(self.input_ids[:rows], positions, meta, self.arena)  # [n, V]

    # ------------------------------------------------------------------ CUDA graphs
    def capture(self, buckets: list[int] | None = None) -> None:
        """Capture one graph per bucket (largest first, so smaller ones reuse its memory pool).

        Warm-up runs compile every kernel variant first; all rows are padding throughout, so
        neither warm-up nor capture writes a slot of the arena.
        """
        start = time.perf_counter()
        buckets = sorted(buckets or graph_buckets(self.max_batch), reverse=True)
        for buffer in (self.input_ids, self.positions, self.valid):
            buffer.zero_()
        graphs, logits = capture_graphs(self.device, buckets, self.step, keep_outputs=self.keep_logits)
        self._graphs.update(graphs)
        self._graph_logits.update(logits)
        self._graphs = dict(sorted(self._graphs.items()))  # ascending: `rows_for` takes the first fit
        self.capture_s = time.perf_counter() - start

    def rows_for(self, batch: int) -> int:
        """Rows a batch runs with: its graph's bucket, else exactly its size (eagerly)."""
        return next((n for n in self._graphs if n >= batch), batch)  # buckets captured in ascending order

    def run_step(self, rows: int, *, logits: bool = False) -> torch.Tensor | None:
        """`step`, replayed from its graph where one was captured. With `logits`, the step's
        logits `[rows, V]` (a graph's, valid until the next replay of any graph; eagerly where the
        graph kept none); else None after a replay."""
        graph = self._graphs.get(rows)
        if graph is None or (logits and rows not in self._graph_logits):
            return self.step(rows)
        graph.replay()
        return self._graph_logits.get(rows)
