"""Hybrid KV allocators (`engines.hybrid`): exact per-group accounting, window freeing, Gemma-3 sizing."""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from engines import ENGINES, EngineOptions
from engines.allocator import snapshot
from engines.hybrid import HybridAllocator, JengaAllocator
from engines.paged import PagedAllocator
from kvbench.budget import budget_by_layer_kind, budget_from_gib
from kvbench.config import RunConfig
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.engine import Engine
from kvbench.kvspec.layers import FullAttention, SlidingWindow, kv_groups
from kvbench.models import get_model
from kvbench.requests import Request
from kvbench.sequence import Sequence
from kvbench.simulate import simulate
from tests.support import steps
from workloads.spec import WorkloadSpec, build_trace

BS = 4
WINDOW = 6
# three window layers of 8 bytes a token (24) and one full layer of 16: u = 8 (m = 3, 2), Jenga's
# page = lcm(96, 64) = 192 bytes, holding 2 window blocks or 3 full ones
SMALL = kv_groups((SlidingWindow(1, 2, WINDOW),) * 3 + (FullAttention(2, 2),))
SLOT_BYTES = 40  # one token in every layer
ONE_SECOND_STEPS = CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.0)  # grid times: exact


def window_blocks(seq: Sequence) -> int:
    """What a window group holds right after `append`: blocks from the first one a step reads."""
    first = max(seq.num_computed - WINDOW + 1, 0) // BS
    return -(-seq.num_tokens // BS) - first


def retire(alloc, resident: list[Sequence], finished: list[Sequence]) -> None:
    """Free the finished sequences, as the engine loop does after a step."""
    for seq in finished:
        resident.remove(seq)
        alloc.free(seq)


def evict(alloc, resident: list[Sequence], index: int) -> Sequence:
    """Preempt one resident sequence (recompute): its blocks freed, its progress reset."""
    seq = resident.pop(index % len(resident))
    alloc.free(seq)
    seq.preempt()
    return seq


class HybridMachine(RuleBasedStateMachine):
    """Engine-like steps (append every resident sequence, then advance it), admissions, finishes and
    recompute preemptions, checked against block counts computed here."""

    allocator_class: type = HybridAllocator

    def __init__(self) -> None:
        super().__init__()
        self.alloc = self.allocator_class(60, BS, SMALL, watermark=0.0)  # 2,400 bytes
        self.resident: list[Sequence] = []
        self.next_id = 0

    @rule(prompt=st.integers(1, 30), output=st.integers(1, 30))
    def admit(self, prompt, output):
        seq = Sequence(Request(self.next_id, 0.0, prompt, output))
        self.next_id += 1
        if not self.alloc.can_ever_hold(seq.request) or not self.alloc.can_allocate(seq):
            return
        blocks = -(-prompt // BS)
        free, need = self.alloc.num_free_pages, self.alloc.pool.pages_for([blocks, blocks])
        self.alloc.allocate(seq)
        assert self.alloc.held_blocks(seq) == [blocks, blocks]  # prefill writes every prompt token
        assert free - self.alloc.num_free_pages == need  # pages_for is exact
        seq.advance(1, 0.0)
        self.resident.append(seq)

    @precondition(lambda self: self.resident)
    @rule()
    def step(self):
        """One decode step of every resident sequence, preempting the newest while memory lacks."""
        while self.resident and self.alloc.append_all(self.resident) is None:
            victim = self.resident.pop()
            self.alloc.free(victim)
        for seq in self.resident:
            # window blocks freed exactly when they leave the window: none held below it, none freed in it
            assert self.alloc.held_blocks(seq) == [window_blocks(seq), -(-seq.num_tokens // BS)]
        assert self.alloc.outside_window_slots() == 0
        retire(self.alloc, self.resident, [seq for seq in self.resident if seq.advance(1, 0.0)])

    @precondition(lambda self: self.resident)
    @rule(index=st.integers(0, 100))
    def preempt(self, index):
        seq = evict(self.alloc, self.resident, index)
        if self.alloc.can_allocate(seq):  # recompute: prompt and outputs so far in one prefill
            self.alloc.allocate(seq)
            seq.advance(1, 0.0)
            self.resident.append(seq)

    @invariant()
    def accounting(self):
        alloc = self.alloc
        alloc.check_integrity()
        held = [alloc.held_blocks(seq) for seq in self.resident]
        per_group = [sum(h[g] for h in held) for g in range(2)]
        block_bytes = [BS * 24, BS * 16]
        used_pages = alloc.pool.num_pages - alloc.num_free_pages
        if isinstance(alloc, HybridAllocator):  # every block is m_g whole pages of 32 bytes
            assert alloc.pool.page_bytes == 32 and used_pages == 3 * per_group[0] + 2 * per_group[1]
        else:  # pages of 192 bytes, each of one group: at least the blocks' bytes, less than a page more
            assert alloc.pool.page_bytes == 192 and alloc.pool.per_page == (2, 3)
            assert all(
                math.ceil(n / k) <= pages
                for n, k, pages in zip(per_group, (2, 3), self._pages_by_group(), strict=True)
            )
        fp = alloc.footprint()
        assert fp.asked * SLOT_BYTES == pytest.approx(
            sum(n * b for n, b in zip(per_group, block_bytes, strict=True))
        )
        assert fp.granted * SLOT_BYTES == pytest.approx(used_pages * alloc.pool.page_bytes)
        tokens = 0
        for seq, (window, full) in zip(self.resident, held, strict=True):
            end = min(seq.num_computed, full * BS)  # computed tokens in the tables
            tokens += 24 * max(end - (full - window) * BS, 0) + 16 * end
        assert fp.tokens * SLOT_BYTES == pytest.approx(tokens)
        snap = snapshot(alloc)
        values = snap.as_dict()
        assert sum(values.values()) == 60 and min(values.values()) >= 0

    def _pages_by_group(self) -> list[int]:
        owners = list(self.alloc.pool._owner.values())
        return [owners.count(g) for g in range(2)]


class JengaMachine(HybridMachine):
    allocator_class = JengaAllocator


@pytest.mark.parametrize("machine", [HybridMachine, JengaMachine])
def test_random_runs_keep_exact_accounting(machine):
    run_state_machine_as_test(machine, settings=settings(stateful_step_count=steps(40), deadline=None))


STEP = 5  # chunked prefill's step budget in `ChunkedMachine`


class ChunkedMachine(RuleBasedStateMachine):
    """Chunked-prefill steps (every resident sequence computes a chunk of at most STEP tokens, a
    decode one), admissions, finishes and recompute preemptions. A window group takes a prompt's
    blocks chunk by chunk: after every `append` it spans exactly the blocks from its window's
    first to what the next step can write, never more than `peak_blocks`; a full group all."""

    allocator_class: type = HybridAllocator

    def __init__(self) -> None:
        super().__init__()
        self.alloc = self.allocator_class(60, BS, SMALL, watermark=0.0, step_tokens=STEP)
        self.resident: list[Sequence] = []
        self.next_id = 0

    def expect(self, seq: Sequence) -> list[int]:
        c, t = seq.num_computed, seq.num_tokens
        first = max(c - WINDOW + 1, 0) // BS
        return [-(-min(t, c + STEP) // BS) - first, -(-t // BS)]

    @rule(prompt=st.integers(1, 40), output=st.integers(1, 10))
    def admit(self, prompt, output):
        seq = Sequence(Request(self.next_id, 0.0, prompt, output))
        self.next_id += 1
        if not self.alloc.can_ever_hold(seq.request) or not self.alloc.can_allocate(seq):
            return
        free = self.alloc.num_free_pages
        self.alloc.allocate(seq)
        assert self.alloc.held_blocks(seq) == self.expect(seq)
        if self.allocator_class is HybridAllocator:  # whole pages per block: exact
            assert free - self.alloc.num_free_pages == self.alloc.pool.pages_for(self.expect(seq))
        self.resident.append(seq)

    @precondition(lambda self: self.resident)
    @rule()
    def step(self):
        while self.resident and self.alloc.append_all(self.resident) is None:
            self.alloc.free(self.resident.pop())
        for seq in self.resident:
            held = self.alloc.held_blocks(seq)
            assert held == self.expect(seq)
            assert held[0] <= self.alloc.peak_blocks(0, seq.request.kv_len)
        finished = []
        for seq in self.resident:
            todo = seq.num_tokens - seq.num_computed
            if todo > STEP:
                seq.compute(STEP, 0.0)
            elif seq.advance(1, 0.0):
                finished.append(seq)
        retire(self.alloc, self.resident, finished)

    @precondition(lambda self: self.resident)
    @rule(index=st.integers(0, 100))
    def preempt(self, index):
        seq = evict(self.alloc, self.resident, index)
        if self.alloc.can_allocate(seq):  # recomputed chunk by chunk, as a new prompt
            self.alloc.allocate(seq)
            self.resident.append(seq)

    @invariant()
    def accounting(self):
        self.alloc.check_integrity()
        values = snapshot(self.alloc).as_dict()
        assert sum(values.values()) == pytest.approx(60) and min(values.values()) >= 0


class JengaChunkedMachine(ChunkedMachine):
    allocator_class = JengaAllocator


@pytest.mark.parametrize("machine", [ChunkedMachine, JengaChunkedMachine])
def test_chunked_runs_take_window_blocks_chunk_by_chunk(machine):
    run_state_machine_as_test(machine, settings=settings(stateful_step_count=steps(40), deadline=None))


@pytest.mark.parametrize("cls", [HybridAllocator, JengaAllocator])
def test_admission_bounds_at_their_edges_by_hand(cls):
    """The bounds admission rests on, at the values where an off-by-one shows: a window group's
    peak under chunked steps, a request asking for exactly the whole pool, a beam group, and an
    append that needs no new block in a full pool."""
    whole = cls(60, BS, SMALL, watermark=0.0)
    chunked = cls(60, BS, SMALL, watermark=0.0, step_tokens=4)
    assert [whole.peak_blocks(g, 40) for g in (0, 1)] == [10, 10]  # every token, prefilled whole
    # a window of 6 and 4-token steps: positions p - 5 .. p + 4, at most ceil(9 / 4) + 1 blocks
    assert [chunked.peak_blocks(g, 40) for g in (0, 1)] == [4, 10]
    assert chunked.peak_blocks(0, 7) == 2  # never more than the request's own blocks
    if cls is HybridAllocator:  # 75 pages of 32 B: a window block 3 pages, a full one 2
        # kv_len = prompt + output - 1 tokens
        assert whole.can_ever_hold(Request(0, 0.0, 31, 30))  # 60: 15 blocks a group, exactly 75 pages
        assert not whole.can_ever_hold(Request(0, 0.0, 31, 31))  # 61: 16 blocks, 80 pages
        assert whole.can_ever_hold(Request(0, 0.0, 16, 16))  # 31: 8 blocks, 40 pages
        assert not whole.can_ever_hold(Request(0, 0.0, 16, 16, beam_width=2))  # twice that
        full = cls(60, BS, SMALL, watermark=0.0)
        seqs = [Sequence(Request(i, 0.0, 2, 4)) for i in range(15)]  # one block a group: 5 pages each
        for seq in seqs:
            full.allocate(seq)
            seq.advance(1, 0.0)  # 3 tokens: the next still in block 0
        assert full.num_free_pages == 0
        assert all(full.can_append(seq) for seq in seqs) and full.append_all(seqs) == []


def test_a_gemma3_prompt_chunked_holds_its_window_and_one_step_by_hand():
    """Gemma 3 12B on 12 GiB (12,288 pages of 1 MiB; a window block 5 pages, a full one 1), a
    16,384-token prompt (1,024 blocks), steps of 2,048 tokens. Admitted whole, its window groups
    take all 1,024 blocks: 6,144 pages, so 2 fit. Chunk by chunk they take 128 (the first step's
    tokens) beside the full groups' 1,024: 1,664 pages, so 7 are admitted. At chunk k (2,048k
    computed) the window holds tokens from 2,048k - 1,023 on, blocks 128k - 64 .. 128k + 127:
    192 blocks; at its first decode step (16,384 computed), blocks 960 .. 1,024: 65.
    """
    model = get_model("gemma-3-12b")
    slots = budget_from_gib(12, model).num_slots
    whole = HybridAllocator(slots, 16, model.groups, watermark=0.0)
    chunked = HybridAllocator(slots, 16, model.groups, watermark=0.0, step_tokens=2048)
    assert [g.window for g in chunked.shapes] == [1024, 0]  # window groups first

    def admitted(alloc) -> int:
        count = 0
        while alloc.can_allocate(seq := Sequence(Request(count, 0.0, 16384, 4))):
            alloc.allocate(seq)
            count += 1
        return count

    assert (admitted(whole), admitted(chunked)) == (2, 7)
    assert chunked.num_free_pages == 12288 - 7 * 1664
    alloc = HybridAllocator(slots, 16, model.groups, watermark=0.0, step_tokens=2048)
    seq = Sequence(Request(0, 0.0, 16384, 4))
    alloc.allocate(seq)
    held = [alloc.held_blocks(seq)]
    for _ in range(7):
        seq.compute(2048, 0.0)
        alloc.append(seq)
        held.append(alloc.held_blocks(seq))
    assert held == [[128, 1024]] + [[192, 1024]] * 7
    assert alloc.peak_blocks(0, seq.request.kv_len) == 193  # ceil(3,071 / 16) + 1: a bound for any p
    seq.advance(1, 0.0)  # the last chunk samples the first output token
    alloc.append(seq)
    assert alloc.held_blocks(seq) == [65, 1025]
    alloc.check_integrity()


def test_tokens_and_out_of_window_slots_by_hand():
    alloc = HybridAllocator(60, BS, SMALL, watermark=0.0)
    seq = Sequence(Request(0, 0.0, 9, 20))  # 9 prompt tokens: 3 blocks in each group
    alloc.allocate(seq)
    seq.advance(1, 0.0)  # 9 computed, 10 tokens
    # before the next append the window group still holds tokens 0..3 (block 0), read by no step:
    # the next query (position 9) reads 4..9, so block 0 lies wholly out of the window
    assert alloc.outside_window_slots() == pytest.approx(BS * 24 / SLOT_BYTES)
    fp = alloc.footprint()
    assert fp.tokens * SLOT_BYTES == pytest.approx(9 * 40)
    assert fp.asked * SLOT_BYTES == pytest.approx(3 * BS * 40)
    alloc.append(seq)
    assert alloc.held_blocks(seq) == [2, 3] and alloc.outside_window_slots() == 0
    fp = alloc.footprint()
    assert fp.tokens * SLOT_BYTES == pytest.approx(
        5 * 24 + 9 * 16
    )  # the window keeps tokens 4..8 of those computed
    assert fp.asked * SLOT_BYTES == pytest.approx(2 * BS * 24 + 3 * BS * 16)
    alloc.free(seq)
    assert alloc.num_free_pages == alloc.pool.num_pages  # 2,400 / 32 = 75 pages, all back
    assert alloc.pool.num_pages == 75


def test_jenga_counts_partly_used_pages_as_overhead():
    alloc = JengaAllocator(60, BS, SMALL, watermark=0.0)  # 2,400 bytes
    seq = Sequence(Request(0, 0.0, 4, 2))  # one block in each group
    alloc.allocate(seq)
    fp = alloc.footprint()
    # two pages taken, one per group; they hold one 96-byte and one 64-byte block
    assert fp.granted * SLOT_BYTES == pytest.approx(2 * 192)
    assert fp.asked * SLOT_BYTES == pytest.approx(96 + 64)
    assert alloc.pool.num_pages == 12  # 2,400 / 192 = 12.5: a 96-byte tail no page uses
    assert alloc.external_frag(None) == pytest.approx(96 / SLOT_BYTES)
    other = Sequence(Request(1, 0.0, 4, 2))
    alloc.allocate(other)  # its blocks fill the spare room of the two pages
    assert alloc.num_free_pages == 10
    alloc.free(seq)
    alloc.free(other)
    assert alloc.num_free_pages == 12 and alloc.footprint().granted == 0


def test_forks_share_blocks_and_copy_on_write_in_every_group():
    alloc = HybridAllocator(60, BS, SMALL, watermark=0.0)
    parent = Sequence(Request(0, 0.0, 6, 4, n=2))
    alloc.allocate(parent)
    parent.advance(1, 0.0)  # 6 computed, 7 tokens: block 1 is written next
    child = Sequence(Request(0, 0.0, 6, 4, n=2), sample=1)
    child.copy_progress(parent)
    assert alloc.fork(parent, child) == []
    free = alloc.num_free_pages
    assert alloc.sharing_saved() == round(2 * BS * 40 / SLOT_BYTES)  # both groups' 2 blocks, once more
    copies = alloc.append(child)
    assert len(copies) == 2  # block 1 of each group copied before the child writes into it
    assert free - alloc.num_free_pages == 3 + 2
    alloc.check_integrity()
    # block 1 is the parent's alone now: its own write copies nothing and takes no page
    assert alloc.append(parent) == [] and free - alloc.num_free_pages == 3 + 2
    alloc.check_integrity()


@pytest.mark.parametrize(("slots", "fits"), [(12, True), (11, False)])
def test_copy_on_write_asks_for_exactly_the_shared_blocks_it_copies(slots, fits):
    """A forked child's next write copies its shared last block in each group: 3 + 2 pages. With
    12 slots (15 pages) the parent's 10 leave exactly those 5, with 11 (13 pages) only 3; and a
    fresh allocation has computed nothing and shares nothing."""
    alloc = HybridAllocator(slots, BS, SMALL, watermark=0.0)
    parent = Sequence(Request(0, 0.0, 6, 4, n=2))
    alloc.allocate(parent)
    assert alloc.footprint().tokens == 0 and alloc.sharing_saved() == 0
    parent.advance(1, 0.0)
    child = Sequence(Request(0, 0.0, 6, 4, n=2), sample=1)
    child.copy_progress(parent)
    alloc.fork(parent, child)
    assert alloc.num_free_pages == alloc.pool.num_pages - 10
    assert alloc.can_append(child) is fits
    if fits:
        assert len(alloc.append(child)) == 2 and alloc.num_free_pages == 0
        alloc.check_integrity()


# ---------------------------------------------------------------- Gemma 3: one budget, three allocators


def fill(alloc, prompt: int = 8191) -> int:
    """Admit 8,192-token requests (prefill, then the first decode step's append) until one cannot."""
    admitted = 0
    while True:
        seq = Sequence(Request(admitted, 0.0, prompt, 2))  # kv_len 8,192
        if not alloc.can_allocate(seq):
            return admitted
        alloc.allocate(seq)
        seq.advance(1, 0.0)
        assert alloc.append_all([seq]) is not None
        admitted += 1


def grow_together(alloc, count: int) -> bool:
    """Whether `count` requests admitted with one token each all reach 8,192 tokens together."""
    seqs = [Sequence(Request(i, 0.0, 1, 8192)) for i in range(count)]  # kv_len 8,192
    for seq in seqs:
        alloc.allocate(seq)
        seq.advance(1, 0.0)
    while seqs[0].num_tokens < 8192:
        if alloc.append_all(seqs) is None:
            return False
        horizon = alloc.growth_horizon(seqs, 8192 - seqs[0].num_tokens)
        for seq in seqs:
            seq.advance(horizon, 0.0)
    return alloc.append_all(seqs) is not None


def test_gemma3_8k_requests_on_12_gib_by_hand():
    """Gemma 3 12B: 40 window layers (1,024 tokens) of 8,192 bytes a token, 8 full ones; a slot
    (one token in every layer) is 393,216 bytes, so 12 GiB is 32,768 slots = 2,048 blocks of 16.

    - paged (window layers as full): 512 blocks a request, 4 requests.
    - hybrid: pages of 16 x 65,536 bytes (1 MiB), 12,288 of them; a window block is 5 pages. After
      its first decode step a request holds 512 full blocks and 64 window blocks (tokens
      7,168..8,191): 832 pages, so 14 fit together (12,288 / 832 = 14.8), as the per-group pools of
      `budget_by_layer_kind` say; but prefilling an 8,192-token prompt holds 512 window blocks
      (3,072 pages) for one step, so only 12 are admitted one by one: 11 x 832 + 3,072 <= 12,288
      < 12 x 832 + 3,072.
    - jenga: pages of lcm(5 MiB, 1 MiB) = 5 MiB, 2,457 of them (a 3 MiB tail): one window block or
      five full blocks a page. k settled requests hold 64k + ceil(512k / 5) pages; admitting one
      more needs 512 + ceil(512(k + 1) / 5) - ceil(512k / 5) more: 12 admitted (k = 11: 2,445
      pages of 2,457), 14 grow together (2,330 pages), 15 do not (2,496).
    """
    model = get_model("gemma-3-12b")
    budget = budget_from_gib(12, model)
    assert budget.num_slots == 32768
    by_kind = budget_by_layer_kind(budget, model, 8192)
    assert (by_kind.one_pool_sequences, by_kind.pooled_sequences) == (4, 14)

    paged = PagedAllocator(budget.num_slots, 16, watermark=0.0)
    hybrid = HybridAllocator(budget.num_slots, 16, model.groups, watermark=0.0)
    jenga = JengaAllocator(budget.num_slots, 16, model.groups, watermark=0.0)
    assert (hybrid.pool.num_pages, hybrid.pool.page_bytes) == (12288, 1 << 20)
    assert (jenga.pool.num_pages, jenga.pool.page_bytes) == (2457, 5 << 20)
    assert jenga.external_frag(None) == pytest.approx((3 << 20) / model.kv_bytes_per_token)
    assert (fill(paged), fill(hybrid), fill(jenga)) == (4, 12, 12)
    assert hybrid.num_free_pages == 12288 - 12 * 832
    assert jenga.num_free_pages == 2457 - (64 * 12 + math.ceil(512 * 12 / 5))
    for cls in (HybridAllocator, JengaAllocator):
        assert grow_together(cls(budget.num_slots, 16, model.groups, watermark=0.0), 14)
        assert not grow_together(cls(budget.num_slots, 16, model.groups, watermark=0.0), 15)
    assert grow_together(PagedAllocator(budget.num_slots, 16, watermark=0.0), 4)
    assert not grow_together(PagedAllocator(budget.num_slots, 16, watermark=0.0), 5)


def test_without_window_layers_hybrid_and_jenga_hold_what_paged_holds():
    model = get_model("opt-125m")
    for cls in (HybridAllocator, JengaAllocator):
        alloc = cls(1000, 16, model.groups, watermark=0.0)
        assert alloc.pool.num_pages == 1000 // 16 and alloc.external_frag(None) == 1000 - 62 * 16
        assert fill(alloc, prompt=200) == fill(PagedAllocator(1000, 16, watermark=0.0), prompt=200)


# ---------------------------------------------------------------- whole runs


def long_workload(seed: int = 0) -> WorkloadSpec:
    return WorkloadSpec("uniform:prompt=600..2000,output=100..1200", num_requests=40, rate=20.0, seed=seed)


def test_simulated_gemma3_runs_finish_and_batch_more_than_paged():
    batched = {}
    for engine in ("paged", "hybrid", "jenga"):
        config = RunConfig(engine=engine, model="gemma-3-1b", workload=long_workload(), kv_cache_gib=0.5)
        result = simulate(config)
        assert result.summary["completed"] == 40
        assert all(seq.num_generated == seq.request.output_len for seq in result.run.sequences)
        batched[engine] = result.summary["mean_batched_requests"]
    assert batched["hybrid"] > 1.5 * batched["paged"]
    assert batched["jenga"] > 1.5 * batched["paged"]


@pytest.mark.parametrize("engine", ["hybrid", "jenga"])
def test_coalesced_segments_equal_step_by_step_on_a_window_model(engine):
    model = get_model("gemma-3-1b")
    trace = build_trace(
        WorkloadSpec("uniform:prompt=100..900,output=50..700", num_requests=40, rate=8.0, seed=2)
    )
    runs = []
    for coalesce in (False, True):
        options = EngineOptions(num_slots=6000, max_len=model.max_len, block_size=16, kv_groups=model.groups)
        sched = ENGINES[engine].build(options)
        runs.append(Engine(sched, CostModelRunner(ONE_SECOND_STEPS), coalesce=coalesce).run(trace))
        sched.allocator.check_integrity()
    slow, fast = runs
    assert len(fast.steps) < len(slow.steps)
    assert sum(row.num_preempted for row in slow.steps) > 0  # the arena is tight enough to preempt
    key = [(s.seq_id, s.admitted_s, s.finish_s, s.num_preemptions) for s in slow.sequences]
    assert key == [(s.seq_id, s.admitted_s, s.finish_s, s.num_preemptions) for s in fast.sequences]
    for name in ("tokens", "target", "asked", "granted", "external"):
        x, y = getattr(slow.busy.footprint, name), getattr(fast.busy.footprint, name)
        assert x == pytest.approx(y, rel=1e-9, abs=1e-6)
