"""Behaviours of chunked prefill (`engines.chunked`), the outside-window terms (`engines.windows`)
and the real runner's arena copies (`kvbench.real.kv_copies`) that a mutation run of those modules
found unpinned: the budget and seat limits at their edges (a budget equal to `max_num_seqs`, one
token of budget left, every seat taken), a prefix-cache hit that is not fed again, the context a
mixed step attends, the preempted count a re-admission lowers, the refusals' whole reasons, a
full-attention group listed before a window group, copy-on-write and fork copies with real data
in a plain and a grouped arena, and the host swap space (none without host blocks, the arena's
dtype).

Schedules run the real scheduler, allocator and `Engine` (`tests.test_chunked_prefill`'s
recorder, one step a row); copies run on real arenas on the CPU, every slot distinct.
docs/MUTATION.md says why such tests exist; the mutants they kill, and those that are equivalent,
are in results/mutation/engines-chunked/.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engines import ENGINES, EngineOptions
from engines.batch import SchedulerConfig
from engines.chunked import ChunkedScheduler
from engines.hybrid import GroupShape
from engines.paged import PagedAllocator
from engines.windows import window_terms
from kvbench.errors import KvbenchError
from kvbench.modeling.arena import KVArena
from kvbench.real.grouped_arena import GroupedKVArena
from kvbench.real.kv_copies import ArenaCopies
from kvbench.requests import Request, Trace
from kvbench.sequence import SeqStatus, Sequence, sequence_for
from tests.test_chunked_prefill import Recorder, chunked_run, trace_of
from tests.test_kv_copies import DENSE, space
from tests.test_real_window_pricing import GEMMA3_TINY

CPU = torch.device("cpu")


def chunks_by_step(recorder: Recorder) -> list[dict[int, int]]:
    """{request: tokens fed} of every step, in order (a decode feeds 1)."""
    out = []
    for batch, _, _ in recorder.steps:
        chunks = batch.chunks or (1,) * len(batch.seqs)
        out.append({seq.seq_id: chunk for seq, chunk in zip(batch.seqs, chunks, strict=True)})
    return out


# ---------------------------------------------------------------- the budget and the seats


def scheduler(budget: int, seqs: int) -> ChunkedScheduler:
    config = SchedulerConfig(seqs, budget, chunked_prefill=True)
    built = ENGINES["paged"].build(EngineOptions(num_slots=1024, max_len=64, block_size=4, scheduler=config))
    assert isinstance(built, ChunkedScheduler)
    return built


def test_a_budget_equal_to_max_num_seqs_is_taken_and_one_below_is_refused_naming_both():
    assert scheduler(4, 4).token_cap == 4
    with pytest.raises(ValueError, match=r"^token budget 3 below max_num_seqs 4$"):
        scheduler(3, 4)


def test_a_request_with_several_outputs_is_refused_with_the_whole_reason():
    sched = scheduler(16, 4)
    with pytest.raises(KvbenchError) as refused:
        sched.add(sequence_for(Request(7, 0.0, 10, 4, n=2)))
    assert str(refused.value) == (
        "--chunked-prefill: request 7 asks for several outputs (--n or --beam-width), "
        "which fork after a single prefill step; run it without --chunked-prefill"
    )
    assert not sched.waiting


def test_the_last_token_of_the_budget_starts_the_next_prompt():
    """15 tokens of the first prompt leave one of the budget's 16: the second prompt is admitted
    and fed its first token in the same step."""
    _, recorder = chunked_run("paged", trace_of((15, 2), (9, 2), gap=0.0), budget=16)
    assert chunks_by_step(recorder)[:2] == [{0: 15, 1: 1}, {0: 1, 1: 8}]


def test_admission_stops_when_every_seat_is_taken():
    _, recorder = chunked_run("paged", trace_of((3, 4), (3, 4), (3, 4), gap=0.0), budget=16, seqs=2)
    steps = chunks_by_step(recorder)
    assert steps[0] == {0: 3, 1: 3}  # budget left, but both seats are taken
    assert max(len(step) for step in steps) == 2
    assert min(step for step, fed in enumerate(steps) if 2 in fed) == 4  # after 0 and 1 finish


def test_a_budget_equal_to_the_seats_feeds_a_partial_prompt_its_one_token_beside_three_decodes():
    """Budget 4, four seats: once three requests decode, the fourth prompt gets the one token
    left every step until it is computed (it is never starved, nor treated as a decode)."""
    lengths = [(2, 30), (2, 30), (2, 30), (10, 3)]
    _, recorder = chunked_run("paged", trace_of(*lengths, gap=0.0), budget=4, seqs=4)
    steps = chunks_by_step(recorder)
    assert steps[:3] == [{0: 2, 1: 2}, {0: 1, 1: 1, 2: 2}, {0: 1, 1: 1, 2: 1, 3: 1}]
    fed = [step[3] for step in steps if 3 in step]
    assert fed[:10] == [1] * 10  # ten prompt tokens, one a step, on consecutive steps
    assert [3 in step for step in steps[2:12]] == [True] * 10
    # mixed steps while the prompt lacks more than its last token (that one runs as a decode row)
    assert [recorder.steps[i][0].chunks is not None for i in range(2, 12)] == [True] * 9 + [False]


def test_a_prefix_cache_hit_is_not_fed_again():
    """Request 1 repeats request 0's 20-token prompt after it was computed: 16 tokens (four
    blocks of 4, all before its last token) are a hit, so its one chunk is the other 4."""
    ids = tuple(range(100, 120))
    trace = Trace("hit", (Request(0, 0.0, 20, 2, prompt_ids=ids), Request(1, 1.0, 20, 2, prompt_ids=ids)))
    run, recorder = chunked_run("paged-prefix", trace, budget=64)
    steps = chunks_by_step(recorder)
    assert next(step for step in steps if 1 in step) == {1: 4}
    assert sum(row.num_tokens for row in run.steps) == (20 + 1) + (4 + 1)


def test_a_mixed_step_attends_each_rows_computed_tokens_plus_its_chunk():
    # alone: chunks of 16, 16, 16, 2 attend 16, 32, 48, 50 positions
    _, recorder = chunked_run("paged", trace_of((50, 3)), budget=16)
    assert [batch.num_context for batch, _, _ in recorder.steps[:4]] == [16, 32, 48, 50]
    # beside a decode: (4 + 12), (5 + 27), (6 + 30)
    _, recorder = chunked_run("paged", trace_of((4, 5), (30, 2), gap=0.0), budget=16)
    mixed = [batch for batch, _, _ in recorder.steps if batch.chunks is not None]
    assert [(b.chunks, b.num_context) for b in mixed] == [((4, 12), 16), ((1, 15), 32), ((1, 3), 36)]


class PreemptionRecorder(Recorder):
    """Also keeps, per step, the scheduler's count of waiting requests that lost their K/V and
    that count taken from the queue itself."""

    def __init__(self, scheduler: ChunkedScheduler) -> None:
        super().__init__(scheduler)
        self.counts: list[tuple[int, int]] = []

    def run(self, batch, max_steps, start_s, until_s):
        lost = sum(seq.status is SeqStatus.PREEMPTED for seq in self.scheduler.waiting)
        self.counts.append((self.scheduler.num_preempted, lost))
        return super().run(batch, max_steps, start_s, until_s)


def test_a_readmitted_request_leaves_the_preempted_count():
    """A 96-slot arena and eight requests of up to 40 tokens: recompute preemption sends requests
    back to the queue and chunked admission takes them again; steps.csv's `num_preempted` is at
    every step the waiting requests that lost their K/V."""
    from kvbench.engine import Engine

    config = SchedulerConfig(4, 16, chunked_prefill=True)
    sched = ENGINES["paged"].build(EngineOptions(num_slots=96, max_len=64, block_size=4, scheduler=config))
    recorder = PreemptionRecorder(sched)
    trace = trace_of(*[(12, 28)] * 8, gap=0.0)
    run = Engine(sched, recorder, coalesce=False).run(trace)
    assert all(seq.status is SeqStatus.FINISHED for seq in run.sequences)
    assert sum(seq.num_preemptions for seq in run.sequences) > 0
    kept, counted = zip(*recorder.counts, strict=True)
    assert kept == counted and max(counted) > 0
    assert [row.num_preempted for row in run.steps] == list(counted)


# ---------------------------------------------------------------- outside-window terms


def computed(prompt: int, tokens: int) -> Sequence:
    seq = sequence_for(Request(0, 0.0, prompt, 4))
    seq.compute(tokens, 0.0)
    return seq


@pytest.mark.parametrize("full_first", [True, False])
def test_window_terms_cover_every_window_group_in_any_group_order(full_first):
    """A window group of 48 bytes a token (window 8) beside a full one of 16, in either order: a
    sequence 20 tokens in holds 13 tokens older than its window in a layer that frees nothing,
    each 48/64 of a slot."""
    full, window = GroupShape(16, 0), GroupShape(48, 8)
    shapes = (full, window) if full_first else (window, full)
    terms = window_terms(PagedAllocator(256, 4), shapes, [computed(30, 20), computed(30, 5)])
    assert terms.scale.tolist() == [0.75, 0.75]
    assert terms.behind.tolist() == [13, -2]
    assert terms.slots == 0.75 * 13


# ---------------------------------------------------------------- arena copies


class Copies(ArenaCopies):
    """The real runner's copy methods over an arena and an allocator, without a model."""

    def __init__(self, arena, allocator) -> None:
        self.arena, self.allocator, self.device = arena, allocator, CPU
        self._host = self._swap_space()


def test_copy_on_write_duplicates_each_block_in_every_layer_k_and_v():
    copies = space(DENSE, 4, blocks=6, host_blocks=2)
    before = [copies.block(b) for b in range(6)]
    copies._copy_blocks(((1, 4), (2, 0)))
    for block, source in {0: 2, 1: 1, 2: 2, 3: 3, 4: 1, 5: 5}.items():
        assert all(torch.equal(a, b) for a, b in zip(copies.block(block), before[source], strict=True))


def test_fork_copies_duplicate_each_parents_slot_range_in_every_layer_k_and_v():
    arena = KVArena(DENSE, 32, torch.float32, CPU)
    arena.k.copy_(torch.arange(arena.k.numel(), dtype=torch.float32).view_as(arena.k))
    arena.v.copy_(-torch.arange(arena.v.numel(), dtype=torch.float32).view_as(arena.v))
    k, v = arena.k.clone(), arena.v.clone()
    copies = Copies(arena, ENGINES["orca-max"].build(EngineOptions(num_slots=32, max_len=16)).allocator)
    copies._copy_slots(((2, 20, 5), (9, 27, 3)))
    source = list(range(32))
    source[20:25], source[27:30] = range(2, 7), range(9, 12)
    assert torch.equal(arena.k, k[:, source]) and torch.equal(arena.v, v[:, source])


def test_copy_on_write_in_a_grouped_arena_copies_the_blocks_bytes_in_its_group():
    """A `hybrid` allocator's blocks live in one buffer: a copied block's bytes (every layer of
    its group) land on the new block's, and nothing else changes."""
    options = replace(EngineOptions(num_slots=256, max_len=64, block_size=4), kv_groups=GEMMA3_TINY.groups)
    allocator = ENGINES["hybrid"].build(options).allocator
    arena = GroupedKVArena.for_allocator(GEMMA3_TINY, allocator, torch.float32, CPU)
    arena.buffer.copy_(torch.arange(arena.buffer.numel(), dtype=torch.float32))
    seq = sequence_for(Request(0, 0.0, 8, 2))
    allocator.allocate(seq)
    for group in range(len(GEMMA3_TINY.groups)):
        old, new = allocator._tables[seq][group][:2]
        before = arena.buffer.clone()
        Copies(arena, allocator)._copy_blocks(((old, new),))
        expected = before.clone()
        unit = GEMMA3_TINY.dtype_bytes
        for (src, n), (dst, _) in zip(allocator.block_bytes(old), allocator.block_bytes(new), strict=True):
            expected[dst // unit : (dst + n) // unit] = before[src // unit : (src + n) // unit]
        assert not torch.equal(expected, before)
        assert torch.equal(arena.buffer, expected)


def test_there_is_no_host_swap_space_without_host_blocks():
    arena = KVArena(DENSE, 32, torch.float32, CPU)
    contiguous = ENGINES["orca-max"].build(EngineOptions(num_slots=32, max_len=16)).allocator
    assert not hasattr(contiguous, "num_host_blocks")
    assert Copies(arena, contiguous)._host is None
    assert Copies(arena, PagedAllocator(32, 4))._host is None


def test_the_host_swap_space_holds_the_arenas_dtype_block_major():
    copies = space(DENSE, 4, blocks=6, host_blocks=3)
    half = Copies(KVArena(DENSE, 24, torch.float16, CPU), copies.allocator)
    layers, heads, dim = half.arena.k.shape[0], *half.arena.k.shape[2:]
    for host in half._host:
        assert host.dtype == torch.float16 and host.shape == (3, layers, 4, heads, dim)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_the_host_swap_space_is_pinned_on_cuda():
    """Pinned host memory is what lets each span cross the link as one asynchronous DMA copy;
    unpinned, every swap still lands right, only slower, so the values tests cannot see it."""
    copies = space(DENSE, 4, blocks=6, host_blocks=3, device="cuda")
    assert all(host.is_pinned() and host.device.type == "cpu" for host in copies._host)
