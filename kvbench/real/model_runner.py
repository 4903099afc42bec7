"""The real runner: a scheduled batch through the model, on the device, timed.

Every engine uses this same runner; only the addressing differs (a block table or an extent,
straight from the engine's allocator). A prefill step runs eagerly, or, with `prefill_graphs`,
a short one (at most 256 tokens of 16 sequences) replays a CUDA graph of its bucket
(`kvbench.real.prefill_graphs`); a decode segment of k steps stays on the device
(`kvbench.real.decode_loop`, CUDA graphs where available) and syncs once, unless an arrival may
cut it, when each step is checked against the arrival.

Step times are wall time: a segment's steps sum exactly to the time from the start of input
preparation to the sampled tokens being on the host, so host-side overhead counts. On CUDA
the steps are split by events recorded between them; the first step carries the host work.

A virtual step clock (`clock=`, a `CostModel`) replaces measured times by modelled ones: the
model still decodes every token, but the durations the engine sees, and where a segment is cut
at the next arrival, come from the cost model (`CostModelRunner`, the simulator's own pricing,
sliding-window layers included: `KvReads` of the model's KV groups).
Why: with wall time, whether a request is preempted, swapped or admitted beside another depends
on how fast the machine is at that moment; a test of those schedules would pass or fail with the
load on the box. With a virtual clock a real run's schedule is a function of its inputs.

Sequence groups (`engines.groups`): a step with beams runs one decode step (graphed where the
runner was built with `keep_logits`, else eager) and hands each beam's candidates, ranked from
that step's logits, back (`kvbench.real.sampling`), as does a prefill for its beams and for a
parallel-sampling prompt (every sample's first token).
K/V copies the allocator asked for (copy-on-write blocks, contiguous forks' slot ranges) are
made before the step.

A `vmm` run over a `VirtualKVArena` maps the pages the allocator holds before each call's
steps, inside its timed work (`vmm_map="sync"`); with `"ahead"`, once a decode segment is
launched, the allocator reserves the pages the batch reaches in the next segment
(`VirtualAllocator.look_ahead`) and the arena maps them while the device runs, so that segment
finds them mapped. Kernels and graphs are the contiguous ones: addresses never move.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from engines.allocator import BlockTable, Extent, KVAllocator
from engines.hybrid import group_shapes
from engines.scheduler import Batch
from kernels.splits import MIN_SPLIT_TOKENS, choose_num_splits, mixed_step_launches
from kvbench.cost_model import CostModel, CostModelRunner, KvReads
from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata, resolve_backend
from kvbench.modeling.causal_lm import CausalLM
from kvbench.modeling.sampling import sample
from kvbench.modeling.virtual_arena import VirtualKVArena
from kvbench.real.block_tables import block_table_array
from kvbench.real.decode_loop import DecodeLoop
from kvbench.real.grouped_arena import GroupedKVArena
from kvbench.real.kv_copies import ArenaCopies
from kvbench.real.prefill_graphs import PrefillGraphs, prefill_bucket, static_prefill
from kvbench.real.sampling import branches_of, wants_logits
from kvbench.requests import Request, group_number
from kvbench.runner import StepResult
from kvbench.sequence import Sequence


class ModelRunner(ArenaCopies):
    allocates_ahead = True  # a segment's slots must exist before its steps write them

    def __init__(
        self, model: CausalLM, arena: KVArena, allocator: KVAllocator, *, max_batch: int, max_len: int,
        temperature: float = 0.0, seed: int = 0, attention: str = "auto", cuda_graphs: bool = True,
        keep_logits: bool = False, warm_up: bool = True, clock: CostModel | None = None,
        vmm_map: str = "sync", prefill_graphs: bool = False,
    ) -> None:  # fmt: skip
        self.model = model
        # None: steps last what they take; a cost model: what it says (see the module docstring),
        # window layers priced on what they read, as the simulator prices the same model
        reads = KvReads.of(group_shapes(model.spec.groups))
        self.clock = None if clock is None else CostModelRunner(clock, reads)
        self.arena = arena
        self.allocator = allocator
        # a virtual arena backs only the pages its allocator (a VirtualAllocator) holds
        self.virtual = arena if isinstance(arena, VirtualKVArena) else None
        self.map_ahead = vmm_map == "ahead"
        # a table per KV group over one buffer (`hybrid`, `jenga` on a window model): each layer
        # reads its group's table, from the allocator's `memory_tables`
        self.grouped = arena if isinstance(arena, GroupedKVArena) else None
        self.temperature = temperature
        self.seed = seed
        self.device = arena.k[0].device
        self.backend = resolve_backend(attention, self.device)
        paged = hasattr(allocator, "block_size")
        self._block_lists = getattr(allocator, "block_lists", None)  # a paged allocator's own tables
        self.decoder = DecodeLoop(
            model, arena, max_batch=max_batch, max_len=max_len,
            block_size=allocator.block_size if paged else 0, paged=paged,
            backend=self.backend, temperature=temperature, seed=seed, keep_logits=keep_logits,
            num_tables=self.grouped.num_tables if self.grouped is not None else 1,
        )  # fmt: skip
        # graphs need kernels that read context lengths on the device (the reference syncs)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda" and self.backend == "triton"
        if self.cuda_graphs:
            self.decoder.capture()
        if warm_up and self.device.type == "cuda":
            self.warm_up()
        # short prefills from static buffers, replayed as graphs where decode steps are (without
        # graphs, the same buffers run eagerly: what the CPU tests check)
        self.prefill_graphs = None
        if prefill_graphs and static_prefill(model, self.decoder.num_tables):
            self.prefill_graphs = PrefillGraphs(
                model, arena, block_size=self.decoder.block_size, max_len=max_len, backend=self.backend
            )
            if self.cuda_graphs:
                self.prefill_graphs.capture()
        self._prompts: dict[int, np.ndarray] = {}  # request id -> prompt token ids
        self._host = self._swap_space()  # made now: pinning takes seconds

    def run(self, batch: Batch, max_steps: int, start_s: float, until_s: float) -> StepResult:
        if self.clock is None:
            return self._execute(batch, max_steps, until_s - start_s)
        # virtual: the steps the cost model prices, cut where it puts the next arrival (the
        # wall-clock rule, `step_ends`), then decoded for real; a prefill or a beam step is one
        one = batch.is_prefill or (batch.has_groups and wants_logits(batch.seqs))
        durations = self.clock.run(batch, 1 if one else max_steps, start_s, until_s).durations  # (k,)
        result = self._execute(batch, len(durations), math.inf)
        return StepResult(durations, result.tokens, result.branches)

    def _execute(self, batch: Batch, max_steps: int, budget_s: float) -> StepResult:
        """Run `batch` on the device, timed: a decode segment of up to `max_steps` steps stops
        after the first step ending `budget_s` or more after the call began."""
        start = time.perf_counter()
        self._map_pages(batch.seqs)
        self._swap(batch)
        self._copy_blocks(batch.block_copies)
        self._copy_slots(batch.slot_copies)
        if batch.is_prefill:
            tokens, branches = self._prefill(batch)
            # a mixed step's non-final chunks sample nothing (None), the other rows one token each
            rows = [[] if t is None else [t] for t in tokens]
            return StepResult(np.array([time.perf_counter() - start]), rows, branches)
        if batch.has_groups and wants_logits(batch.seqs):
            return self._decode_with_logits(batch, start)
        return self._decode(batch, max_steps, start, budget_s)

    # ------------------------------------------------------------------ prefill
    def _prefill(self, batch: Batch) -> tuple[list[int | None], dict | None]:
        """Compute each sequence's positions [num_computed, hi) against its context and sample a
        token for every row that reaches its end (hi = num_tokens; a mixed step's non-final
        chunks stop short: their entry is None). The prefix-aware kernels attend each row's
        queries over everything computed before them, so chunks and 1-token decode rows run
        here as they would alone. The leading rows of one new token (a mixed step's running
        decodes: the chunked scheduler puts them first) attend through the decode kernel
        (`AttentionMetadata.decode_rows`), their contexts split over several programs as a decode
        step's are."""
        ids, positions, seqlens = [], [], []
        tables = self._tables(batch.seqs)  # [table][seq]: one table, or one per KV group
        ends = batch.computed_to()  # [B] hi: num_tokens, or a chunk's end
        for seq, hi in zip(batch.seqs, ends, strict=True):
            lo = seq.num_computed
            ids.append(self._token_ids(seq, lo, hi))
            positions.append(np.arange(lo, hi))  # [n] positions computed in this step
            seqlens.append(hi - lo)
        dev = self.device
        decode_rows = next((i for i, n in enumerate(seqlens) if n != 1), len(seqlens))  # leading 1-token rows
        bucket = prefill_bucket(sum(seqlens), len(seqlens)) if self.prefill_graphs is not None else None
        if bucket is not None and decode_rows == 0 and batch.chunks is None and not batch.has_groups:
            return self._prefill_static(batch, bucket, ids, positions, seqlens, ends, tables[0]), None
        cu = torch.tensor(np.concatenate([[0], np.cumsum(seqlens)]), device=dev)  # [B + 1]
        addressed = [_step_addressing(table, positions, dev) for table in tables]
        # [T] slots per table, stacked so every table's mapping is padded and uploaded in one go
        slots = np.stack([table_slots for table_slots, _ in addressed])  # [tables, T]
        input_ids, pos, slot_mapping = pad_prefill(
            *(torch.from_numpy(np.concatenate(parts)).to(dev) for parts in (ids, positions)),
            torch.from_numpy(slots).to(dev),
        )  # [T + pad], [T + pad], [tables, T + pad]
        slot_maps = slot_mapping.unbind(0)
        context = torch.tensor(ends, dtype=torch.int32, device=dev)  # [B]
        splits = self._decode_splits(decode_rows, max(ends[:decode_rows], default=0))
        decode_rows = decode_rows if splits is not None else 0  # MLA: every row through its own path
        metas = [
            AttentionMetadata(
                True,
                slot_mapping,
                cu,
                context,
                max_new=max(seqlens),
                backend=self.backend,
                num_splits=splits,
                decode_rows=decode_rows,
                **addressing,
            )
            for slot_mapping, (_, addressing) in zip(slot_maps, addressed, strict=True)
        ]
        meta = metas[0] if len(metas) == 1 else replace(metas[0], per_table=tuple(metas))
        with torch.inference_mode():
            logits = self.model(input_ids, pos, meta, self.arena)  # [B, V]
            last = pos[cu[1:] - 1]  # [B] position of each sampled token's input
            keys = torch.tensor([seq.sample_key for seq in batch.seqs], device=dev)
            if batch.chunks is not None:
                return self._sample_rows(batch, logits, keys, last), None
            tokens = sample(logits, self.temperature, self.seed, keys, last).tolist()
            if not batch.has_groups:
                return tokens, None
            return tokens, branches_of(batch.seqs, logits, last, self.temperature, self.seed)

    def _prefill_static(
        self, batch: Batch, bucket: tuple[int, int], ids: list[np.ndarray], positions: list[np.ndarray],
        seqlens: list[int], ends: list[int], table: list[Extent | BlockTable],
    ) -> list[int]:  # fmt: skip
        """`_prefill` of a short step through the static buffers of its `bucket` (replayed from
        its graph where one was captured): the same tokens, sampled at each row's last position."""
        slots, addressing = _host_addressing(table, positions)  # [T], block tables [B, w] or starts [B]
        where = addressing.get("block_tables", addressing.get("starts"))
        graphs = self.prefill_graphs
        graphs.load(bucket, np.concatenate(ids), np.concatenate(positions), slots, seqlens, ends, where)
        with torch.inference_mode():
            logits = graphs.run(bucket)[: len(seqlens)]  # [B, V]
            last = torch.tensor([end - 1 for end in ends], device=self.device)  # [B] last inputs' positions
            keys = torch.tensor([seq.sample_key for seq in batch.seqs], device=self.device)
            return sample(logits, self.temperature, self.seed, keys, last).tolist()

    def _decode_splits(self, rows: int, longest: int) -> int | None:
        """Split-KV partitions for a prefill's `rows` 1-token rows of at most `longest` positions
        (None: no such rows); an MLA model's prefill attends through its own path, which has none."""
        if rows == 0 or self.model.spec.mla is not None:
            return None
        return choose_num_splits(rows, self.arena.k[0].shape[-2], longest, self.device)

    def _sample_rows(
        self, batch: Batch, logits: torch.Tensor, keys: torch.Tensor, last: torch.Tensor
    ) -> list[int | None]:
        """Sample only the rows of a mixed step that produce a token (logits `[B, V]`, keys and
        positions `[B]`); None for the non-final chunks."""
        samples = batch.samples()
        rows = torch.tensor([i for i, s in enumerate(samples) if s], dtype=torch.int64, device=logits.device)
        if len(rows) == 0:
            return [None] * len(samples)
        drawn = iter(sample(logits[rows], self.temperature, self.seed, keys[rows], last[rows]).tolist())
        return [next(drawn) if s else None for s in samples]

    def warm_up(self) -> tuple[tuple[int, int], ...]:
        """Run the prefill path once before any step is timed: one sequence of 16 padding tokens
        (slot -1: nothing is stored; attention reads block 0, or slots 0-15, and writes nothing),
        its output dropped; then a mixed step's decode rows once per decode launch they can take
        (`kernels.splits.mixed_step_launches`), 1-token padding rows over `splits` x 128
        positions. Returns the (decode rows, splits) launches run: a contiguous arena skips
        those that would read past it (a virtual one, past its first range), and an MLA model
        (whose prefill attends through its own path, unsplit) runs none.

        Why: Triton compiles a kernel the first time it meets a variant, and the decode graphs'
        capture compiles only the decode path. On a fresh H200 the paged prefill kernel's first
        call took 806 ms inside the first timed step of a Figure 2 run, with every request
        waiting; with a recompile 403 ms later (see `kernels.extend_attention`), it cut paged's
        token-state share from about 97 % to 84 %. A mixed step's split count is a compile-time
        constant too: without the second pass, Gemma 3 12B's first mixed steps at each new
        count took 1.1-1.7 s (results/reference/hybrid-long-chunked-split-real).
        """
        self._padding_pass(1, 16, max_new=16)
        if self.model.spec.mla is not None:
            return ()
        kv_heads = self.arena.k[0].shape[-2]
        dev = self.device
        sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
        # a contiguous arena's launches stay within its slots; a virtual one's within range 0,
        # the only range its warm-up can back (`VirtualKVArena.scratch`), which no request of
        # the run outgrows either
        reach = self.arena.k[0].shape[0] if self.virtual is None else self.virtual.range_slots
        ran = []
        for rows, splits in mixed_step_launches(kv_heads, sms):
            # one split is what any shorter context takes too, so it is warmed within any reach
            context = splits * MIN_SPLIT_TOKENS if splits > 1 else min(MIN_SPLIT_TOKENS, reach)
            if self.decoder.paged or context <= reach:
                self._padding_pass(rows, context, max_new=1, num_splits=splits, decode_rows=rows)
                ran.append((rows, splits))
        return tuple(ran)

    def _padding_pass(self, rows: int, context: int, *, max_new: int, **meta: int) -> None:
        """One forward pass of `rows` padding sequences, each computing its last `max_new` of
        `context` positions (slot -1: nothing stored), reading block 0 (paged) or slots 0 on
        (contiguous); the output dropped."""
        dev = self.device
        if self.decoder.paged:
            size = self.allocator.block_size
            where = BlockTable((0,) * -(-context // size), size)  # block 0 for every position
        else:
            where = Extent(0, context, context)
        positions = torch.arange(context - max_new, context, device=dev).repeat(rows)  # [R x new]
        ids = torch.zeros_like(positions)  # [R x new]
        attention = AttentionMetadata(
            True, torch.full_like(ids, -1), torch.arange(rows + 1, device=dev) * max_new,
            torch.full((rows,), context, dtype=torch.int32, device=dev),
            max_new=max_new, backend=self.backend, **meta, **_step_addressing([where] * rows, [], dev)[1],
        )  # fmt: skip
        scratch = self.virtual.scratch(context) if self.virtual is not None else nullcontext()
        with torch.inference_mode(), scratch:  # a virtual arena backs the slots it reads meanwhile
            self.model(ids, positions, attention, self.arena)

    # ------------------------------------------------------------------ decode segments
    def _decode(self, batch: Batch, max_steps: int, start: float, budget_s: float) -> StepResult:
        """Up to `max_steps` steps; stop after the first ending `budget_s` or more after `start`."""
        seqs = batch.seqs
        loop = self.decoder
        rows = self._load(seqs)
        out = torch.empty((max_steps, len(seqs)), dtype=torch.int64, device=self.device)  # [k, B]
        clock = _StepClock(self.device, start)
        cut = math.isfinite(budget_s)  # an arrival may end the segment: check each step's end
        for k in range(1, max_steps + 1):
            loop.run_step(rows)
            out[k - 1].copy_(loop.input_ids[: len(seqs)])
            if clock.mark(wait=cut) >= budget_s:
                break
        self._map_ahead(seqs, k)  # while the steps run on the device
        tokens = out[:k].T.tolist()  # [B][k]; waits for the last step
        return StepResult(clock.durations(), tokens)

    def _decode_with_logits(self, batch: Batch, start: float) -> StepResult:
        """One decode step whose logits also go to the groups (beam candidates)."""
        seqs, loop = batch.seqs, self.decoder
        n = len(seqs)
        rows = self._load(seqs)
        clock = _StepClock(self.device, start)
        with torch.inference_mode():
            positions = loop.positions[:n].clone()  # [n] the step moves them on
            logits = loop.run_step(rows, logits=True)[:n]  # [n, V]
            branches = branches_of(seqs, logits, positions, self.temperature, self.seed)
            tokens = loop.input_ids[:n].tolist()  # sampled in the step, from the same logits
        clock.mark(wait=False)
        return StepResult(clock.durations(), [[t] for t in tokens], branches)

    def _map_pages(self, seqs: tuple[Sequence, ...]) -> None:
        """Back exactly the pages the allocator holds (deferred and reserved ones included)
        before the steps that write them."""
        if self.virtual is not None:
            self.virtual.sync(self.allocator.mapped_counts())

    def _map_ahead(self, seqs: tuple[Sequence, ...], steps: int) -> None:
        """Ahead, while the `steps` launched steps run: the allocator reserves the pages each
        sequence reaches in another `steps` steps (never past its final length), and the arena
        maps them. The simulator reserves the same pages at the same point
        (`CostModelRunner(lookahead=...)`), so both make the same decisions."""
        if self.virtual is None or not self.map_ahead:
            return
        self.allocator.look_ahead(seqs, steps)
        self.virtual.prefetch(self.allocator.mapped_counts())

    def _load(self, seqs: tuple[Sequence, ...]) -> int:
        """Put the batch's inputs into the decode buffers; the rows it runs with."""
        loop = self.decoder
        loop.reserve(len(seqs))
        rows = loop.rows_for(len(seqs))
        versions = None
        if loop.paged and self._block_lists is not None:
            where = self._block_lists(seqs)  # the allocator's lists: no tuple per row
        elif self.grouped is not None:
            where = self._table_lists(seqs)  # [table][seq] the allocator's lists
            versions = self.allocator.memory_versions(seqs)  # after `_table_lists`: its rows exist
        else:
            where = [self.allocator.addressing(seq) for seq in seqs]
        loop.load(
            rows, [self._last_token(seq) for seq in seqs], [seq.num_tokens - 1 for seq in seqs],
            [seq.sample_key for seq in seqs], where, versions,
        )  # fmt: skip
        return rows

    def _tables(self, seqs: tuple[Sequence, ...]) -> list[list[Extent | BlockTable]]:
        """Each sequence's addressing, `[table][seq]`: one table for every layer, or (a grouped
        arena) one per table of the allocator's `memory_layout`, freed window entries -1."""
        if self.grouped is None:
            return [[self.allocator.addressing(seq) for seq in seqs]]
        size = self.allocator.block_size
        return [[BlockTable(tuple(blocks), size) for blocks in table] for table in self._table_lists(seqs)]

    def _table_lists(self, seqs: tuple[Sequence, ...]) -> list[list[list[int]]]:
        """`[table][seq]` block ids: the allocator's own `memory_tables` lists, read, never kept
        (a decode segment compares them with what its device tables hold, as paged's `block_lists`)."""
        rows = [self.allocator.memory_tables(seq) for seq in seqs]  # [seq][table]
        return [[row[t] for row in rows] for t in range(self.grouped.num_tables)]

    def _last_token(self, seq: Sequence) -> int:
        """The id at the sequence's last position (its next decode step's input): a beam step
        loads every row again, so this skips `_token_ids`' slicing."""
        prompt, last = self.prompt_ids(seq), seq.num_tokens - 1
        return int(prompt[last]) if last < len(prompt) else seq.output_ids[last - len(prompt)]

    def prompt_ids(self, seq: Sequence) -> np.ndarray:
        """The trace's prompt ids, or seeded random ids when the trace has only lengths."""
        request = seq.request
        cached = self._prompts.get(request.request_id)
        if cached is None:
            cached = prompt_token_ids(request, self.model.spec.vocab, self.seed)
            self._prompts[request.request_id] = cached
        return cached

    def _token_ids(self, seq: Sequence, lo: int, hi: int) -> np.ndarray:
        """Ids of positions [lo, hi): prompt first, then the sampled outputs."""
        prompt = self.prompt_ids(seq)
        if hi <= len(prompt):
            return prompt[lo:hi]
        outputs = np.asarray(seq.output_ids[max(lo - len(prompt), 0) : hi - len(prompt)], dtype=np.int64)
        return np.concatenate([prompt[lo:], outputs]) if lo < len(prompt) else outputs


def padded_tokens(tokens: int) -> int:
    """A prefill's token count (at least 1) rounded up to a bucket: a multiple of 16 up to 255
    tokens, then of 1/16 of the largest power of two not above the count (so at most 15 more
    rows below 256 tokens and at most 1/16 more above; 16 buckets per doubling).

    Why: an eager prefill's GEMMs would see a new row count nearly every step, and a row count
    cuBLAS has not seen costs it a fresh algorithm choice on the host: 235-370 us per linear on
    the H200 against 14 us for a seen one; an OPT-125M prefill forward of about 1,050 tokens
    took 6.15 ms with a new count each time and 3.41 ms with the counts bucketed
    (`benchmarks/prefill_shapes.py`, results/reference/quick-opt-125m/probe/prefill_shapes.txt).
    The padding rows are computed and dropped: slot -1 (never stored), past every sequence's
    `cu_seqlens` (never attended as queries, never sampled). Their attention output is left
    uninitialised, which is harmless because every other op works row by row. Steps still
    count only the real tokens.
    """
    tokens = int(tokens)
    if tokens < 1:
        raise ValueError(f"a prefill has at least one token, got {tokens}")
    granule = max(16, (1 << (tokens.bit_length() - 1)) // 16)
    return -(-tokens // granule) * granule


def pad_prefill(
    input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prefill's packed inputs `[T]` each (slots `[T]`, or `[tables, T]`: one mapping per
    block table), padded to `padded_tokens(T)` rows: token 0 at position 0, slot -1 (never stored)."""
    pad = padded_tokens(len(input_ids)) - len(input_ids)
    return F.pad(input_ids, (0, pad)), F.pad(positions, (0, pad)), F.pad(slots, (0, pad), value=-1)


def prompt_token_ids(request: Request, vocab: int, seed: int) -> np.ndarray:
    """(prompt_len,) int64: the trace's prompt ids, or seeded random ids when it has only lengths
    (the same for every engine, external ones included).

    The first `prefix_len` random ids of a prefix group come from the group's own seed, so every
    request of the group (every uncut turn of a conversation) starts with the same tokens: a
    prefix cache hit then holds exactly the K/V the request would have computed.
    """
    if request.prompt_ids is not None:
        return np.asarray(request.prompt_ids, dtype=np.int64)
    ids = np.random.default_rng([seed, request.request_id]).integers(0, vocab, request.prompt_len)
    if request.prefix_group is not None and request.prefix_len:
        # [seed, request id] and [seed, group, 1] never name the same seed sequence
        shared = np.random.default_rng([seed, group_number(request.prefix_group), 1])
        ids[: request.prefix_len] = shared.integers(0, vocab, request.prefix_len)
    return ids


def _step_addressing(
    addressing: list[Extent | BlockTable], positions: list[np.ndarray], device: torch.device
) -> tuple[np.ndarray, dict]:
    """`_host_addressing`, its block tables or extent starts uploaded to `device`."""
    slots, arrays = _host_addressing(addressing, positions)
    return slots, {k: torch.from_numpy(v).to(device) if k != "block_size" else v for k, v in arrays.items()}


def _host_addressing(
    addressing: list[Extent | BlockTable], positions: list[np.ndarray]
) -> tuple[np.ndarray, dict]:
    """One table's view of a prefill step's rows: the arena slots of `positions` (`[n_b]` per row,
    or none given: an empty `[0]`), concatenated `[T]`, and what its kernels read, block tables
    `[B, max blocks]` int32 (padded with block 0, never read: reads stop at a row's context) or
    extent starts `[B]`, on the host.

    Why one pass: each row's table becomes a row of one array once, and every slot is read from
    that array. Converting every row twice (for its slots, then for the kernels' table) took a
    mixed step of Gemma 3 12B's long-context run 8.7 ms of host time for `hybrid`'s six tables
    and 2.8 ms for `jenga`'s two, against 3.9-4.0 and 1.3 ms now (`benchmarks/grouped_tables.py`,
    best of 30 on a 2-core CPU), all of it before the step's launches.
    """
    pos = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)  # [T]
    rows = np.repeat(np.arange(len(positions)), [len(p) for p in positions])  # [T] each position's row
    if isinstance(addressing[0], Extent):
        starts = np.array([a.start for a in addressing], dtype=np.int64)  # [B]
        return starts[rows] + pos, {"starts": starts}
    size = addressing[0].block_size
    tables = block_table_array(addressing, len(addressing), max(len(a.blocks) for a in addressing))  # [B, W]
    slots = tables[rows, pos // size].astype(np.int64) * size + pos % size  # [T]
    return slots, {"block_tables": tables, "block_size": size}


class _StepClock:
    """Per-step wall times of a decode segment, summing to the segment's wall time.

    CUDA: events between steps (no sync unless asked); the first step also carries the host
    work before it and the last the wait for the results. CPU: steps are synchronous.
    """

    def __init__(self, device: torch.device, start: float) -> None:
        self.start = start
        self.cuda = device.type == "cuda"
        self.marks: list = []
        if self.cuda:
            self.first = torch.cuda.Event(enable_timing=True)
            self.first.record()
            self.launched = time.perf_counter()

    def mark(self, *, wait: bool) -> float:
        """Record the end of a step; with `wait`, block until it ends and return its end time
        (seconds after `start`), else NaN on CUDA (compares False with any budget)."""
        if not self.cuda:
            self.marks.append(time.perf_counter())
            return self.marks[-1] - self.start
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.marks.append(event)
        if not wait:
            return math.nan
        event.synchronize()
        return self.launched - self.start + self.first.elapsed_time(event) / 1e3

    def durations(self) -> np.ndarray:
        total = time.perf_counter() - self.start
        if self.cuda:
            self.marks[-1].synchronize()
            ends = [self.first.elapsed_time(event) / 1e3 for event in self.marks]
        else:
            ends = [t - self.start for t in self.marks]
        steps = np.diff(np.concatenate(([0.0], ends)))  # (k,)
        steps[0] += total - float(steps.sum())  # host work before, and the final wait
        return steps
