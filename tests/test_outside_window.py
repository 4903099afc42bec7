"""The `outside_window` occupancy category: slots window layers hold for tokens no step reads again.

A tiny Gemma-3-shaped model (five window layers of W = 6 tokens per full layer, 8 bytes a token in
each: a slot is 48 bytes, one token of the window group 40 of them) and a hand-made timeline, with
every row's count worked out by hand for `paged` (keeps every token) and `hybrid` (frees each block
once it lies wholly behind the window).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from engines import ENGINES, EngineOptions
from engines.hybrid import GroupShape, group_shapes
from engines.windows import shared_terms, window_terms
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.engine import Engine
from kvbench.kvspec.layers import FullAttention, SlidingWindow, kv_groups
from kvbench.metrics.occupancy import CATEGORIES, Footprint, KVSnapshot, categories, window_integral
from kvbench.metrics.summary import occupancy_fractions
from kvbench.requests import Request, Trace
from kvbench.sequence import Sequence
from tests.support import examples, steps
from tests.test_allocators import PagedMachine
from tests.test_beam_sampling import SharingMachine
from tests.test_hybrid import BS, WINDOW, HybridMachine, JengaMachine
from tests.test_hybrid_prefix import JengaPrefixGroupsMachine, PrefixGroupsMachine
from tests.test_prefix_cache import PrefixMachine

GEMMA3_TINY = kv_groups((SlidingWindow(1, 2, WINDOW),) * 5 + (FullAttention(1, 2),))
WINDOW_SHARE = 40 / 48  # slots one token of the window group is
ONE_SECOND_STEPS = CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.0)
# one request of 9 prompt and 10 output tokens: a prefill (9 computed), then 9 decode steps (10..18);
# the next step reads from position computed - W + 1, so computed - 5 tokens lie behind the window
TRACE = Trace("window-timeline", (Request(0, 0.0, 9, 10), Request(1, 0.0, 3, 2)))
# tokens behind the window after each row: paged keeps them all (computed - 5; the short request
# never reaches its window) ...
PAGED_BEHIND = [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
# ... hybrid frees blocks of 4 before each step once wholly behind (from the count before the step):
# freed up to 4 before computed 10, 8 before 14, 12 before 18
HYBRID_BEHIND = [4, 1, 2, 3, 4, 1, 2, 3, 4, 1]


def run(engine: str, coalesce: bool):
    options = EngineOptions(num_slots=100, max_len=64, block_size=BS, watermark=0.0, kv_groups=GEMMA3_TINY)
    sched = ENGINES[engine].build(options)
    runner = CostModelRunner(ONE_SECOND_STEPS)
    return Engine(sched, runner, coalesce=coalesce, windows=group_shapes(GEMMA3_TINY)).run(TRACE)


@pytest.mark.parametrize(
    ("engine", "behind"), [("paged", PAGED_BEHIND), ("orca-oracle", PAGED_BEHIND), ("hybrid", HYBRID_BEHIND)]
)
def test_a_window_timeline_by_hand(engine, behind):
    slow = run(engine, coalesce=False)
    assert [row.num_steps for row in slow.steps] == [1] * 10
    assert [row.outside_window for row in slow.steps] == [int(n * WINDOW_SHARE) for n in behind]
    for row in slow.steps:
        assert (
            sum(getattr(row, c) for c in CATEGORIES) == 100 and min(getattr(row, c) for c in CATEGORIES) >= 0
        )
    assert slow.busy.footprint.outside == pytest.approx(sum(behind) * WINDOW_SHARE)  # 1 s steps
    # coalesced decode segments integrate the same slot-seconds exactly
    fast = run(engine, coalesce=True)
    assert len(fast.steps) < len(slow.steps)
    assert fast.busy.footprint.outside == pytest.approx(slow.busy.footprint.outside, rel=1e-12)
    assert fast.busy.footprint.tokens == pytest.approx(slow.busy.footprint.tokens, rel=1e-12)
    fractions = occupancy_fractions(fast.busy, 100)
    assert fractions["outside_window"] == pytest.approx(sum(behind) * WINDOW_SHARE / 1000)
    assert sum(fractions.values()) == pytest.approx(1.0)


def test_hybrid_holds_less_outside_the_window_than_paged_and_jenga_what_hybrid_does():
    paged, hybrid, jenga = (run(e, coalesce=True) for e in ("paged", "hybrid", "jenga"))
    assert hybrid.busy.footprint.outside < paged.busy.footprint.outside / 2
    assert jenga.busy.footprint.outside == pytest.approx(hybrid.busy.footprint.outside)


def test_no_window_layers_no_outside_window():
    options = EngineOptions(
        num_slots=100, max_len=64, block_size=BS, kv_groups=kv_groups((FullAttention(1, 2),))
    )
    for windows in (None, (GroupShape(8),)):
        sched = ENGINES["paged"].build(options)
        result = Engine(sched, CostModelRunner(ONE_SECOND_STEPS), windows=windows).run(TRACE)
        assert {row.outside_window for row in result.steps} == {0}
        assert result.busy.footprint.outside == 0


def test_outside_window_is_carved_out_of_token_states():
    fp = Footprint(tokens=10, target=12, asked=16, granted=17, external=1, idle=2, outside=4)
    got = categories(fp, 30)
    assert got["token_states"] == 6 and got["outside_window"] == 4 and sum(got.values()) == 30
    assert list(KVSnapshot.of(fp, 30).as_dict().values()) == [6, 4, 2, 4, 1, 2, 1, 10]


def test_window_integral_is_the_step_by_step_sum():
    durations = np.array([1.0, 2.0, 4.0, 0.5])
    scale, behind = np.array([0.5, 2.0, 1.0]), np.array([2, -1, 7])
    # step j (later = 3 - j) holds max(behind - later, 0) of each term
    by_step = [float(scale @ np.maximum(behind - later, 0)) for later in (3, 2, 1, 0)]
    assert window_integral(scale, behind, durations) == pytest.approx(float(np.dot(by_step, durations)))


class _OutsideWindow:
    """Mixed into the hybrid state machines: the categories with outside_window sum to the arena,
    and outside_window is what the held window blocks keep older than the window, counted here."""

    @invariant()
    def outside_window_partition(self):
        terms = window_terms(self.alloc, self.alloc.shapes, self.resident)
        held = 0
        for seq in self.resident:
            window, full = self.alloc.held_blocks(seq)
            first_held = (full - window) * BS  # freed blocks come first
            held += 24 * max(seq.num_computed - WINDOW + 1 - first_held, 0)  # 3 window layers, 24 B
        assert terms.slots * 40 == pytest.approx(held)
        fp = self.alloc.footprint()
        assert terms.slots <= fp.tokens + 1e-9
        values = list(
            categories(
                Footprint(fp.tokens, fp.target, fp.asked, fp.granted, outside=terms.slots), 60
            ).values()
        )
        assert sum(values) == pytest.approx(60) and min(values) >= -1e-9


class HybridWindowMachine(_OutsideWindow, HybridMachine):
    pass


class JengaWindowMachine(_OutsideWindow, JengaMachine):
    pass


@pytest.mark.parametrize("machine", [HybridWindowMachine, JengaWindowMachine])
def test_hybrid_state_machines_partition_with_outside_window(machine):
    run_state_machine_as_test(machine, settings=settings(stateful_step_count=steps(40), deadline=None))


def test_samples_sharing_their_prompt_hold_its_slots_outside_the_window_once():
    """Two parallel samples of a 9-token prompt share its blocks until one writes into a shared
    block (copy-on-write copies the last, part-filled one at the first decode). Behind a window of
    6 after c tokens computed lie c - 5 tokens of each sample: the first 8 sit in the two blocks
    they still share and are one set of slots, the rest each sample's own:
    min(c - 5, 8) + 2 max(c - 13, 0) tokens of the window group. Step by step and coalesced
    (paged-prefix runs the decodes as one segment) integrate the same slot-seconds."""
    trace = Trace("samples", (Request(0, 0.0, 9, 10, n=2),))
    computed = range(9, 19)  # after the prefill, then after each of the 9 decode steps
    behind = [min(c - 5, 8) + 2 * max(c - 13, 0) for c in computed]
    for engine in ("paged", "paged-prefix"):
        options = EngineOptions(num_slots=200, max_len=64, block_size=BS, watermark=0.0,
                                kv_groups=GEMMA3_TINY)  # fmt: skip
        runs = {}
        for coalesce in (False, True):
            sched, runner = ENGINES[engine].build(options), CostModelRunner(ONE_SECOND_STEPS)
            engine_run = Engine(sched, runner, coalesce=coalesce, windows=group_shapes(GEMMA3_TINY))
            runs[coalesce] = engine_run.run(trace)
        slow = runs[False]
        assert [row.num_steps for row in slow.steps] == [1] * 10, engine
        assert [row.outside_window for row in slow.steps] == [int(n * WINDOW_SHARE) for n in behind], engine
        assert slow.busy.footprint.outside == pytest.approx(sum(behind) * WINDOW_SHARE), engine
        assert runs[True].busy.footprint.outside == pytest.approx(sum(behind) * WINDOW_SHARE), engine
    assert len(runs[True].steps) == 2  # paged-prefix: the prefill, then one segment of 9 decodes


BLOCK_TABLE_ENGINES = ("paged", "paged-prefix", "hybrid", "jenga", "hybrid-prefix", "jenga-prefix")


@pytest.mark.parametrize("engine", BLOCK_TABLE_ENGINES)
def test_coalesced_segments_integrate_shared_slots_as_steps_do(engine):
    """Samples (three of one prompt, two of a later one) and a beam pair on the window model:
    where an engine runs decodes as multi-step segments, the shared-slot corrections integrate
    to the slot-seconds the step-by-step run adds up, outside the window and in token states."""
    traces = (
        Trace("samples", (Request(0, 0.0, 9, 30, n=3), Request(1, 2.0, 5, 20, n=2))),
        Trace("beams", (Request(0, 0.0, 9, 12, beam_width=2),)),
    )
    options = EngineOptions(num_slots=400, max_len=64, block_size=BS, watermark=0.0, kv_groups=GEMMA3_TINY)
    for trace in traces:
        runs = [
            Engine(ENGINES[engine].build(options), CostModelRunner(ONE_SECOND_STEPS), coalesce=coalesce,
                   windows=group_shapes(GEMMA3_TINY)).run(trace)
            for coalesce in (False, True)
        ]  # fmt: skip
        slow, fast = (run.busy.footprint for run in runs)
        assert slow.outside > 0 and [row.num_steps for row in runs[0].steps] == [1] * len(runs[0].steps)
        assert fast.outside == pytest.approx(slow.outside, rel=1e-12), trace.name
        assert fast.tokens == pytest.approx(slow.tokens, rel=1e-12), trace.name


def outside_by_slot(alloc, shapes, seqs) -> float:
    """Slots lying behind the window of every sequence mapping them, counted slot by slot from
    the block tables (each window group's share of a slot's bytes): the paged allocators' one
    table, or each group's own under the grouped allocators (freed entries None)."""
    slot_bytes = sum(shape.bytes_per_token for shape in shapes)
    bs, total = alloc.block_size, 0.0
    for g, shape in enumerate(shapes):
        if not shape.window:
            continue
        behind: dict[tuple[int, int], bool] = {}
        for seq in seqs:
            grouped = getattr(alloc, "_tables", {}).get(seq)
            table = grouped[g] if grouped and isinstance(grouped[0], list) else None
            blocks = table if table is not None else alloc.addressing(seq).blocks
            edge = seq.num_computed - shape.window + 1
            for index, block in enumerate(blocks):
                for offset in range(bs) if block is not None else ():
                    slot = (block, offset)
                    behind[slot] = behind.get(slot, True) and index * bs + offset < edge
        total += shape.bytes_per_token / slot_bytes * sum(behind.values())
    return total


class _SharedOutsideWindow:
    """Mixed into the paged state machines (forks; beams re-forked and pruned; prefix-cache hits,
    swaps): each sequence's window terms and the shared blocks' corrections count exactly the
    slots behind every holder's window."""

    @invariant()
    def outside_window_counts_each_shared_slot_once(self):
        if getattr(self, "alloc", None) is None:
            return
        name = next(n for n in ("tables", "history", "resident") if hasattr(self, n))  # its residents
        seqs = list(getattr(self, name))
        shapes = getattr(self.alloc, "shapes", None) or group_shapes(GEMMA3_TINY)
        counted = window_terms(self.alloc, shapes, seqs).slots + shared_terms(self.alloc, shapes, seqs).slots
        assert counted == pytest.approx(outside_by_slot(self.alloc, shapes, seqs), abs=1e-9)


class PagedWindowMachine(_SharedOutsideWindow, PagedMachine):
    pass


class PrefixWindowMachine(_SharedOutsideWindow, PrefixMachine):
    pass


class BeamWindowMachine(_SharedOutsideWindow, SharingMachine):
    pass


class HybridPrefixWindowMachine(_SharedOutsideWindow, PrefixGroupsMachine):
    pass


class JengaPrefixWindowMachine(_SharedOutsideWindow, JengaPrefixGroupsMachine):
    pass


def test_window_groups_after_a_full_group_are_counted_too():
    """The terms walk every KV group and skip the full ones, wherever they stand: a model listing
    its full group first (shapes reversed here) counts what the window-first order counts, the
    slots two forked sequences share once, as the block tables give them slot by slot."""
    alloc = ENGINES["paged"].build(EngineOptions(num_slots=200, max_len=64, block_size=BS,
                                                 watermark=0.0, kv_groups=GEMMA3_TINY)).allocator  # fmt: skip
    parent = Sequence(Request(0, 0.0, 17, 10, n=2))
    child = Sequence(Request(0, 0.0, 17, 10, n=2))
    alloc.allocate(parent)
    parent.advance(1, 0.0)
    alloc.fork(parent, child)
    child.copy_progress(parent)
    for seq in (parent, child):  # three decode steps each, the first copying the shared last block
        for _ in range(3):
            alloc.append(seq)
            seq.advance(1, 0.0)
    seqs = [parent, child]
    forward = group_shapes(GEMMA3_TINY)
    assert not forward[-1].window and all(shape.window for shape in forward[:-1])
    for shapes in (forward, tuple(reversed(forward))):
        counted = window_terms(alloc, shapes, seqs).slots + shared_terms(alloc, shapes, seqs).slots
        assert counted == pytest.approx(outside_by_slot(alloc, shapes, seqs))
    # 20 computed each: 15 tokens behind a window of 6, the 16 of the four shared blocks once
    assert counted == pytest.approx((min(15, 16) + 2 * max(15 - 16, 0)) * WINDOW_SHARE)


SHARING_MACHINES = (PagedWindowMachine, PrefixWindowMachine, BeamWindowMachine, HybridPrefixWindowMachine,
                    JengaPrefixWindowMachine)  # fmt: skip


@pytest.mark.parametrize("machine", SHARING_MACHINES)
def test_block_table_state_machines_count_shared_slots_outside_the_window_once(machine):
    run_state_machine_as_test(
        machine, settings=settings(max_examples=examples(60), stateful_step_count=steps(40), deadline=None)
    )
