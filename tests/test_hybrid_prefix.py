"""Prefix caching per KV group (`hybrid-prefix`, `jenga-prefix`: `engines.hybrid_prefix`).

Exact hits and block ids by hand (a window group needs only its window's blocks; the request's
hit is what every group serves), reference counts, LRU eviction and pages returned, random runs
against the exact accounting, simulated runs whose categories partition the arena at every step,
the summary's per-group hit tokens by hand, and real decoding on the CPU: a hit decodes the
tokens `hybrid` computes from scratch.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
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
from engines.hybrid_prefix import HybridPrefixAllocator, JengaPrefixAllocator, group_names
from kvbench.config import RunConfig
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.engine import Engine
from kvbench.kvspec.layers import FullAttention, SlidingWindow, kv_groups
from kvbench.metrics.occupancy import Footprint
from kvbench.metrics.summary import request_record, summarize
from kvbench.requests import Request, Trace
from kvbench.sequence import Sequence
from kvbench.simulate import simulate
from tests.support import steps
from tests.test_hybrid import evict, retire
from tests.test_hybrid_real import GEMMA3
from tests.test_hybrid_real import decode as real_decode
from workloads.spec import WorkloadSpec

BS = 4
WINDOW = 9  # a hit at P tokens needs the window group's blocks from (P - 8) // 4 on
# three window layers of 8 bytes a token (24) and one full layer of 16: hybrid pages of 32 bytes (a
# window block 3 pages, a full one 2); Jenga pages of 192 bytes (2 window blocks or 3 full ones)
GROUPS = kv_groups((SlidingWindow(1, 2, WINDOW),) * 3 + (FullAttention(2, 2),))
W, F = 0, 1  # the groups' indices
ONE_SECOND_STEPS = CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.0)


def shared(rid: int, prompt: int, output: int = 4, arrival: float = 0.0, group: str | None = "g") -> Sequence:
    """A request whose first 20 tokens are prefix group `group`'s (5 blocks of 4)."""
    prefix = 20 if group else 0
    return Sequence(Request(rid, arrival, prompt, output, prefix_group=group, prefix_len=prefix))


def prefill(alloc, seq: Sequence) -> None:
    assert alloc.can_allocate(seq)
    alloc.allocate(seq)
    seq.advance(1, 0.0)
    alloc.check_integrity()


# ---------------------------------------------------------------- hits by hand


def test_group_names():
    assert group_names(HybridPrefixAllocator(60, BS, GROUPS).shapes) == ("window-9", "full")
    twice = kv_groups((FullAttention(1, 2), FullAttention(2, 2)))
    assert group_names(HybridPrefixAllocator(60, BS, twice).shapes) == ("full#0", "full#1")


def test_window_hits_skip_blocks_below_the_window_and_stop_at_a_gap():
    alloc = HybridPrefixAllocator(60, BS, GROUPS, watermark=0.0)  # 2,400 bytes: 75 pages of 32
    a = shared(0, 21)
    prefill(alloc, a)  # 6 blocks a group, 5 of them keyed (the prefix)
    first = alloc._tables[a]
    window_a, full_a = list(first[W]), list(first[F])
    alloc.free(a)  # the keyed blocks stay cached; the sixth is freed
    assert alloc.pool.parked_pages == 5 * 3 + 5 * 2 and alloc.num_free_pages == 75 - 25
    assert alloc.cache.num_evictable == 10

    # the hit is 20 tokens (5 blocks, before the last prompt token): the full group takes all five,
    # the window group only blocks 3 and 4 (positions 12..19 hold the window [12, 20))
    b = shared(1, 21)
    prefill(alloc, b)
    assert b.num_cached_tokens == 20
    assert alloc._tables[b][F][:5] == full_a[:5]
    assert alloc._tables[b][W][:5] == [None, None, None, window_a[3], window_a[4]]
    assert alloc.prefix_hits_by_request[1] == (8, 20)
    assert alloc.held_blocks(b) == [3, 6]
    # revived: 2 window blocks (6 pages) and 5 full ones (10); new: one block a group (5 pages)
    assert alloc.pool.parked_pages == 3 * 3 and alloc.num_free_pages == 50 - 5
    alloc.free(b)

    # the window blocks below the window may go: with blocks 1 and 2 evicted, the hit is whole
    alloc._evict(window_a[1])
    alloc._evict(window_a[2])
    c = shared(2, 30)
    prefill(alloc, c)
    assert c.num_cached_tokens == 20 and alloc.prefix_hits_by_request[2] == (8, 20)
    alloc.free(c)

    # a gap inside the window stops it: without block 3, hits at 5, 4, 3 and 2 blocks all need a
    # missing block ([3, 5), [2, 4), [1, 3), [0, 2)); at 1 block the window needs block 0 alone
    alloc._evict(window_a[3])
    d = shared(3, 30)
    prefill(alloc, d)
    assert d.num_cached_tokens == 4 and alloc.prefix_hits_by_request[3] == (4, 4)
    assert alloc._tables[d][W][0] == window_a[0] and alloc._tables[d][F][0] == full_a[0]
    alloc.free(d)


def test_the_request_hit_is_what_every_group_serves():
    alloc = JengaPrefixAllocator(60, BS, GROUPS, watermark=0.0)
    a = shared(0, 21)
    prefill(alloc, a)
    full_a = list(alloc._tables[a][F])
    alloc.free(a)
    # the full group loses block 2: its leading run is 2 blocks, which the window group serves
    # (a hit at 8 tokens reads from position 0: blocks 0 and 1)
    alloc._evict(full_a[2])
    b = shared(1, 21)
    prefill(alloc, b)
    assert b.num_cached_tokens == 8 and alloc.prefix_hits_by_request[1] == (8, 8)
    assert alloc._skipped[b] == [0, 0]
    # b computed its full block 2 again, and it is registered: a prompt of 20 tokens (a hit never
    # covers its last token: at most 4 blocks) now finds a's full blocks 0, 1, 3 and b's 2, and
    # the window group a's blocks 2 and 3 (a hit at 16 tokens reads from position 8)
    c = shared(2, 20)
    prefill(alloc, c)
    assert c.num_cached_tokens == 16 and alloc.prefix_hits_by_request[2] == (8, 16)
    assert alloc._tables[c][F][2] == alloc._tables[b][F][2]  # (the id a evicted, taken again)
    alloc.free(b)
    alloc.free(c)


def test_a_sequence_registers_its_window_blocks_before_the_window_frees_them():
    alloc = HybridPrefixAllocator(200, BS, GROUPS, watermark=0.0)
    a = shared(0, 21, output=20)
    prefill(alloc, a)
    for _ in range(8):  # decode to 29 computed tokens: the window (from position 21) frees blocks 0-4
        alloc.append(a)
        a.advance(1, 0.0)
    assert alloc._skipped[a][W] == 5
    b = shared(1, 21)
    prefill(alloc, b)  # a is still running: its computed blocks are found, shared
    assert b.num_cached_tokens == 20 and alloc._skipped[b] == [3, 0]
    assert alloc._tables[b][W][3] is not None  # parked when a's window left it, revived now
    alloc.check_integrity()
    # token states in bytes: a holds window positions 20-28 (9 tokens of 24 bytes) and 29 full
    # tokens (16 bytes), b window positions 12-20 and 21 full tokens; the five full blocks both
    # map (20 tokens) count once
    tokens = 9 * 24 + 29 * 16 + 9 * 24 + 21 * 16 - 20 * 16
    assert alloc.footprint().tokens * 40 == pytest.approx(tokens)
    assert alloc.sharing_saved() == round(20 * 16 / 40)
    alloc.free(b)
    alloc.free(a)
    assert alloc.footprint() == Footprint(0, 0, 0, 0)


# ---------------------------------------------------------------- references, eviction, pages


def test_references_lru_eviction_and_pages_returned_hybrid():
    alloc = HybridPrefixAllocator(60, BS, GROUPS, watermark=0.0)  # 75 pages
    a = shared(0, 21)
    prefill(alloc, a)
    window_a, full_a = (list(t) for t in alloc._tables[a])
    b = shared(1, 21)
    prefill(alloc, b)  # shares a's five full blocks and its window blocks 3 and 4
    assert [alloc._refs[block] for block in full_a[:5]] == [2] * 5
    assert alloc.sharing_saved() == round(5 * 1.6 + 2 * 2.4)  # 5 full blocks + 2 window blocks, in slots
    alloc.free(a)
    assert [alloc._refs[block] for block in full_a[:5]] == [1] * 5
    # a's window blocks 0-2 left its window when b's admission check slid it (oldest first); 3 and
    # 4 are b's too; the sixth was never cached
    assert list(alloc.cache.oldest()) == [window_a[0], window_a[1], window_a[2]]
    alloc.free(b)
    assert alloc.pool.parked_pages == 25 and alloc.num_free_pages == 50
    # 50 pages for 10 blocks a group fit without evicting; one block more of each evicts the
    # oldest parked window blocks: 0 (3 pages for the window block), then 1 (the full block's 2)
    c = Sequence(Request(2, 0.0, 40, 4))
    prefill(alloc, c)
    assert alloc.cache.evictions == 0 and alloc.num_free_pages == 0
    d = Sequence(Request(3, 0.0, 4, 4))
    prefill(alloc, d)
    assert alloc.cache.evictions == 2 and alloc.num_free_pages == 1
    assert not alloc.cache.holds(window_a[0]) and not alloc.cache.holds(window_a[1])
    # d's admission check also slid c's window: c's window blocks 0-7 are parked (under c's own
    # keys: a recompute of c would find them), younger than a's, so a's went first
    assert alloc.pool.parked_pages == 25 - 6 + 8 * 3
    for seq in (c, d):
        alloc.free(seq)
    alloc.check_integrity()


def test_references_lru_eviction_and_pages_returned_jenga():
    alloc = JengaPrefixAllocator(60, BS, GROUPS, watermark=0.0)  # 12 pages of 192 bytes
    pool = alloc.pool
    a = shared(0, 21)
    prefill(alloc, a)  # 6 window blocks (3 pages) and 6 full blocks (2 pages)
    window_a = list(alloc._tables[a][W])
    alloc.free(a)
    # every page keeps a parked block: none goes back to the pool; all five are idle (room)
    assert len(pool.free) == 7 and len(pool.idle) == 5
    assert alloc.footprint() == Footprint(0, 0, 0, 0)  # parked blocks and idle pages are free
    snap = snapshot(alloc)  # in whole slots: all free but the tail past page 12 (96 bytes, 2.4 slots)
    assert (snap.free, snap.external_frag, snap.allocator_overhead) == (58, 2, 0)
    # 7 blocks a group take the 7 free pages (4 window, 3 full) without evicting
    c = Sequence(Request(1, 0.0, 28, 4))
    prefill(alloc, c)
    assert alloc.cache.evictions == 0 and not pool.free
    # d's admission check slides c's window: c's window blocks 0-4 are parked (own keys), 0-3 in
    # two idle pages, 4 beside c's block 5 in a live page. d takes 3 blocks a group. Window: the
    # spare index of c's last page; c's parked block 4 (a live page's, before any new page); then
    # the idle page of the oldest parked block (a's window 4, beside a spare index), evicted and
    # split. Full: the two spare indices of c's last page, then the idle page of the next oldest
    # parked block (a's window 3, beside a's window 2): both evicted.
    c_window = list(alloc._tables[c][W])
    d = Sequence(Request(2, 0.0, 12, 4))
    prefill(alloc, d)
    assert alloc.cache.evictions == 4 and not alloc.cache.holds(c_window[4])
    assert [alloc.cache.holds(block) for block in window_a[:5]] == [True, True, False, False, False]
    assert alloc._tables[d][W][1] == c_window[4]  # the evicted block's index, reused in place
    assert len(pool.idle) == 5 and not pool.free  # a's 3 left and c's 2
    for seq in (c, d):
        alloc.free(seq)
    alloc.check_integrity()
    assert not pool._held and len(pool.idle) + len(pool.free) == 12


# ---------------------------------------------------------------- random runs


class PrefixGroupsMachine(RuleBasedStateMachine):
    """Admissions (three prefix groups, prompts around the 20-token prefix), decode steps of every
    resident sequence with recompute preemption, finishes; the exact accounting after each rule."""

    allocator_class: type = HybridPrefixAllocator

    def __init__(self) -> None:
        super().__init__()
        self.alloc = self.allocator_class(60, BS, GROUPS, watermark=0.0)
        self.resident: list[Sequence] = []
        self.next_id = 0

    @rule(prompt=st.integers(1, 30), output=st.integers(1, 20), group=st.sampled_from(["a", "b", "c", None]))
    def admit(self, prompt, output, group):
        seq = shared(self.next_id, prompt, output, group=group)
        self.next_id += 1
        if not self.alloc.can_ever_hold(seq.request) or not self.alloc.can_allocate(seq):
            return
        self.alloc.allocate(seq)
        assert seq.num_computed % BS == 0 and seq.num_computed < seq.num_tokens
        seq.advance(1, 0.0)
        self.resident.append(seq)

    @precondition(lambda self: self.resident)
    @rule()
    def step(self):
        while self.resident and self.alloc.append_all(self.resident) is None:
            victim = self.resident.pop()
            self.alloc.free(victim)
        retire(self.alloc, self.resident, [seq for seq in self.resident if seq.advance(1, 0.0)])

    @precondition(lambda self: self.resident)
    @rule(index=st.integers(0, 100))
    def preempt(self, index):
        seq = evict(self.alloc, self.resident, index)
        if self.alloc.can_allocate(seq):  # recompute, finding its own blocks again where cached
            self.alloc.allocate(seq)
            seq.advance(1, 0.0)
            self.resident.append(seq)

    @invariant()
    def accounting(self):
        alloc = self.alloc
        alloc.check_integrity()
        values = snapshot(alloc).as_dict()
        assert sum(values.values()) == pytest.approx(60) and min(values.values()) >= -1e-9
        if not self.resident:
            assert alloc.footprint() == Footprint(0, 0, 0, 0)


class JengaPrefixGroupsMachine(PrefixGroupsMachine):
    allocator_class = JengaPrefixAllocator


@pytest.mark.parametrize("machine", [PrefixGroupsMachine, JengaPrefixGroupsMachine])
def test_random_runs_keep_exact_accounting(machine):
    run_state_machine_as_test(machine, settings=settings(stateful_step_count=steps(50), deadline=None))


# ---------------------------------------------------------------- engine runs


def prefix_workload(seed: int = 0) -> WorkloadSpec:
    return WorkloadSpec(
        "sharegpt-paper", num_requests=60, seed=seed, prefix="fewshot-1", prefix_groups=3,
        arrivals="poisson", rate=8.0, max_total_len=1024,
    )  # fmt: skip


@pytest.mark.parametrize("engine", ["hybrid-prefix", "jenga-prefix"])
def test_simulated_runs_partition_the_arena_at_every_step(engine):
    config = RunConfig(engine, model="gemma-3-1b", workload=prefix_workload(), kv_cache_gib=0.06)
    cached = simulate(config)
    plain = simulate(replace(config, engine=engine.removesuffix("-prefix")))
    slots = cached.run.num_slots
    for row in cached.run.steps:
        values = [
            row.token_states, row.outside_window, row.reservation, row.internal_frag,
            row.allocator_overhead, row.external_frag, row.free,
        ]  # fmt: skip
        assert min(values) >= -1e-6 and sum(values) == pytest.approx(slots)
    assert cached.summary["num_preemptions"] > 0  # the budget is tight: eviction and recompute
    assert cached.summary["prefix_hit_tokens"] > 0 and plain.summary["prefix_hit_tokens"] == 0
    # simulate's summary carries the hits per group: an 80-token prefix lies inside gemma-3-1b's
    # 512-token window, so its window group reuses every hit token as the full group does
    hits = cached.summary["prefix_hit_tokens"]
    assert cached.summary["prefix_hit_tokens_by_group"] == {"window-512": hits, "full": hits}
    assert "prefix_hit_tokens_by_group" not in plain.summary
    assert cached.summary["completed"] == plain.summary["completed"] == len(cached.requests)
    assert prefill_tokens(cached.run) < prefill_tokens(plain.run)


def prefill_tokens(run) -> int:
    return sum(row.num_tokens for row in run.steps if row.kind == "prefill")


@pytest.mark.parametrize("engine", ["hybrid-prefix", "jenga-prefix"])
def test_coalesced_segments_equal_step_by_step_with_the_cache(engine):
    config = RunConfig(engine, model="gemma-3-1b", workload=prefix_workload(1), kv_cache_gib=0.06)
    slow, fast = simulate(config, coalesce=False), simulate(config)
    assert len(fast.run.steps) < len(slow.run.steps)
    assert slow.summary["prefix_hit_tokens"] > 0 and slow.summary["num_preemptions"] > 0
    for a, b in zip(slow.requests, fast.requests, strict=True):
        assert (a.admitted_s, a.finish_s, a.num_preemptions, a.prefix_hit_tokens) == pytest.approx(
            (b.admitted_s, b.finish_s, b.num_preemptions, b.prefix_hit_tokens)
        )
    for name in ("tokens", "target", "asked", "granted"):
        assert getattr(slow.run.busy.footprint, name) == pytest.approx(
            getattr(fast.run.busy.footprint, name), rel=1e-9
        )


def test_summary_hit_tokens_per_group_by_hand():
    """Three requests of one prefix group (20 tokens), one at a time, then one of its own. r0
    computes everything; r1 (prompt 30) hits 5 blocks: the full group 20 tokens, the window group
    (window 9) blocks 3-4 only, 8 tokens; r2 (prompt 14) hits 3 blocks (before its last token):
    full 12, window blocks 1-2 (a hit at 12 reads from position 4), 8; r3 nothing."""
    requests = (
        Request(0, 0.0, 25, 2, prefix_group="g", prefix_len=20),
        Request(1, 10.0, 30, 3, prefix_group="g", prefix_len=20),
        Request(2, 20.0, 14, 2, prefix_group="g", prefix_len=20),
        Request(3, 30.0, 22, 2),
    )
    for engine in ("hybrid-prefix", "jenga-prefix"):
        sched = ENGINES[engine].build(EngineOptions(400, 64, block_size=BS, watermark=0.0, kv_groups=GROUPS))
        run = Engine(sched, CostModelRunner(ONE_SECOND_STEPS)).run(Trace("hand", requests))
        done = [request_record(seq) for seq in run.sequences]
        hits = sched.allocator.prefix_hits_by_group([r.request_id for r in done])
        summary = summarize(run, done, hits_by_group=hits)
        assert [r.prefix_hit_tokens for r in done] == [0, 20, 12, 0]
        assert summary["prefix_hit_tokens"] == 32
        assert summary["prefix_hit_tokens_by_group"] == {"window-9": 16, "full": 32}
        assert summary["prefix_cache_hit_rate"] == pytest.approx(32 / (25 + 30 + 14 + 22))
    assert "prefix_hit_tokens_by_group" not in summarize(run, done)


# ---------------------------------------------------------------- real decoding


def spaced_trace() -> Trace:
    """Nine requests of three prefix groups of 24 tokens (six blocks: a hit reads past the window
    of 8) with prompts of 25-40 tokens, 0.2 s apart: later ones find earlier ones' blocks."""
    rng = np.random.default_rng(2)
    prompts, outputs = rng.integers(25, 41, 9), rng.integers(4, 16, 9)
    return Trace("spaced", tuple(
        Request(i, 0.2 * i, int(p), int(o), prefix_group=f"g{i % 3}", prefix_len=24)
        for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    ))  # fmt: skip


def burst_trace() -> Trace:
    """One request of each of two prefix groups first, then seven at once with long outputs: on a
    small budget they hit, grow, are preempted and recomputed (finding their own blocks)."""
    rng = np.random.default_rng(2)
    prompts, outputs = rng.integers(25, 31, 9), rng.integers(25, 34, 9)
    return Trace("burst", tuple(
        Request(i, float(i >= 2), int(p), int(o) if i >= 2 else 2, prefix_group=f"g{i % 2}", prefix_len=24)
        for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    ))  # fmt: skip


def decode(engine: str, trace: Trace, slots: int, attention: str = "torch"):
    """Greedy tokens of every request through `engine` on the tiny Gemma 3 on the CPU, the grouped
    arena poisoned with NaN where no block is held (`tests.test_hybrid_real.decode`): a hit on a
    block whose K/V was never written, or dropped, would poison the tokens."""
    tokens, run, _ = real_decode(GEMMA3, engine, attention=attention, slots=slots, requests=trace)
    return tokens, run


@pytest.mark.parametrize(("make", "slots"), [(spaced_trace, 256), (burst_trace, 72)], ids=["spaced", "burst"])
def test_hits_decode_the_tokens_hybrid_computes(make, slots):
    trace = make()
    expected, _ = decode("hybrid", trace, slots)
    for engine in ("hybrid-prefix", "jenga-prefix"):
        tokens, run = decode(engine, trace, slots)
        assert tokens == expected, engine
        hits = [seq.num_cached_tokens for seq in run.sequences]
        assert sum(h == 24 for h in hits) >= 4, hits  # the window group takes blocks 4-5 only
        if make is burst_trace:
            assert sum(seq.num_preemptions for seq in run.sequences) > 0, engine


def test_hits_decode_the_same_tokens_under_the_triton_kernels():
    """The window layers' prefill kernel starts a hit's reads at its window's block (4 here, after
    a hit of 24 tokens), so the entries below it (-1, their memory NaN) are never read."""
    trace = Trace("two", (
        Request(0, 0.0, 30, 3, prefix_group="g", prefix_len=24),
        Request(1, 1.0, 29, 3, prefix_group="g", prefix_len=24),
    ))  # fmt: skip
    expected, _ = decode("hybrid", trace, 256, attention="torch")
    tokens, run = decode("jenga-prefix", trace, 256, attention="triton")
    assert [seq.num_cached_tokens for seq in run.sequences] == [0, 24]
    assert tokens == expected
