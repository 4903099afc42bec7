"""Real decoding through `hybrid` and `jenga`: a block table per KV group over one buffer of the pool.

A tiny Gemma-3-shaped model (five local layers of window 8, one global layer) on the CPU, fp32,
the real engine loop with a virtual clock (so the schedule is the same under any load): the
window groups free blocks that leave the window, a small budget preempts and recomputes, and
`hybrid` and `jenga` must decode exactly the greedy tokens `paged` and `static` decode. The
grouped arena's memory is poisoned with NaN first, and freed blocks again after every step, so
a layer reading a block it does not own, or a freed (-1) entry, would show in the tokens.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from engines import ENGINES
from engines.batch import SchedulerConfig
from kvbench.engine import Engine
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import ModelSpec
from kvbench.real.grouped_arena import GroupedKVArena
from kvbench.real.model_runner import ModelRunner
from kvbench.requests import Request, Trace
from tests.support import VIRTUAL_CLOCK, compiled_variants
from tests.test_modeling import engine_options
from tests.test_real_window_pricing import GEMMA3_TINY

CPU = torch.device("cpu")
GEMMA3 = GEMMA3_TINY  # five window layers of 8 tokens per global one, as Gemma 3
# Gemma 2's alternation: two groups of equal layer count (hybrid pages of 2 layers, jenga of 2 blocks)
GEMMA2 = ModelSpec(
    "tiny-gemma2", "gemma2", 4, 64, 4, 2, 128, 512, 64, norm_eps=1e-6, rope_theta=1e4, head_size=32,
    window=8, window_layers=(0, 2), tied_embeddings=True, query_scale=24.0, attn_softcap=50.0,
    final_softcap=30.0,
)  # fmt: skip
SLOTS = 72  # small: hybrid and jenga preempt (static reserves 64 a request)


def trace() -> Trace:
    """Eight requests, contexts up to 63 tokens (nearly eight windows), arriving together."""
    rng = np.random.default_rng(1)
    prompts, outputs = rng.integers(6, 26, 8), rng.integers(20, 38, 8)
    pairs = enumerate(zip(prompts, outputs, strict=True))
    return Trace("hybrid", tuple(Request(i, 0.0, int(p), int(o)) for i, (p, o) in pairs))


class PoisoningRunner(ModelRunner):
    """After each call, checks the allocator (its memory tables included) and that no two blocks
    (nor two layers) share memory (`owners`), then NaN into the memory of every block the
    allocator does not hold: a freed window block, a page back in the pool. A later read of it
    would turn the logits to NaN."""

    checked = 0  # calls checked
    freed = 0  # most freed (-1) table entries seen after a call
    copied = 0  # copy-on-write blocks copied
    behind = 0  # most blocks a window group's table spanned short of a full group's after a call

    def _copy_blocks(self, copies):
        self.copied += len(copies)
        super()._copy_blocks(copies)

    def run(self, batch, max_steps, start_s, until_s):
        result = super().run(batch, max_steps, start_s, until_s)
        if self.grouped is not None:
            self.allocator.check_integrity()  # the memory tables kept as they change: as built anew
            self.grouped.buffer[owners(self.allocator, self.grouped) < 0] = float("nan")
            self.checked += 1
            tables = [self.allocator.memory_tables(seq) for seq in self.allocator._tables]
            self.freed = max(self.freed, sum(row.count(-1) for seq in tables for row in seq))
            for groups in self.allocator._tables.values():
                lengths = [len(t) for t, shape in zip(groups, self.allocator.shapes, strict=True)]
                self.behind = max(self.behind, max(lengths) - min(lengths))
        return result


def owners(allocator, arena: GroupedKVArena) -> np.ndarray:
    """`[elements]` of the arena's buffer: the block holding each (-1: none), from the allocator's
    own bookkeeping (`block_bytes` of every block it holds); asserts that no element belongs to
    two blocks, and that every layer's K and V view of every table entry of every resident
    sequence lies in that entry's block and fills it exactly, no element of it twice."""
    unit = arena._unit
    owner = np.full(arena.buffer.numel(), -1, dtype=np.int64)
    for block in allocator._group_of:
        for first, size in allocator.block_bytes(block):
            span = owner[first // unit : (first + size) // unit]
            assert (span == -1).all(), f"block {block} overlaps block {span.max()}"
            span[:] = block
    bs = allocator.block_size
    for seq, tables in allocator._tables.items():
        ids = allocator.memory_tables(seq)
        for block in {b for table in tables for b in table if b is not None}:
            seen = []
            for t, layout in enumerate(arena.layout):
                for index in (i for i, b in enumerate(tables[layout.group]) if b == block):
                    for layer, _ in layout.layers:
                        for view in (arena.k[layer], arena.v[layer]):
                            first = view.storage_offset() + ids[t][index] * bs * view.stride(0)
                            rows = first + np.arange(bs)[:, None] * view.stride(0)  # [bs, 1]
                            seen.append((rows + np.arange(view[0].numel())[None, :]).ravel())
            seen = np.concatenate(seen)
            assert (owner[seen] == block).all(), f"a layer of block {block} reads another block's memory"
            assert len(np.unique(seen)) == len(seen) == (owner == block).sum(), f"block {block} not tiled"
        for t, layout in enumerate(arena.layout):  # freed entries are -1, never an old id
            freed = [i for i, b in enumerate(tables[layout.group]) if b is None]
            assert all(ids[t][i] == -1 for i in freed)
    return owner


GROUPED = ("hybrid", "jenga", "hybrid-prefix", "jenga-prefix")  # a table per KV group


def engine_and_arena(
    spec: ModelSpec, engine: str, slots: int, block_size: int, scheduler: SchedulerConfig | None,
    dtype: torch.dtype, device: torch.device,
) -> tuple:  # fmt: skip
    """The engine's scheduler over `slots` and the arena its runner writes: a grouped one (a table
    per KV group over the pool's buffer) for the engines that keep one, else the plain arena."""
    options = engine_options(slots, block_size=block_size)
    if scheduler is not None:
        options = replace(options, scheduler=scheduler)
    if engine in GROUPED:
        options = replace(options, kv_groups=spec.groups)
    sched = ENGINES[engine].build(options)
    if engine in GROUPED:
        return sched, GroupedKVArena.for_allocator(spec, sched.allocator, dtype, device)
    return sched, KVArena(spec, slots, dtype, device)


def decode(
    spec: ModelSpec, engine: str, *, attention: str = "torch", slots: int = SLOTS, requests=None,
    temperature: float = 0.0, scheduler: SchedulerConfig | None = None, device: torch.device = CPU,
):  # fmt: skip
    model = random_model(spec, torch.float32, device, seed=3)
    sched, arena = engine_and_arena(spec, engine, slots, 4, scheduler, torch.float32, device)
    grouped = engine in GROUPED
    arena.fill(float("nan"))
    runner = PoisoningRunner(
        model, arena, sched.allocator, max_batch=8, max_len=64, temperature=temperature, seed=5,
        attention=attention,
        clock=VIRTUAL_CLOCK,
    )  # fmt: skip
    work = requests or trace()
    run = Engine(sched, runner).run(work)
    assert [len(seq.output_ids) for seq in run.sequences] == [r.output_len for r in work.requests]
    assert runner.checked or not grouped
    members = [seq.group.members if seq.group else (seq,) for seq in run.sequences]
    return [tuple(tuple(m.output_ids) for m in group) for group in members], run, runner


@pytest.mark.parametrize("spec", [GEMMA3, GEMMA2], ids=["gemma3", "gemma2"])
def test_hybrid_and_jenga_decode_what_paged_and_static_decode(spec):
    """Also checked after every call of `hybrid` and `jenga` (`owners`): each group's blocks come
    from one buffer of the pool's bytes (the budget less its tail) and no two blocks, nor two
    layers, share a byte; the window groups really freed blocks, and requests were preempted."""
    tokens, runners = {}, {}
    for engine in ("paged", "static", "hybrid", "jenga"):
        tokens[engine], run, runners[engine] = decode(spec, engine)
        preempted = sum(seq.num_preemptions for seq in run.sequences)
        assert preempted or engine == "static", f"{engine} never preempted"
    assert len({tuple(t) for t in tokens.values()}) == 1, tokens
    for engine in ("hybrid", "jenga"):
        runner = runners[engine]
        pool = runner.allocator.pool
        assert runner.arena.nbytes == pool.num_pages * pool.page_bytes * 2  # fp32: twice the spec's 2 bytes
        assert pool.num_pages * pool.page_bytes <= SLOTS * spec.kv_bytes_per_token  # the budget
        assert runner.checked > 20 and runner.freed >= 10, engine
    assert max(r.prompt_len + r.output_len for r in trace().requests) > 4 * spec.window


CHUNKED = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=10, chunked_prefill=True)


def test_chunked_window_groups_taking_blocks_chunk_by_chunk_decode_what_paged_decodes():
    """Under chunked prefill (10-token steps) a window group takes a prompt's blocks chunk by
    chunk (`HybridAllocator.target_blocks`) while the full group takes them all at admission:
    the tokens are still those `paged` decodes, chunked and not, with freed memory poisoned."""
    long_prompts = Trace("long", tuple(Request(i, 0.0, p, 6) for i, p in enumerate((41, 30, 55, 12))))
    expected, _, _ = decode(GEMMA3, "paged", requests=long_prompts)
    assert decode(GEMMA3, "paged", requests=long_prompts, scheduler=CHUNKED)[0] == expected
    for engine in ("hybrid", "jenga"):
        tokens, _, runner = decode(GEMMA3, engine, requests=long_prompts, scheduler=CHUNKED)
        assert tokens == expected, engine
        assert runner.allocator.step_tokens == 10 and runner.freed >= 10, engine
        assert runner.behind >= 5, engine  # a 55-token prompt's window group: 3 blocks of 14 at first
    assert max(r.prompt_len for r in long_prompts.requests) > 4 * GEMMA3.window + 10


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("engine", ["paged", "hybrid", "jenga"])
def test_a_chunked_run_compiles_no_kernel_after_the_warm_up(engine):
    """On CUDA a runner captures its decode graphs and warms up when built (`ModelRunner.warm_up`);
    a chunked run whose mixed steps put 1 to 5 decode rows before their chunks (so the chunks'
    per-sequence arrays start at every alignment: 4 int32 rows are 16 bytes) then compiles no
    kernel: a compile inside a timed step would add a second or more to it. The virtual clock
    makes the schedule the CPU's: mixed steps of 1 to 6 rows."""
    cuda = torch.device("cuda")
    model = random_model(GEMMA3, torch.bfloat16, cuda, seed=3)
    sched, arena = engine_and_arena(GEMMA3, engine, 4096, 16, CHUNKED, torch.bfloat16, cuda)
    runner = ModelRunner(
        model, arena, sched.allocator, max_batch=8, max_len=64, attention="triton", clock=VIRTUAL_CLOCK
    )
    compiled = compiled_variants()
    rng = np.random.default_rng(2)
    lengths = zip(rng.integers(12, 40, 16), rng.integers(8, 24, 16), strict=True)
    requests = tuple(Request(i, 0.02 * i, int(p), int(o)) for i, (p, o) in enumerate(lengths))
    run = Engine(sched, runner).run(Trace("staggered", requests))
    assert all(seq.num_generated == seq.request.output_len for seq in run.sequences)
    mixed = {row.batch_size for row in run.steps if row.kind == "mixed"}
    assert {2, 3, 4, 5, 6} <= mixed, mixed
    assert compiled > 0 and compiled_variants() == compiled


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gemma2_capped_layers_decode_through_the_triton_kernels_on_cuda():
    """Gemma 2's score cap (50) inside the compiled Triton kernels, decode steps replayed from CUDA
    graphs: `paged`, and `hybrid` and `jenga` through a table per group, decode the greedy tokens
    PyTorch's capped attention decodes under `paged` (fp32, freed memory poisoned)."""
    cuda = torch.device("cuda")
    expected = decode(GEMMA2, "paged", device=cuda)[0]
    for engine in ("paged", "hybrid", "jenga"):
        assert decode(GEMMA2, engine, attention="triton", device=cuda)[0] == expected, engine


def test_triton_kernels_read_each_group_through_its_own_table():
    """The same under the Triton kernels (interpreted on the CPU) against PyTorch attention under
    `paged`: the kernels' window bound starts each window layer's reads at its window's block, so
    a freed (-1, NaN-poisoned) entry is never read. A prompt of 21 tokens: the step after the
    prefill frees its first three blocks, the last step four (window 8, blocks of 4)."""
    work = Trace("triton", (Request(0, 0.0, 21, 4),))
    expected = decode(GEMMA3, "paged", requests=work)[0]
    for engine in ("hybrid", "jenga"):
        tokens, _, runner = decode(GEMMA3, engine, attention="triton", requests=work)
        assert tokens == expected and runner.freed >= 3, engine


NAN = float("nan")


def poisoned_cache(blocks: int, bs: int, heads: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V `[blocks x bs, heads, dim]`, random, inside buffers of NaN: a block's worth before
    (where a -1 entry leads a kernel's pointer) and one more block after (where it leads torch's
    negative indexing), so that reading through a -1 entry shows."""
    caches = []
    for _ in range(2):
        buffer = torch.full(((blocks + 2) * bs, heads, dim), NAN)
        buffer[bs : (blocks + 1) * bs] = torch.randn(blocks * bs, heads, dim)
        caches.append(buffer[bs:])  # its last block is NaN too
    return caches[0], caches[1]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_freed_entry_is_never_dereferenced(backend):
    """Window 8, blocks of 4, 21 positions: a decode query at 20 reads 13..20 (blocks 3-5), a
    prefill of positions 13..20 reads from 6 (blocks 1-5). Tables with the blocks before those
    as -1 give the same finite output as whole tables, on both attention paths."""
    from kernels.decode_attention import decode_attention
    from kernels.extend_attention import extend_attention
    from kvbench.modeling.window_attention import decode_window_attention, extend_window_attention

    torch.manual_seed(0)
    bs, window = 4, 8
    k, v = poisoned_cache(6, bs, 2, 32)
    whole = torch.tensor([[4, 0, 5, 2, 1, 3]], dtype=torch.int32)
    lens = torch.tensor([21], dtype=torch.int32)
    q = torch.randn(1, 4, 32)

    def freeing(freed: int) -> dict:
        """The attention arguments with the table's first `freed` entries -1."""
        table = whole.clone()
        table[0, :freed] = -1
        return dict(scale=0.2, block_tables=table, block_size=bs, window=window)

    decoded = []
    for freed in (0, 3):
        kwargs = freeing(freed)
        if backend == "triton":
            decoded += [decode_attention(q, k, v, lens, num_splits=n, **kwargs) for n in (1, 2)]
        else:
            decoded.append(decode_window_attention(q, k, v, lens, **kwargs))
    assert all(torch.isfinite(out).all() and torch.allclose(out, decoded[0], atol=1e-5) for out in decoded)
    new = torch.randn(8, 4, 32)
    cu = torch.tensor([0, 8])
    extended = []
    for freed in (0, 1):
        kwargs = freeing(freed)
        if backend == "triton":
            extended.append(extend_attention(new, k, v, cu, lens, max_new=8, **kwargs))
        else:
            extended.append(extend_window_attention(new, k, v, cu, lens, **kwargs))
    assert all(torch.isfinite(out).all() and torch.allclose(out, extended[0], atol=1e-5) for out in extended)


def test_parallel_samples_copy_shared_blocks_in_their_group_memory():
    """Three samples a request at temperature 0.8: the samples share the prompt's blocks in every
    group and copy the last one on its first write (`copy_bytes`, a block's bytes in the one
    buffer); every sample draws what it draws under `paged`."""
    rng = np.random.default_rng(5)
    work = Trace(
        "samples", tuple(Request(i, 0.0, int(p), 14, n=3) for i, p in enumerate(rng.integers(9, 19, 3)))
    )  # fmt: skip
    expected = decode(GEMMA3, "paged", requests=work, temperature=0.8, slots=200)[0]
    assert any(len(set(samples)) == 3 for samples in expected)  # the samples differ
    for engine in ("hybrid", "jenga"):
        tokens, _, runner = decode(GEMMA3, engine, requests=work, temperature=0.8, slots=200)
        assert tokens == expected, engine
        assert runner.copied >= 2 * len(work.requests) and runner.freed > 0, engine


def test_kvbench_run_decodes_through_hybrid(tmp_path):
    """`kvbench run --engine hybrid` on a Gemma 3 checkpoint: the CLI builds the grouped arena,
    within the budget (the tail no page uses left out), and every request completes."""
    import json

    from tests.test_cli import kvbench
    from tests.test_families import reference

    pytest.importorskip("transformers")
    _, folder = reference(tmp_path, "gemma3")
    out = tmp_path / "run"
    proc = kvbench(
        "run", "--engine", "hybrid", "--model", str(folder), "--device", "cpu", "--kv-cache-gib", "0.0002",
        "--trace", "uniform:prompt=4..30,output=10..30", "--num-requests", "4", "--rate", "20",
        "--attention", "torch", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["mode"], summary["completed"]) == ("real", 4)
    layer = 2 * 2 * 32 * 4  # a token's K and V in one layer: 2 heads of 32, fp32
    budget, page = summary["arena_slots"] * 6 * layer, 16 * layer  # a page: 16 tokens of one layer (u)
    assert budget - page < summary["arena_bytes"] <= budget  # the pool: the budget less its tail


def test_beams_fork_and_copy_in_every_group():
    """Beam search (width 3): beams are re-forked every step, sharing blocks in every group and
    copying on write; each beam's tokens are those `paged` finds."""
    prompts = np.random.default_rng(2).integers(9, 19, 3)
    work = Trace("beams", tuple(Request(i, 0.0, int(p), 10, beam_width=3) for i, p in enumerate(prompts)))
    expected = decode(GEMMA3, "paged", requests=work, slots=300)[0]
    for engine in ("hybrid", "jenga"):
        tokens, _, runner = decode(GEMMA3, engine, requests=work, slots=300)
        assert tokens == expected and runner.copied > 0 and runner.freed > 0, engine


def test_a_hybrid_page_layout_that_would_split_a_layer_is_a_one_line_error():
    """One window layer of 3 x 64 B a token beside one full layer of 2 x 64 B: u = 64 B, so a
    window block is 3 pages holding one layer, which no strided view can address."""
    from engines.hybrid import HybridAllocator, JengaAllocator
    from kvbench.errors import KvbenchError
    from kvbench.kvspec.layers import FullAttention, KVGroup, SlidingWindow

    groups = (KVGroup(SlidingWindow(3, 8, 16), (0,)), KVGroup(FullAttention(2, 8), (1,)))
    with pytest.raises(KvbenchError, match=r"^--engine hybrid: KV group 0 .* straddle pages\)") as error:
        HybridAllocator(100, 4, groups).memory_layout()
    assert "\n" not in str(error.value)
    tables = JengaAllocator(100, 4, groups).memory_layout()  # Jenga: a block is a whole group's bytes
    assert [(t.token_bytes, t.layers) for t in tables] == [(96, ((0, 0),)), (64, ((1, 0),))]
