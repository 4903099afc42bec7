"""Short prefill steps replayed from CUDA graphs: static buffers per (tokens, sequences) bucket.

Why: an eager prefill launches every op of every layer from Python. On OPT-13B a prefill of
one or two short prompts has a device floor of 5.6 ms (25.7 GB of weights read once at the
4.6 TB/s the roofline collector measured on the H200) and took 12 ms a step, or 20-25 ms in
stretches of a run when the host ran slower: the host sets its time. In Figure 12's Alpaca
cells paged runs about 2,000 such steps a run (1.5 prompts each), so the host's speed moves
its cells most (results/reproduce/opt-13b-h200, fig12/alpaca-seeds.md). Decode steps have
replayed graphs from the start (`kvbench.real.decode_loop`); this does the same for prefills
small enough to be host-bound.

A prefill of T tokens over B sequences runs in the smallest bucket (T', B') with T <= T' and
B <= B' (`TOKEN_BUCKETS` x `SEQ_BUCKETS`); larger ones run eagerly, where the device's work
outweighs the launches anyway. Each bucket's graph reads static buffers::

    input_ids, positions, slots [T']   cu_seqlens [B' + 1]   context [B']
    block tables [B', W] (paged) or extent starts [B'] (contiguous)  ->  logits [B', V]

Padding tokens are token 0 at position 0 with slot -1 (never stored) past the last sequence's
tokens; padding sequences hold no tokens (`cu_seqlens` repeats its end) and context 0, so the
attention kernels read nothing for them (the extend kernel's programs exit on a sequence's
token count, read on the device; its grid is sized by T', an upper bound of every sequence's
new tokens). Their logits rows are computed and dropped. A padded GEMM row costs nearly
nothing here: a short prefill's GEMMs are bound by reading the weights, not by their rows.

Graphs run on CUDA with the Triton kernels (which cap scores where a layer does, Gemma 2's),
one block table for every layer and no MLA (its prefill attends through its own path).
Elsewhere `forward` runs the same static-buffer pass eagerly, which is what the CPU tests check
against the eager prefill.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.causal_lm import CausalLM
from kvbench.real.cuda_graphs import capture_graphs, load_padded

TOKEN_BUCKETS = (16, 32, 64, 128, 256)  # tokens of a step: past 256, the device's work dominates
SEQ_BUCKETS = (1, 2, 4, 8, 16)  # sequences of a step


def prefill_bucket(tokens: int, seqs: int) -> tuple[int, int] | None:
    """The smallest (tokens, sequences) bucket holding a step, or None: it runs eagerly."""
    t = next((b for b in TOKEN_BUCKETS if b >= tokens), None)
    s = next((b for b in SEQ_BUCKETS if b >= seqs), None)
    return None if t is None or s is None else (t, s)


def static_prefill(model: CausalLM, num_tables: int) -> bool:
    """Whether this model's prefill can run from the static buffers (and so replay from a graph
    where decode graphs do): one block table, no MLA."""
    return model.spec.mla is None and num_tables == 1


class PrefillGraphs:
    """Static prefill buffers for every bucket, and (on CUDA) a graph per bucket."""

    def __init__(
        self, model: CausalLM, arena: KVArena, *, block_size: int, max_len: int, backend: str
    ) -> None:  # fmt: skip
        self.model, self.arena, self.backend = model, arena, backend
        self.block_size = block_size  # 0: contiguous (extent starts)
        dev = self.device = arena.k[0].device
        tokens, seqs = TOKEN_BUCKETS[-1], SEQ_BUCKETS[-1]
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=dev)  # [T'] token ids
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=dev)  # [T'] their positions
        self.slots = torch.full((tokens,), -1, dtype=torch.int64, device=dev)  # [T'] arena slots
        self.cu_seqlens = torch.zeros(seqs + 1, dtype=torch.int64, device=dev)  # [B' + 1]
        self.context = torch.zeros(seqs, dtype=torch.int32, device=dev)  # [B'] positions attended
        if block_size:
            width = -(-max_len // block_size)
            self.tables = torch.zeros((seqs, width), dtype=torch.int32, device=dev)  # [B', W]
            self.starts = None
        else:
            self.tables = None
            self.starts = torch.zeros(seqs, dtype=torch.int64, device=dev)  # [B']
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._logits: dict[tuple[int, int], torch.Tensor] = {}  # [B', V] each, in the graphs' pool
        self.capture_s = 0.0
        self.replays = 0  # prefill steps replayed from a graph

    # ------------------------------------------------------------------ loading a step
    def load(
        self, bucket: tuple[int, int], ids: np.ndarray, positions: np.ndarray, slots: np.ndarray,
        seqlens: list[int], context: list[int], addressing: np.ndarray,
    ) -> None:  # fmt: skip
        """Fill the buffers for one step in `bucket`: `ids`, `positions`, `slots` `[T]` packed,
        each sequence's new tokens `seqlens` and positions attended `context` `[B]`, and its
        block table row `[B, w]` (w <= W) or extent start `[B]`; the rest is padding."""
        tokens, seqs = bucket
        load_padded(self.input_ids, ids, tokens)
        load_padded(self.positions, positions, tokens)
        load_padded(self.slots, slots, tokens, fill=-1)
        # padding sequences hold no tokens: their offsets repeat the last real one
        load_padded(self.cu_seqlens, np.cumsum([0, *seqlens]), seqs + 1, fill=len(ids))
        load_padded(self.context, context, seqs)
        if self.tables is not None:
            # entries past a row's context are never read: only the step's columns are written
            rows, width = addressing.shape  # [B, w]
            self.tables[:rows, :width].copy_(torch.from_numpy(addressing), non_blocking=True)
        else:
            load_padded(self.starts, addressing, seqs)

    # ------------------------------------------------------------------ one step
    def forward(self, bucket: tuple[int, int]) -> torch.Tensor:
        """Logits `[B', V]` of the loaded step (its K/V stored); capturable: no host sync."""
        tokens, seqs = bucket
        meta = AttentionMetadata(
            True,
            self.slots[:tokens],
            self.cu_seqlens[: seqs + 1],
            self.context[:seqs],
            block_tables=None if self.tables is None else self.tables[:seqs],
            block_size=self.block_size,
            starts=None if self.starts is None else self.starts[:seqs],
            max_new=tokens,  # sizes the grid: every sequence's programs past its tokens exit
            backend=self.backend,
        )
        with torch.inference_mode():
            return self.model(self.input_ids[:tokens], self.positions[:tokens], meta, self.arena)

    def run(self, bucket: tuple[int, int]) -> torch.Tensor:
        """The loaded step's logits `[B', V]`: replayed where a graph was captured (valid until the
        next replay of any bucket), else run eagerly."""
        graph = self._graphs.get(bucket)
        if graph is None:
            return self.forward(bucket)
        graph.replay()
        self.replays += 1
        return self._logits[bucket]

    # ------------------------------------------------------------------ CUDA graphs
    def capture(self) -> None:
        """A graph per bucket, largest first (smaller ones reuse its memory pool). Every token is
        padding throughout (slot -1, context 0): neither warm-up nor capture writes the arena."""
        start = time.perf_counter()
        self.slots.fill_(-1)
        self.context.zero_()
        # one token a sequence (B' <= T' in every bucket): each picks a real row for its logits
        self.cu_seqlens.copy_(torch.arange(len(self.cu_seqlens), device=self.device))
        buckets = sorted(((t, s) for t in TOKEN_BUCKETS for s in SEQ_BUCKETS), reverse=True)
        self._graphs, self._logits = capture_graphs(self.device, buckets, self.forward, keep_outputs=True)
        self.capture_s = time.perf_counter() - start
