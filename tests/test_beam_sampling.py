"""Sharing the KV cache: the beam step, copy-on-write under random forks, simulated groups."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engines import ENGINES, EngineOptions
from engines.arena import BuddyArena, FirstFitArena
from engines.beam import SyntheticScores, assign_slots, beam_step
from engines.contiguous import ContiguousAllocator, OracleReservation
from engines.paged import PagedAllocator
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.engine import Engine
from kvbench.metrics.occupancy import CATEGORIES
from kvbench.metrics.summary import sharing_saved_fraction
from kvbench.requests import Request, Trace
from kvbench.sequence import SeqStatus, Sequence, sequence_for
from tests.support import examples, steps
from workloads.spec import WorkloadSpec, build_trace

COST = CostModel(fixed_s=0.02, per_token_s=1e-4, per_kv_token_s=5e-7, per_copy_slot_s=1e-7)

# ---------------------------------------------------------------- the beam step


def brute_force_beams(scores, tokens, logprobs, width):
    """Every (beam, candidate) pair, best total first; ties to the lower beam, then the better rank."""
    pairs = [(scores[b] + logprobs[b][r], b, r) for b in range(len(scores)) for r in range(len(tokens[b]))]
    pairs.sort(key=lambda pair: (-pair[0], pair[1], pair[2]))
    return [(b, tokens[b][r], total) for total, b, r in pairs[:width]]


@settings(max_examples=examples(300))
@given(
    st.integers(1, 6).flatmap(
        lambda beams: st.tuples(
            st.lists(st.sampled_from([0.0, -0.5, -1.0, -1.25]), min_size=beams, max_size=beams),
            st.integers(1, 8),
            st.integers(1, 12),
            st.integers(0, 2**31),
        )
    )
)
def test_beam_step_equals_brute_force(case):
    scores, count, width, seed = case
    rng = np.random.default_rng(seed)
    # coarse log-probabilities, so ties are frequent and tie-breaking is exercised
    logprobs = -np.sort(rng.integers(0, 4, (len(scores), count)) * 0.25, axis=1)
    tokens = rng.integers(0, 50, (len(scores), count))
    width = min(width, len(scores) * count)
    got = [(c.parent, c.token, c.score) for c in beam_step(scores, tokens, logprobs, width)]
    assert got == brute_force_beams(scores, tokens.tolist(), logprobs.tolist(), width)


@given(st.lists(st.integers(0, 5), min_size=6, max_size=6))
def test_assign_slots_keeps_parents_in_place(parents):
    slots, unchosen = assign_slots(parents, 6)
    assert sorted(slots) == list(range(6))
    assert set(unchosen) == set(range(6)) - set(parents)
    for index, (parent, slot) in enumerate(zip(parents, slots, strict=True)):
        first = parents.index(parent) == index
        assert (slot == parent) == first  # the best child stays; the others move to unchosen slots


def test_synthetic_scores_are_seeded_and_sorted():
    first, again, other = (SyntheticScores(rid, 4, 8, chunk=3) for rid in (7, 7, 8))
    steps = [first.next(4) for _ in range(5)]  # across chunks
    for (tokens, logprobs), (same_tokens, same_logprobs) in zip(steps, map(again.next, [4] * 5), strict=True):
        assert (tokens == same_tokens).all() and (logprobs == same_logprobs).all()
    for tokens, logprobs in steps:
        assert tokens.shape == logprobs.shape == (4, 8)
        assert (np.diff(logprobs, axis=1) <= 0).all() and (logprobs < 0).all()
        assert (np.exp(logprobs).sum(axis=1) < 1).all()  # the best candidates of a distribution
    assert not (other.next(4)[0] == steps[0][0]).all()
    assert other.next(1)[0].shape == (1, 8)


# ---------------------------------------------------------------- copy-on-write under random forks


class SharingMachine(RuleBasedStateMachine):
    """Random admissions, forks, re-forks (a pruned beam taking another's K/V), steps and frees.

    A fake arena stores, at each slot, the token whose K/V a step wrote there; every resident
    sequence must read back its own history through its block table at every point, which
    fails if a step ever wrote into a block another sequence still maps (copy-on-write).
    """

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(4, 40))
    def setup(self, block_size, num_blocks):
        self.alloc = PagedAllocator(num_blocks * block_size, block_size, watermark=0.0)
        self.store: dict[int, int] = {}  # slot -> token whose K/V it holds
        self.history: dict[Sequence, list[int]] = {}  # resident sequence -> all its tokens
        self.rng = np.random.default_rng(0)
        self.next_id = 0

    def slot(self, seq: Sequence, position: int) -> int:
        blocks = self.alloc.addressing(seq).blocks
        bs = self.alloc.block_size
        return blocks[position // bs] * bs + position % bs

    def compute(self, seq: Sequence) -> None:
        """The step itself: write the uncomputed positions, then sample one more token."""
        for position in range(seq.num_computed, seq.num_tokens):
            self.store[self.slot(seq, position)] = self.history[seq][position]
        if seq.advance(1, 0.0):
            self.alloc.free(seq)
            del self.history[seq]
        else:
            self.history[seq].append(int(self.rng.integers(1000)))

    def pick(self, index: int) -> Sequence:
        return list(self.history)[index % len(self.history)]

    @rule(prompt=st.integers(1, 10), output=st.integers(2, 30))
    def admit(self, prompt, output):
        self.next_id += 1
        seq = Sequence(Request(self.next_id, 0.0, prompt, output))
        if self.alloc.can_allocate(seq):
            self.alloc.allocate(seq)
            self.history[seq] = [int(t) for t in self.rng.integers(1000, size=prompt)]
            self.compute(seq)

    @precondition(lambda self: self.history)
    @rule(index=st.integers(0, 99))
    def fork(self, index):
        parent = self.pick(index)
        child = Sequence(parent.request, sample=1)
        child.copy_progress(parent)
        assert self.alloc.fork(parent, child) == []
        # a fork diverges at the token not yet computed (a sample's or a beam's own token)
        self.history[child] = [*self.history[parent][:-1], int(self.rng.integers(1000))]

    @precondition(lambda self: len(self.history) > 1)
    @rule(a=st.integers(0, 99), b=st.integers(0, 99))
    def refork(self, a, b):
        parent, pruned = self.pick(a), self.pick(b)
        if parent is pruned or parent.request is not pruned.request:
            return  # beams re-fork within a group only (equal lengths)
        self.alloc.free(pruned)
        pruned.copy_progress(parent)
        self.alloc.fork(parent, pruned)
        self.history[pruned] = [*self.history[parent][:-1], int(self.rng.integers(1000))]

    @precondition(lambda self: self.history)
    @rule(index=st.integers(0, 99))
    def step(self, index):
        seq = self.pick(index)
        if not self.alloc.can_append(seq):
            self.alloc.free(seq)
            del self.history[seq]
            return
        for src, dst in self.alloc.append(seq):  # copy-on-write: copy the block first
            bs = self.alloc.block_size
            for offset in range(bs):
                if src * bs + offset in self.store:
                    self.store[dst * bs + offset] = self.store[src * bs + offset]
        bs = self.alloc.block_size
        written = {self.slot(seq, p) // bs for p in range(seq.num_computed, seq.num_tokens)}
        assert all(self.alloc._refs[block] == 1 for block in written), "a step would write a shared block"
        self.compute(seq)

    @precondition(lambda self: self.history)
    @rule(index=st.integers(0, 99))
    def free(self, index):
        seq = self.pick(index)
        self.alloc.free(seq)
        del self.history[seq]

    @invariant()
    def everyone_reads_their_own_history(self):
        self.alloc.check_integrity()
        tables = [self.alloc.addressing(seq).blocks for seq in self.history]
        refs = [0] * self.alloc.num_blocks
        for table in tables:
            for block in table:
                refs[block] += 1
        assert refs == self.alloc._refs
        bs = self.alloc.block_size
        assert self.alloc.sharing_saved() == sum(max(r - 1, 0) for r in refs) * bs
        fp = self.alloc.footprint()
        assert fp.granted == sum(r > 0 for r in refs) * bs
        for seq, history in self.history.items():
            for position in range(seq.num_computed):
                assert self.store[self.slot(seq, position)] == history[position], (seq.seq_id, position)

    def teardown(self):
        for seq in list(self.history):
            self.alloc.free(seq)
        self.alloc.check_integrity()
        assert self.alloc.num_free_blocks == self.alloc.num_blocks


TestSharingMachine = SharingMachine.TestCase
TestSharingMachine.settings = settings(max_examples=examples(120), stateful_step_count=steps(60))


# ---------------------------------------------------------------- contiguous groups


@pytest.mark.parametrize("arena", [BuddyArena, FirstFitArena])
def test_contiguous_group_reserves_every_output_and_copies_on_fork(arena):
    alloc = ContiguousAllocator(arena(256), OracleReservation())
    leader = sequence_for(Request(0, 0.0, 10, 6, n=3))  # kv_len 15: one extent each
    assert alloc.can_ever_hold(leader.request) and alloc.can_allocate(leader)
    alloc.allocate(leader)
    grant = arena(256).grant_size(15)
    assert alloc.footprint().granted == 3 * grant and alloc.footprint().tokens == 0
    alloc.check_integrity()
    leader.advance(1, 0.0)  # the prompt computed
    group = leader.group
    group.forked = True
    copies = []
    for child in group.members[1:]:
        child.copy_progress(leader)
        copies += alloc.fork(leader, child)
    assert copies == [(0, alloc.addressing(m).start, 10) for m in group.members[1:]]
    assert alloc.footprint().tokens == 3 * 10  # every output holds its own prompt
    alloc.check_integrity()
    alloc.free(group.members[2])  # a pruned beam's extent waits in the pool
    assert alloc.footprint().granted == 3 * grant
    alloc.fork(group.members[1], group.members[2])
    for member in group.members:
        alloc.free(member)
    alloc.check_integrity()
    assert alloc.footprint().granted == 0 and alloc.arena.num_free == 256
    assert not ContiguousAllocator(arena(40), OracleReservation()).can_ever_hold(Request(0, 0.0, 10, 6, n=3))


# ---------------------------------------------------------------- simulated runs


class CheckingRunner(CostModelRunner):
    """Cost-model steps, with the scheduler's and allocator's invariants checked before each."""

    def __init__(self, cost, scheduler) -> None:
        super().__init__(cost)
        self.scheduler = scheduler

    def run(self, batch, max_steps, start_s, until_s):
        self.scheduler.check_integrity()
        self.scheduler.allocator.check_integrity()
        return super().run(batch, max_steps, start_s, until_s)


def simulate(engine: str, trace: Trace, num_slots: int = 6000, coalesce: bool = True, block_size: int = 16):
    max_len = max(r.total_len for r in trace.requests)
    sched = ENGINES[engine].build(EngineOptions(num_slots=num_slots, max_len=max_len, block_size=block_size))
    run = Engine(sched, CheckingRunner(COST, sched), coalesce=coalesce).run(trace)
    assert not sched.has_work()
    empty = sched.allocator.footprint()
    assert (empty.tokens, empty.asked, empty.granted) == (0, 0, 0)
    for row in run.steps:
        assert sum(getattr(row, name) for name in CATEGORIES) == num_slots
        assert min(getattr(row, name) for name in CATEGORIES) >= 0
    for seq in run.sequences:
        for member in seq.group.members if seq.group else (seq,):
            assert member.status is SeqStatus.FINISHED and member.num_generated == seq.request.output_len
    return run


def sharing_trace(n: int = 1, beam: int = 1, count: int = 60, source: str = "alpaca-paper") -> Trace:
    return build_trace(WorkloadSpec(source, num_requests=count, rate=30.0, n=n, beam_width=beam, seed=4))


@pytest.mark.parametrize(("n", "beam"), [(4, 1), (1, 4)])
def test_sharing_saves_memory_in_paged_only(n, beam):
    # 20 requests: paged saves 13 % (n=4) and 61 % (beam 4), as with 60 (14 %, 61 %), in a third of the time
    trace = sharing_trace(n, beam, count=20)
    saved = {engine: sharing_saved_fraction(simulate(engine, trace, 9000).busy) for engine in ENGINES}
    assert saved["paged"] > 0.05 and saved["paged-static"] > 0.05
    assert all(saved[e] == 0 for e in ("static", "orca-max", "orca-pow2", "orca-oracle"))


def test_contiguous_engines_hold_a_copy_per_output_paged_shares_the_prompt():
    trace = Trace("one", (Request(0, 0.0, 20, 10, n=4),))  # kv_len 29; prompt = 5 full blocks of 4
    last = {e: simulate(e, trace, num_slots=400, block_size=4).steps[-1] for e in ("paged", "orca-oracle")}
    assert last["orca-oracle"].token_states == 4 * 29 and last["orca-oracle"].shared_saved == 0
    assert last["paged"].token_states == 20 + 4 * 9  # the prompt once, each sample's outputs
    assert last["paged"].shared_saved == 3 * 20  # three samples map the prompt's blocks too


@pytest.mark.parametrize("engine", ["paged", "orca-oracle", "static", "paged-static"])
@pytest.mark.parametrize(("n", "beam"), [(3, 1), (1, 3)])
def test_groups_coalesced_equal_step_by_step(engine, n, beam):
    trace = sharing_trace(n, beam, count=40)
    slow, fast = (simulate(engine, trace, num_slots=3000, coalesce=c) for c in (False, True))
    assert sum(row.num_steps for row in fast.steps) == len(slow.steps)
    for a, b in zip(slow.sequences, fast.sequences, strict=True):
        assert (a.admitted_s, a.finish_s) == pytest.approx((b.admitted_s, b.finish_s), rel=1e-9)
    for name in ("tokens", "target", "asked", "granted"):
        x, y = getattr(slow.busy.footprint, name), getattr(fast.busy.footprint, name)
        assert x == pytest.approx(y, rel=1e-9)
    assert slow.busy.saved == pytest.approx(fast.busy.saved, rel=1e-9)


def test_beam_groups_survive_heavy_preemption():
    trace = build_trace(WorkloadSpec("sharegpt-paper", num_requests=30, rate=math.inf, beam_width=4, seed=2))
    trace = Trace(trace.name, tuple(r for r in trace.requests if r.total_len <= 600))
    run = simulate("paged", trace, num_slots=2600, block_size=8)
    assert sum(seq.num_preemptions for seq in run.sequences) > 3  # the case is exercised
    assert sharing_saved_fraction(run.busy) > 0.1


def test_beam_scores_are_the_same_in_every_engine():
    trace = sharing_trace(1, 3, count=20)
    runs = {e: simulate(e, trace) for e in ("paged", "orca-oracle", "static")}
    scores = {e: [[m.score for m in s.group.members] for s in run.sequences] for e, run in runs.items()}
    assert scores["paged"] == scores["orca-oracle"] == scores["static"]
    assert all(m[0] >= max(m) for m in scores["paged"])  # the leader holds the best beam


def test_a_group_is_one_request_row_done_with_its_last_output():
    from kvbench.config import RunConfig
    from kvbench.simulate import simulate as simulate_config

    workload = WorkloadSpec("sharegpt-paper", num_requests=40, rate=math.inf, n=3, max_total_len=1024)
    result = simulate_config(RunConfig(engine="paged", workload=workload, kv_cache_gib=1.5))
    seqs = {seq.seq_id: seq for seq in result.run.sequences}
    assert sum(seq.num_preemptions for s in seqs.values() for seq in s.group.members) > 0  # samples part
    for record in result.requests:
        members = seqs[record.request_id].group.members
        assert record.num_outputs == 3
        assert record.finish_s == max(m.finish_s for m in members) >= members[0].finish_s
        assert record.num_preemptions == sum(m.num_preemptions for m in members)
    summary = result.summary
    tokens = sum(3 * r.output_len for r in result.requests)
    assert summary["output_token_throughput"] == pytest.approx(tokens / summary["makespan_s"])
    assert 0 < summary["sharing_saved_fraction"] < 1
    assert any(row.shared_saved > 0 for row in result.run.steps)


def test_external_engines_and_both_sharing_patterns_are_refused():
    from kvbench.config import RunConfig, prepare
    from kvbench.errors import KvbenchError

    both = WorkloadSpec("alpaca-paper", num_requests=3, rate=1.0, n=2, beam_width=2)
    with pytest.raises(KvbenchError, match="give one of --n and --beam-width"):
        prepare(RunConfig(engine="paged", workload=both))
    with pytest.raises(KvbenchError, match="external engines run one output per request"):
        prepare(
            RunConfig(
                engine="hf-generate", workload=WorkloadSpec("alpaca-paper", num_requests=3, rate=1.0, n=2)
            )
        )
