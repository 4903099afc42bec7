"""The virtual-memory allocator (`engines.vmm`): exact pages and ranges, deferred reclamation,
occupancy categories, groups, multi-step growth, and random runs against a model."""

from __future__ import annotations

import json
import math
from collections import deque
from fractions import Fraction

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engines.allocator import Extent, snapshot
from engines.vmm import VirtualAllocator
from kvbench.metrics.occupancy import Footprint
from kvbench.requests import Request
from kvbench.sequence import Sequence, sequence_for
from tests.support import examples, steps


def seq_of(request_id: int, prompt: int, output: int, **sharing) -> Sequence:
    return sequence_for(Request(request_id, 0.0, prompt, output, **sharing))


def small(deferred: bool = True, **kw) -> VirtualAllocator:
    """4-slot pages, 5 of them in a 22-slot budget (2 slots short of a page), 3 ranges of 8 slots."""
    args = {"num_slots": 22, "page_tokens": 4, "num_pages": 5, "max_len": 8, "max_requests": 3}
    return VirtualAllocator(**(args | {"watermark": 0.0} | kw), deferred=deferred)


def run_one_step(alloc: VirtualAllocator, seq: Sequence) -> bool:
    """One step of `seq` (prefill or decode), as the engine makes it: room first, then the step."""
    assert alloc.can_append(seq)
    alloc.append(seq)
    finished = seq.advance(1, 0.0)
    alloc.check_integrity()
    return finished


def admit(alloc: VirtualAllocator, seq: Sequence) -> None:
    assert alloc.can_allocate(seq)
    alloc.allocate(seq)
    alloc.check_integrity()


def categories(alloc: VirtualAllocator) -> dict[str, int]:
    snap = snapshot(alloc)
    values = snap.as_dict()
    assert sum(values.values()) == alloc.num_slots and min(values.values()) >= 0, values
    return values


# ---------------------------------------------------------------- exact cases


def test_pages_are_mapped_as_a_sequence_grows_and_rounding_is_internal_fragmentation():
    alloc = small()
    a = seq_of(1, 3, 3)  # 5 slots in the end (the last token is never fed back)
    admit(alloc, a)
    assert alloc.addressing(a) == Extent(0, 4, 4)
    assert alloc.page_table(a) == (0,) and alloc.maps == 1
    run_one_step(alloc, a)  # prefill: 3 tokens computed
    run_one_step(alloc, a)  # writes position 3: still page 0
    assert alloc.page_table(a) == (0,)
    run_one_step(alloc, a)  # writes position 4: page 1 is mapped
    assert alloc.page_table(a) == (0, 1) and alloc.maps == 2
    assert categories(alloc) == {
        "token_states": 5, "outside_window": 0, "reservation": 0,
        "internal_frag": 3,  # page 1 holds 3 slots past the end
        "allocator_overhead": 0, "mapped_idle": 0, "external_frag": 2, "free": 12,
    }  # fmt: skip


def test_a_finished_range_keeps_its_pages_and_the_next_request_reuses_them():
    alloc = small()
    a = seq_of(1, 6, 1)
    admit(alloc, a)
    assert alloc.page_table(a) == (0, 1)
    run_one_step(alloc, a)
    alloc.free(a)
    alloc.check_integrity()
    assert alloc.footprint() == Footprint(0, 0, 0, 0, idle=8)
    assert categories(alloc)["mapped_idle"] == 8
    b = seq_of(2, 5, 2)
    maps = alloc.maps
    admit(alloc, b)
    assert alloc.addressing(b).start == 0  # range 0, whose two pages b needs
    assert alloc.page_table(b) == (0, 1)
    assert (alloc.maps, alloc.reused) == (maps, 2)  # no driver call
    assert alloc.footprint().idle == 0


def test_admission_picks_the_range_needing_fewest_driver_calls_and_unmaps_the_excess():
    alloc = small()
    big, tiny = seq_of(1, 8, 1), seq_of(2, 2, 1)
    admit(alloc, big)
    admit(alloc, tiny)
    assert alloc.page_table(big) == (0, 1) and alloc.page_table(tiny) == (2,)
    alloc.free(big)
    alloc.free(tiny)  # range 0 idle with 2 pages, range 1 idle with 1
    c = seq_of(3, 3, 1)  # needs 1 page: range 1 holds exactly one
    admit(alloc, c)
    assert alloc.addressing(c).start == 8 and alloc.page_table(c) == (2,)
    d = seq_of(4, 1, 1)  # needs 1: only range 0 has pages (2): its second goes back to the pool
    unmaps = alloc.unmaps
    admit(alloc, d)
    assert alloc.addressing(d).start == 0 and alloc.page_table(d) == (0,)
    assert alloc.unmaps == unmaps + 1 and list(alloc._unmapped) == [3, 4, 1]


def test_a_page_is_reclaimed_from_an_idle_range_when_none_is_unmapped():
    alloc = small()
    a, b = seq_of(1, 8, 1), seq_of(2, 8, 1)
    admit(alloc, a)
    admit(alloc, b)
    c = seq_of(3, 1, 8)
    admit(alloc, c)  # pages 0-1 (a), 2-3 (b), 4 (c): the pool is empty
    assert alloc.page_table(c) == (4,) and not alloc._unmapped
    alloc.free(a)  # range 0 idle with pages 0, 1
    for _ in range(4):
        run_one_step(alloc, c)  # positions 0..3 on page 4
    assert alloc.can_append(c)
    unmaps = alloc.unmaps
    run_one_step(alloc, c)  # position 4 needs a page: page 1 leaves idle range 0
    assert alloc.page_table(c) == (4, 1) and alloc.unmaps == unmaps + 1
    assert alloc.footprint().idle == 4


def test_reclamation_takes_from_the_idle_range_holding_the_fewest_pages():
    alloc = small(max_len=12)
    a, b, c = seq_of(1, 8, 1), seq_of(2, 4, 1), seq_of(3, 5, 8)
    for s in (a, b, c):
        admit(alloc, s)
    assert [alloc.page_table(s) for s in (a, b, c)] == [(0, 1), (2,), (3, 4)]
    alloc.free(a)  # range 0 idle with 2 pages
    alloc.free(b)  # range 1 idle with 1
    for _ in range(4):
        run_one_step(alloc, c)  # prefill, then positions 5..7
    run_one_step(alloc, c)  # position 8: a third page, from range 1
    assert alloc.page_table(c) == (3, 4, 2)
    assert alloc._mapped[0] == [0, 1] and alloc._mapped[1] == []


def test_pages_reserved_ahead_are_held_from_admission_and_given_up_to_growth_furthest_ahead_first():
    """`look_ahead` (mapping ahead) reserves a decoding sequence's next pages: reserved slots of
    its request, which no admission takes; a sequence that needs a page when none is unmapped or
    idle takes one from the range furthest ahead of its tokens instead of being preempted."""
    alloc = VirtualAllocator(
        num_slots=40, page_tokens=4, num_pages=10, max_len=16, max_requests=4, watermark=0
    )
    a, b, c = seq_of(1, 4, 12), seq_of(2, 4, 12), seq_of(3, 8, 8)
    for seq in (a, b, c):
        admit(alloc, seq)  # ranges 0, 1, 2: 1, 1 and 2 pages
        run_one_step(alloc, seq)  # prefills: a and b hold 5 tokens, c 9
    before = categories(alloc)
    alloc.look_ahead([a], 4)  # a reaches 13 tokens in 8 more steps: 4 pages, 3 reserved
    alloc.look_ahead([b], 2)  # b reaches 9: 3 pages, 2 reserved
    assert alloc.mapped_counts().tolist() == [4, 3, 2, 0] and (alloc.ahead_maps, alloc.ahead_lost) == (5, 0)
    after = categories(alloc)  # still summing to the arena: the reserved slots are a reservation
    assert before["reservation"] == 0 and after["free"] == before["free"] - 5 * 4
    assert (after["reservation"], after["internal_frag"]) == (19, 1)  # a's 4th page ends past its 15 tokens
    assert alloc.available_pages == 1 and not alloc.can_allocate(seq_of(4, 8, 1))  # 2 pages: it waits
    run_one_step(alloc, c)  # position 8: c's third page, the last unmapped one
    for _ in range(3):
        run_one_step(alloc, c)  # positions 9-11
    assert alloc.mapped_counts().tolist() == [4, 3, 3, 0] and alloc.available_pages == 0
    assert alloc.can_append(c)  # position 12 needs a fourth page: a's and b's lookahead may give it
    run_one_step(alloc, c)  # a is 2 pages past its tokens, b 1: a gives up its last page
    assert alloc.mapped_counts().tolist() == [3, 3, 4, 0] and alloc.ahead_lost == 1
    assert alloc.driver_calls[1] == 1  # unmapped inside c's step
    assert sum(seq.num_preemptions for seq in (a, b, c)) == 0


def test_pages_of_a_fractional_number_of_tokens_let_tokens_straddle_them():
    # 2.5 tokens a page (a token straddles every second page boundary), 8 pages
    alloc = VirtualAllocator(21, Fraction(5, 2), 8, max_len=8, max_requests=2, watermark=0.0)
    assert (alloc.range_pages, alloc.range_slots) == (4, 10)  # whole pages and whole tokens
    a = seq_of(1, 6, 2)
    admit(alloc, a)  # 6 tokens: 3 pages, holding 7.5
    assert alloc.page_table(a) == (0, 1, 2) and alloc.addressing(a) == Extent(0, 7, 7)
    assert alloc.footprint() == Footprint(0, 7, 7, 7.5)
    assert categories(alloc) == {
        "token_states": 0, "outside_window": 0, "reservation": 7, "internal_frag": 0, "allocator_overhead": 0,
        "mapped_idle": 0, "external_frag": 1, "free": 13,  # 21 - 20 = 1; the half slot in free
    }  # fmt: skip
    run_one_step(alloc, a)  # prefill
    run_one_step(alloc, a)  # position 6: still inside 7 whole tokens
    assert alloc.page_table(a) == (0, 1, 2)
    b = seq_of(2, 1, 9)
    admit(alloc, b)
    assert alloc.addressing(b).start == 10


def test_without_deferred_reclamation_a_finished_range_is_unmapped_at_once():
    alloc = small(deferred=False)
    a = seq_of(1, 6, 1)
    admit(alloc, a)
    alloc.free(a)
    assert alloc.unmaps == 2 and alloc.footprint() == Footprint(0, 0, 0, 0)
    assert list(alloc._unmapped) == [2, 3, 4, 1, 0]  # last page first, to the back of the pool


def test_admission_needs_a_free_range_and_pages_above_the_watermark():
    alloc = small(num_pages=5, watermark=0.2)  # one page kept free at admission
    assert alloc.watermark_pages == 1
    admit(alloc, seq_of(1, 8, 1))
    admit(alloc, seq_of(2, 5, 1))
    assert not alloc.can_allocate(seq_of(3, 1, 1))  # one page left: the watermark's
    roomy = small(num_pages=5, max_requests=1)
    admit(roomy, seq_of(1, 1, 1))
    assert not roomy.can_allocate(seq_of(2, 1, 1))  # pages left, but no range


def test_can_ever_hold_counts_every_output_and_the_range_length():
    alloc = small(num_pages=5, max_len=8, max_requests=3)
    assert alloc.can_ever_hold(Request(1, 0.0, 4, 5))  # 8 slots: 2 pages in one range
    assert not alloc.can_ever_hold(Request(1, 0.0, 5, 5))  # 9 slots: longer than a range
    assert alloc.can_ever_hold(Request(1, 0.0, 4, 1, n=2))  # 2 outputs x 1 page
    assert not alloc.can_ever_hold(Request(1, 0.0, 4, 5, beam_width=3))  # 3 outputs x 2 pages > 5
    assert not alloc.can_ever_hold(Request(1, 0.0, 1, 1, n=4))  # 4 outputs, 3 ranges


def test_a_group_holds_a_range_per_output_and_a_fork_copies_the_parent():
    alloc = small(num_pages=5)
    leader = seq_of(1, 3, 2, n=2)
    assert alloc.can_allocate(leader)
    admit(alloc, leader)
    assert alloc.footprint().granted == 8  # both outputs' ranges mapped for the prompt
    run_one_step(alloc, leader)
    child = leader.group.members[1]
    child.num_tokens, child.num_computed = leader.num_tokens, leader.num_computed
    copies = alloc.fork(leader, child)
    leader.group.forked = True  # as `engines.groups` marks it after the fork
    assert copies == [(alloc.addressing(leader).start, alloc.addressing(child).start, 3)]
    assert alloc.addressing(child).start != alloc.addressing(leader).start
    alloc.check_integrity()
    alloc.free(leader)  # the group keeps the leader's range (for a comeback), not its pages
    assert alloc.footprint().granted == 4 and alloc.unmaps == 1
    assert alloc.can_allocate(leader)  # back into its group's range: no free range needed
    alloc.free(child)
    assert alloc.footprint() == Footprint(0, 0, 0, 0, idle=4)
    alloc.check_integrity()


def test_growth_makes_the_pages_step_by_step_appends_make():
    def setup() -> tuple[VirtualAllocator, tuple[Sequence, ...]]:
        alloc = VirtualAllocator(200, 4, 20, 64, 4, watermark=0.0)
        seqs = tuple(seq_of(i, p, 30) for i, p in enumerate((3, 6, 9)))
        for s in seqs:
            admit(alloc, s)
            run_one_step(alloc, s)
        for s in seqs:
            alloc.append(s)  # step 0: 6 pages held, 14 unmapped
        return alloc, seqs

    stepped, seqs = setup()
    for _ in range(1, 19):
        for s in seqs:
            s.advance(1, 0.0)
            stepped.append(s)
    expected = [stepped.page_table(s) for s in seqs]

    grown, seqs = setup()
    # next pages at steps 1, 2, 3 and every 4 steps after: the 15th new page (none left) at step 19
    assert grown.growth_horizon(seqs, 40) == 19
    growth = grown.grow(seqs, 19)
    assert growth is not None and int(growth.asked.sum()) == 14 * 4
    assert [grown.page_table(s) for s in seqs] == expected

    trimmed, seqs = setup()
    trimmed.grow(seqs, 19)
    trimmed.trim(5)
    shorter, seqs2 = setup()
    shorter.grow(seqs2, 5)
    shorter.trim(5)
    assert [trimmed.page_table(s) for s in seqs] == [shorter.page_table(s) for s in seqs2]
    assert list(trimmed._unmapped) == list(shorter._unmapped) and trimmed.maps == shorter.maps
    assert trimmed.footprint() == shorter.footprint()


# ---------------------------------------------------------------- random runs against a model


class VirtualMachine(RuleBasedStateMachine):
    """Admissions, steps (with recompute preemption), finishes and segments, some mapping ahead;
    a model keeps every range's pages, the pool and the pages reserved ahead, so page ids, reuse,
    reclamation and the lookahead given up to growth are checked exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.alloc: VirtualAllocator | None = None
        self.mapped: list[list[int]] = []
        self.pool: deque[int] = deque()
        self.owner: dict[Sequence, int] = {}
        self.preempted: list[Sequence] = []
        self.next_id = 0
        self.reserved: dict[int, int] = {}  # range -> pages reserved ahead (bounded when read)
        self.lost = 0

    # -- model
    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.alloc.page_tokens)

    def free_ranges(self) -> list[int]:
        return [r for r in range(self.alloc.max_requests) if r not in self.owner.values()]

    def idle(self) -> int:
        return sum(len(self.mapped[r]) for r in self.free_ranges())

    def unreached(self, seq: Sequence) -> int:
        r = self.owner[seq]
        past = len(self.mapped[r]) - self.pages_for(seq.num_tokens)
        return max(min(self.reserved.get(r, 0), past), 0)

    def spare(self) -> int:
        return sum(self.unreached(s) for s in self.owner)

    def take(self) -> int:
        if self.pool:
            return self.pool.popleft()
        idle = [r for r in self.free_ranges() if self.mapped[r]]
        if idle:
            return self.mapped[min(idle, key=lambda r: (len(self.mapped[r]), r))].pop()
        # another sequence's lookahead: the range furthest ahead, then the lowest
        seq = max(self.owner, key=lambda s: (self.unreached(s), -self.owner[s]))
        r = self.owner[seq]
        self.reserved[r] = self.unreached(seq) - 1
        self.lost += 1
        return self.mapped[r].pop()

    def model_release(self, seq: Sequence) -> None:
        r = self.owner.pop(seq)
        self.reserved.pop(r, None)
        if not self.alloc.deferred:
            while self.mapped[r]:
                self.pool.append(self.mapped[r].pop())

    # -- rules
    @initialize(
        page=st.sampled_from([1, 2, 3, 4, Fraction(5, 2), Fraction(4, 3), Fraction(1, 2)]),
        pages=st.integers(1, 10), ranges=st.integers(1, 5),
        watermark=st.sampled_from([0.0, 0.2]), deferred=st.booleans(), tail=st.integers(0, 3),
    )  # fmt: skip
    def setup(self, page, pages, ranges, watermark, deferred, tail):
        budget = math.ceil(pages * page) + tail
        self.alloc = VirtualAllocator(budget, page, pages, 16, ranges, watermark, deferred)
        self.mapped = [[] for _ in range(ranges)]
        self.pool = deque(range(pages))

    @rule(prompt=st.integers(1, 10), output=st.integers(1, 8))
    def admit(self, prompt, output):
        self.next_id += 1
        self.admit_seq(seq_of(self.next_id, prompt, output))

    @precondition(lambda self: self.preempted)
    @rule(pick=st.integers(0, 100))
    def readmit(self, pick):
        seq = self.preempted[pick % len(self.preempted)]
        if self.admit_seq(seq):
            self.preempted.remove(seq)

    def admit_seq(self, seq: Sequence) -> bool:
        alloc, need = self.alloc, self.pages_for(seq.num_tokens)
        free = self.free_ranges()
        can = bool(free) and len(self.pool) + self.idle() - need >= alloc.watermark_pages
        assert alloc.can_allocate(seq) == can
        if not can:
            return False
        alloc.allocate(seq)
        enough = [r for r in free if len(self.mapped[r]) >= need]
        if enough:
            r = min(enough, key=lambda r: (len(self.mapped[r]), r))
        else:
            r = max(free, key=lambda r: (len(self.mapped[r]), -r))
        self.owner[seq] = r
        self.reserved.pop(r, None)
        while len(self.mapped[r]) > need:
            self.pool.append(self.mapped[r].pop())
        while len(self.mapped[r]) < need:
            self.mapped[r].append(self.take())
        if seq.advance(1, 0.0):  # the prefill step
            self.alloc.free(seq)
            self.model_release(seq)
        return True

    @precondition(lambda self: self.owner)
    @rule(pick=st.integers(0, 100))
    def step(self, pick):
        seq = list(self.owner)[pick % len(self.owner)]
        r, need = self.owner[seq], self.pages_for(seq.num_tokens)
        can = need - len(self.mapped[r]) <= len(self.pool) + self.idle() + self.spare()
        assert self.alloc.can_append(seq) == can
        if not can:  # recompute preemption
            self.alloc.free(seq)
            self.model_release(seq)
            seq.preempt()
            self.preempted.append(seq)
            return
        self.alloc.append(seq)
        while len(self.mapped[r]) < need:
            self.mapped[r].append(self.take())
        if seq.advance(1, 0.0):
            self.alloc.free(seq)
            self.model_release(seq)

    @precondition(lambda self: self.owner)
    @rule(pick=st.integers(0, 100))
    def finish(self, pick):
        seq = list(self.owner)[pick % len(self.owner)]
        self.alloc.free(seq)
        self.model_release(seq)

    @precondition(lambda self: self.owner)
    @rule(cap=st.integers(1, 20), cut=st.integers(0, 20), ahead=st.booleans())
    def segment(self, cap, cut, ahead):
        """Step 0 appended for all, then a multi-step segment grown ahead and trimmed at `cut`;
        `ahead`: then each sequence's pages for another segment as long are reserved."""
        batch = list(self.owner)
        short = sum(max(self.pages_for(s.num_tokens) - len(self.mapped[self.owner[s]]), 0) for s in batch)
        fits = short <= len(self.pool) + self.idle() + self.spare()
        assert (self.alloc.append_all(batch) is not None) == fits
        if not fits:
            return
        for s in batch:
            r = self.owner[s]
            while len(self.mapped[r]) < self.pages_for(s.num_tokens):
                self.mapped[r].append(self.take())
        batch = tuple(batch)
        max_steps = min([cap, *(s.remaining for s in batch)])
        # model: steps 1.. until the unmapped pool cannot give a needed page
        expected, pool, held = max_steps, len(self.pool), [len(self.mapped[self.owner[s]]) for s in batch]
        for step in range(1, max_steps):
            for i, s in enumerate(batch):
                need = self.pages_for(s.num_tokens + step) - held[i]
                if need > pool:
                    expected = step
                    break
                pool -= need
                held[i] += need
            if expected == step:
                break
        k = self.alloc.growth_horizon(batch, max_steps)
        assert k == expected
        ran = max(1, min(k, cut or k))
        self.alloc.grow(batch, k)
        if ahead:
            self.alloc.look_ahead(batch, ran)  # trims first
        else:
            self.alloc.trim(ran)
        for step in range(1, ran):
            for s in batch:
                r = self.owner[s]
                while len(self.mapped[r]) < self.pages_for(s.num_tokens + step):
                    self.mapped[r].append(self.pool.popleft())
        for s in batch if ahead else ():  # in batch order, unmapped then idle pages, above the watermark
            r = self.owner[s]
            want = self.pages_for(min(s.num_tokens + 2 * ran, s.request.kv_len)) - len(self.mapped[r])
            for _ in range(min(want, len(self.pool) + self.idle() - self.alloc.watermark_pages)):
                self.mapped[r].append(self.take())
                self.reserved[r] = self.reserved.get(r, 0) + 1
        for s in batch:
            if s.advance(ran, 1.0):
                self.alloc.free(s)
                self.model_release(s)

    # -- invariants
    @invariant()
    def matches_the_model(self):
        alloc = self.alloc
        if alloc is None:
            return
        alloc.check_integrity()
        assert alloc._mapped == self.mapped
        assert list(alloc._unmapped) == list(self.pool)
        for seq, r in self.owner.items():
            assert alloc.addressing(seq).start == r * alloc.range_slots
        categories(alloc)  # whole slots, summing to the arena
        fp, pt = alloc.footprint(), alloc.page_tokens
        held = [len(self.mapped[r]) for r in self.owner.values()]
        assert fp.idle == float(self.idle() * pt)
        assert fp.granted == float(sum(held) * pt)
        assert fp.asked == sum(math.floor(n * pt) for n in held)  # whole tokens the pages hold
        assert fp.tokens == sum(s.num_computed for s in self.owner)
        assert alloc.external_frag(None) == float(alloc.num_slots - alloc.num_pages * pt)
        assert alloc.ahead_lost == self.lost
        assert {r: alloc._unreached(s) for s, r in self.owner.items()} == {
            r: self.unreached(s) for s, r in self.owner.items()
        }

    @invariant()
    def predicts_its_reclaims(self):
        """`reclaim_order` names the ranges the model's next takes beyond the pool empty, in
        order (what `look_ahead` reclaims for a reservation too), without changing anything;
        `range_limits` are the pages each held range's request may ever need."""
        if self.alloc is None:
            return
        counts = [len(pages) for pages in self.mapped]
        want = []
        for _ in range(self.idle() + 1):
            idle = [r for r in self.free_ranges() if counts[r]]
            if not idle:
                break
            r = min(idle, key=lambda r: (counts[r], r))
            want.append(r)
            counts[r] -= 1
        assert self.alloc.reclaim_order(len(want) + 1) == want
        assert self.alloc.reclaim_order(1) == want[:1]
        assert self.alloc._mapped == self.mapped  # asking changed nothing
        limits = [0] * self.alloc.max_requests
        for seq, r in self.owner.items():
            limits[r] = self.pages_for(seq.request.kv_len)
        assert self.alloc.range_limits().tolist() == limits

    def teardown(self):
        if self.alloc is None:
            return
        for seq in list(self.owner):
            self.alloc.free(seq)
            self.model_release(seq)
        self.alloc.check_integrity()
        fp = self.alloc.footprint()
        assert (fp.granted, fp.idle) == (0, float(self.idle() * self.alloc.page_tokens))


TestVirtualMachine = VirtualMachine.TestCase
TestVirtualMachine.settings = settings(max_examples=examples(150), stateful_step_count=steps(50))


# ---------------------------------------------------------------- page geometry


def test_page_geometry_of_both_layouts_on_real_shapes():
    from kvbench.models import get_model
    from kvbench.vmm.pages import page_geometry

    gib, mib = 1 << 30, 1 << 20
    llama = page_geometry(get_model("llama-3-8b"), 12 * gib, "per-layer", 2048)
    # 8 KV heads x 128 x 2 bytes = 2 KiB per token and layer: a 2 MiB page holds 1,024 tokens,
    # and growing a request maps one in each of 2 x 32 tensors (128 MiB)
    assert (llama.page_tokens, llama.page_bytes, llama.num_pages) == (1024, 64 * 2 * mib, 96)
    opt = page_geometry(get_model("opt-13b"), 12 * gib, "per-layer", 2048)
    # 40 x 128 x 2 = 10 KiB: 204.8 tokens a page, 80 tensors x 2 MiB a group
    assert (opt.page_tokens, opt.page_bytes, opt.num_pages) == (Fraction(1024, 5), 160 * mib, 76)
    small = page_geometry(get_model("opt-13b"), 12 * gib, "per-layer", 64)
    assert (small.page_tokens, small.num_pages) == (Fraction(32, 5), 2457)  # 64 KiB pages, simulated
    whole = page_geometry(get_model("opt-13b"), 12 * gib, "per-request", 2048)
    # 800 KiB per token of all layers: 2.56 tokens a page; 12 GiB is 6,144 pages but 15,728 slots
    # (whole tokens), which 6,143 pages fit
    assert (whole.page_tokens, whole.num_pages) == (Fraction(64, 25), 6143)


# ---------------------------------------------------------------- the CLI


def test_simulate_vmm_sizes_pages_from_the_model_and_refuses_bad_page_flags(tmp_path):
    from tests.test_cli import kvbench

    args = ("simulate", "--engine", "vmm", "--model", "opt-13b", "--kv-cache-gib", "12", "--rate", "2",
            "--num-requests", "60", "--seed", "1")  # fmt: skip
    done = kvbench(*args, "--vmm-page-kib", "64", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["vmm_layout"], config["vmm_page_kib"]) == ("per-layer", 64)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] == 60 and "mapped_idle" in summary["occupancy"]
    for flag, value in (("--vmm-layout", "per-token"), ("--vmm-page-kib", "6"), ("--vmm-page-kib", "0")):
        bad = kvbench(*args, flag, value, "--out", str(tmp_path / "bad"))
        assert bad.returncode == 2 and bad.stderr.startswith(f"error: {flag}"), bad.stderr
        assert bad.stderr.count("\n") == 1 and not (tmp_path / "bad").exists()
