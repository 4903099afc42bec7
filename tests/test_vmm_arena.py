"""The vmm engine decoding over its virtual arena (`VirtualKVArena`) on CPU: a plain tensor
stands in for the virtual span, and a page is poisoned with NaN whenever it is mapped or
unmapped, so any read of memory a GPU would not have backed (or would have backed afresh)
changes the greedy tokens. The runner code is the one a GPU run uses."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from engines import ENGINES
from kvbench.engine import Engine
from kvbench.errors import KvbenchError
from kvbench.modeling.virtual_arena import VirtualKVArena
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from tests.support import VIRTUAL_CLOCK
from tests.test_modeling import CPU, engine_options, small_trace
from tests.test_modeling import RecordingRunner as _Recording


class SyncCheckingRunner(_Recording):
    """Asserts after each call's mapping, and after each mapping ahead, that the arena backs
    exactly what the allocator holds (its reservations included), within the budget, and that
    the allocator never reserves a page past a request's final length."""

    def _check(self):
        arena = self.virtual
        assert (arena.mapped == arena.backed(self.allocator.mapped_counts())).all()
        assert arena.mapped.sum() <= arena.num_pages + arena.pinned  # range 0's pinned page: beyond
        mapped = enumerate(arena.mapped.tolist())
        assert arena.driver_pages == {p for r, n in mapped for j in range(n) for p in arena.group(r, j)}

    def _map_pages(self, seqs):
        super()._map_pages(seqs)
        self._check()

    def _map_ahead(self, seqs, steps):
        super()._map_ahead(seqs, steps)
        self._check()
        alloc = self.allocator
        for seq in seqs:  # no page no step will write
            assert len(alloc.page_table(seq)) <= max(alloc.pages_for(seq.request.kv_len), 1)
        alloc.check_integrity()


def decode(engine: str, model_name: str, num_slots: int, *, layout="per-layer", vmm_map="sync"):
    spec = get_model(model_name)
    model = random_model(spec, torch.float32, CPU, seed=3)
    sched = ENGINES[engine].build(engine_options(num_slots, block_size=8))
    if engine == "vmm":
        arena = VirtualKVArena.for_allocator(spec, sched.allocator, layout, torch.float32, CPU)
        runner_type = SyncCheckingRunner
    else:
        from kvbench.modeling.arena import KVArena

        arena = KVArena(spec, num_slots, torch.float32, CPU)
        arena.fill(float("nan"))
        runner_type = _Recording
    runner = runner_type(
        model, arena, sched.allocator, max_batch=10, max_len=64, seed=5, attention="torch",
        clock=VIRTUAL_CLOCK, vmm_map=vmm_map,
    )  # fmt: skip
    run = Engine(sched, runner).run(small_trace(16, seed=1))
    return run, sched.allocator, arena


@pytest.mark.parametrize("layout", ["per-layer", "per-request"])
@pytest.mark.parametrize("model_name", ["tiny-opt", "tiny-llama"])
def test_vmm_over_the_virtual_arena_gives_orca_oracles_tokens(model_name, layout):
    oracle, _, _ = decode("orca-oracle", model_name, 1024)
    want = [seq.output_ids for seq in oracle.sequences]
    for vmm_map in ("sync", "ahead"):
        run, alloc, arena = decode("vmm", model_name, 1024, layout=layout, vmm_map=vmm_map)
        assert [seq.output_ids for seq in run.sequences] == want
        assert arena.maps > 0 and alloc.reused > 0  # pages were mapped, finished ranges reused
        assert (arena.ahead_maps > 0) == (vmm_map == "ahead")


def arena_and_allocator():
    """5 pages of 4 slots, 3 ranges of 12 (`tests.test_vmm.small`), and the arena over them."""
    from tests.test_vmm import small

    alloc = small(max_len=12)
    return alloc, VirtualKVArena.for_allocator(
        get_model("tiny-llama"), alloc, "per-layer", torch.float32, CPU
    )


def test_pages_mapped_ahead_are_held_so_new_requests_wait_instead_of_taking_them():
    """The loss a saturated real run showed (OPT-13B, results/reference/vmm-occupancy-real): pages
    mapped ahead out of the allocator's unmapped pool went to new requests and were unmapped
    again before any step wrote them. Mapping ahead is now an allocation: the reserved page is
    the decoding sequence's (reserved slots of its request), an admission that needs it waits,
    and the next steps find it mapped: nothing is lost."""
    from tests.test_vmm import admit, categories, run_one_step, seq_of

    alloc, arena = arena_and_allocator()
    a = seq_of(1, 4, 8)
    admit(alloc, a)  # range 0, one page
    run_one_step(alloc, a)  # prefill: 5 tokens, the next decode step writes position 4
    arena.sync(alloc.mapped_counts())
    before = categories(alloc)
    alloc.look_ahead([a], 1)  # a one-step segment launched: a's page for the next one is reserved
    arena.prefetch(alloc.mapped_counts())
    assert arena.mapped.tolist() == [2, 0, 0] and (arena.ahead_maps, arena.ahead_unmaps) == (1, 0)
    after = categories(alloc)  # the categories still sum to the arena
    assert after["reservation"] - before["reservation"] == 4 and after["free"] == before["free"] - 4
    b, c = seq_of(2, 8, 4), seq_of(3, 8, 1)
    admit(alloc, b)  # 2 of the 3 unmapped pages
    assert not alloc.can_allocate(c)  # the third is no longer enough: c waits (it took a's page before)
    calls = arena.maps + arena.unmaps
    arena.sync(alloc.mapped_counts())  # the prefill of b: its two pages, a's page stays
    assert arena.mapped.tolist() == [2, 2, 0] and arena.maps + arena.unmaps == calls + 2
    run_one_step(alloc, a)  # position 4: the reserved page, no take
    assert alloc.mapped_counts().tolist() == [2, 2, 0] and alloc.maps == 3
    arena.sync(alloc.mapped_counts())
    assert arena.maps + arena.unmaps == calls + 2 and arena.stats()["vmm_ahead_lost"] == 0
    alloc.check_integrity()
    arena.close()


def test_a_decoding_sequence_takes_anothers_lookahead_rather_than_wait_and_it_counts_lost():
    """The lookahead gives way to growth: with nothing unmapped or idle, a sequence needing a
    page for its next step takes the page another reserved and has not reached (no preemption),
    and `vmm_ahead_lost` counts that page, mapped for nothing."""
    from tests.test_vmm import admit, run_one_step, seq_of

    alloc, arena = arena_and_allocator()
    a, b = seq_of(1, 4, 8), seq_of(2, 8, 4)
    admit(alloc, a)
    admit(alloc, b)  # ranges 0 and 1: 1 and 2 pages, 2 unmapped
    run_one_step(alloc, a)
    run_one_step(alloc, b)  # b's next step writes position 8: it needs a third page
    alloc.look_ahead([a], 3)  # a reaches position 10 in another 3 steps: 2 more pages, every one left
    arena.prefetch(alloc.mapped_counts())
    assert alloc.mapped_counts().tolist() == [3, 2, 0] and alloc.available_pages == 0
    assert alloc.can_append(b)  # a's third page is reserved, not reached: b may take it
    run_one_step(alloc, b)
    assert alloc.mapped_counts().tolist() == [2, 3, 0] and alloc.ahead_lost == 1
    calls = arena.unmaps, arena.maps
    arena.sync(alloc.mapped_counts())  # inside b's step: a's page unmapped, b's mapped
    assert (arena.unmaps, arena.maps) == (calls[0] + 1, calls[1] + 1)
    assert arena.stats()["vmm_ahead_lost"] == 1
    run_one_step(alloc, a)  # a's second page was reached: position 5 writes it, nothing taken
    assert alloc.mapped_counts().tolist() == [2, 3, 0] and alloc.ahead_lost == 1
    arena.close()


def test_mapping_ahead_reclaims_an_idle_page_for_the_lookahead_so_the_step_makes_no_call():
    """With every physical page mapped (deferred reclamation), the reservation reclaims the idle
    page the allocator would take next; the arena makes the unmap and the map while the device
    runs, and the next step's `sync` has nothing left to do."""
    from tests.test_vmm import admit, run_one_step, seq_of

    alloc, arena = arena_and_allocator()
    a, b, c = seq_of(1, 4, 8), seq_of(2, 8, 1), seq_of(3, 8, 4)
    for seq in (a, b, c):
        admit(alloc, seq)  # ranges 0, 1, 2 hold 1, 2 and 2 pages: none is unmapped
    alloc.free(b)  # range 1 idle with 2 pages
    run_one_step(alloc, c)  # prefill: position 8 next
    arena.sync(alloc.mapped_counts())
    assert arena.mapped.tolist() == [1, 2, 2] and alloc.reclaim_order(1) == [1]
    alloc.look_ahead([c], 1)
    arena.prefetch(alloc.mapped_counts())  # range 1's last page unmapped, c's third mapped: ahead
    assert arena.mapped.tolist() == [1, 1, 3] and (arena.ahead_maps, arena.ahead_unmaps) == (1, 1)
    calls = arena.maps + arena.unmaps
    run_one_step(alloc, c)  # position 8: the reserved page
    arena.sync(alloc.mapped_counts())
    assert arena.maps + arena.unmaps == calls and alloc.driver_calls == (5, 0)  # admissions only
    assert alloc.ahead_unmaps == 1 and arena.stats()["vmm_ahead_lost"] == 0
    arena.close()


@pytest.mark.parametrize("num_slots", [1024, 96, 48])
def test_real_and_simulated_vmm_mapping_ahead_make_the_same_decisions(num_slots):
    """The simulator reserves ahead where the real runner does (`CostModelRunner(lookahead=)`):
    with the same virtual clock every row of steps.csv (admissions, segments, preemptions,
    maps) and every reservation agree, under memory pressure too."""
    from kvbench.cost_model import CostModelRunner

    real, alloc, arena = decode("vmm", "tiny-llama", num_slots, vmm_map="ahead")
    sched = ENGINES["vmm"].build(engine_options(num_slots, block_size=8))
    simulated = Engine(sched, CostModelRunner(VIRTUAL_CLOCK, lookahead=sched.allocator)).run(
        small_trace(16, seed=1)
    )
    assert real.steps == simulated.steps
    sim = sched.allocator
    assert (alloc.ahead_maps, alloc.ahead_unmaps, alloc.ahead_lost) == (
        sim.ahead_maps,
        sim.ahead_unmaps,
        sim.ahead_lost,
    )
    # the arena's maps ahead are the allocator's; its unmaps ahead also give back a segment's
    # pages past an arrival that cut it (grown for the steps asked, trimmed to those run)
    assert arena.ahead_maps == alloc.ahead_maps > 0 and arena.ahead_unmaps >= alloc.ahead_unmaps
    if num_slots < 1024:
        assert sum(seq.num_preemptions for seq in real.sequences) > 0  # the pressure is real


def critical_calls(arena: VirtualKVArena) -> int:
    """Driver calls `sync` made: inside a step's measured time."""
    return arena.maps - arena.ahead_maps + arena.unmaps - arena.ahead_unmaps


@pytest.mark.parametrize("layout", ["per-layer", "per-request"])
def test_vmm_arena_under_memory_pressure_remaps_pages_and_keeps_the_tokens(layout):
    oracle, _, _ = decode("orca-oracle", "tiny-llama", 1024)
    for vmm_map in ("sync", "ahead"):
        run, alloc, arena = decode("vmm", "tiny-llama", 48, layout=layout, vmm_map=vmm_map)  # 6 pages of 8
        assert sum(seq.num_preemptions for seq in run.sequences) > 0  # the case is exercised
        assert alloc.unmaps > 0 and arena.unmaps > 0  # idle pages were reclaimed under other ranges
        assert [seq.output_ids for seq in run.sequences] == [seq.output_ids for seq in oracle.sequences]


def test_mapping_ahead_takes_driver_calls_out_of_the_steps_under_memory_pressure():
    """12 pages of 8 slots for 16 requests: every page mapped, idle ones reclaimed. Ahead, the
    runner maps (and reclaims) next segments' pages while the device runs, so fewer calls are
    left inside the steps than when every page is mapped just before the step needing it."""
    calls = {}
    for vmm_map in ("sync", "ahead"):
        run, _, arena = decode("vmm", "tiny-llama", 96, vmm_map=vmm_map)
        assert sum(seq.num_preemptions for seq in run.sequences) > 0
        calls[vmm_map] = critical_calls(arena)
        if vmm_map == "ahead":
            assert arena.ahead_unmaps > 0  # idle pages reclaimed early
    assert calls["ahead"] < calls["sync"]


def test_an_arena_that_misses_a_map_changes_the_tokens():
    """The poisoning catches a runner that writes or reads a page the allocator holds but the
    arena never mapped (the check the token comparisons above rely on)."""

    class Lagging(SyncCheckingRunner):
        def _map_pages(self, seqs):  # maps each range one page short of the allocator's count
            counts = self.allocator.mapped_counts()
            self.virtual.sync(np.maximum(counts - 1, 0))
            self.virtual.sync(counts)  # mapped now, but afresh: the last page's K/V is gone
            self.virtual.sync(counts)

    spec = get_model("tiny-llama")
    model = random_model(spec, torch.float32, CPU, seed=3)
    oracle, _, _ = decode("orca-oracle", "tiny-llama", 1024)
    sched = ENGINES["vmm"].build(engine_options(1024, block_size=8))
    arena = VirtualKVArena.for_allocator(spec, sched.allocator, "per-layer", torch.float32, CPU)
    runner = Lagging(
        model, arena, sched.allocator, max_batch=10, max_len=64, seed=5, attention="torch",
        clock=VIRTUAL_CLOCK,
    )  # fmt: skip
    run = Engine(sched, runner).run(small_trace(16, seed=1))
    assert [seq.output_ids for seq in run.sequences] != [seq.output_ids for seq in oracle.sequences]


def test_sync_and_prefetch_map_and_unmap_at_each_ranges_end():
    spec = get_model("tiny-llama")  # 2 layers: a page is a driver page in each of 4 tensors
    arena = VirtualKVArena(
        spec, ranges=3, range_slots=16, page_tokens=8, num_pages=4, layout="per-layer", dtype=torch.float32,
        device=CPU,
    )  # fmt: skip
    assert arena.range_pages == 2 and arena.tensors == 4 and arena.k.shape == (2, 48, 2, 16)
    assert arena.mapped.tolist() == [1, 0, 0] and arena.driver_pages == {0, 6, 12, 18}  # every tensor's base
    arena.sync(np.array([2, 1, 0]))
    assert arena.maps == 2 and arena.driver_pages == {0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20}
    arena.k[0, 0:24] = 1.0  # range 0's pages and range 1's first: backed, so written
    assert not arena.k[0, 0:24].isnan().any() and arena.k[0, 24:].isnan().sum() == 0  # never mapped: zeros
    arena.sync(np.array([1, 1, 0]))  # range 0 gives its last page back: poisoned
    assert arena.unmaps == 1 and arena.k[0, 8:16].isnan().all() and (arena.k[0, 0:8] == 1).all()
    arena.prefetch(np.array([2, 0, 2]))  # ahead: range 1's page goes first, then ranges 0 and 2 grow
    assert arena.mapped.tolist() == [2, 0, 2] and (arena.ahead_maps, arena.ahead_unmaps) == (3, 1)
    assert arena.maps == 5 and arena.unmaps == 2 and arena.mapped.sum() <= arena.num_pages
    arena.sync(np.array([0, 0, 0]))  # range 0 keeps its first page, pinned
    assert arena.mapped.tolist() == [1, 0, 0] and arena.unmaps == 5
    arena.close()
    assert arena.driver_pages == frozenset() and arena.mapped.sum() == 0


def test_per_request_layout_keeps_a_tokens_layers_together():
    spec = get_model("tiny-opt")  # 2 layers, 4 KV heads of 16
    arena = VirtualKVArena(
        spec, ranges=2, range_slots=8, page_tokens=Fraction(1, 2), num_pages=32, layout="per-request",
        dtype=torch.float32, device=CPU,
    )  # fmt: skip
    assert arena.tensors == 1 and arena.range_pages == 16 and arena.k.shape == (2, 16, 4, 16)
    assert arena.pinned == 2 and arena.mapped.tolist() == [2, 0]  # token 0: two pages of half a token
    arena.sync(np.array([2, 0]))
    assert arena.maps == 0
    arena.k[1, 0] = 2.0
    arena.v[0, 0] = 3.0
    assert arena.k[0, 0].isnan().all()  # mapped afresh, never written
    assert (arena.k[:, 1] == 0).all()  # token 1: never mapped (the stand-in's zeros)
    flat = arena._pages.flat
    row = 2 * 2 * 4 * 16  # a token's K and V of both layers, contiguous
    assert (flat[:row].view(2, 2, 4, 16)[1, 0] == 2).all() and (flat[:row].view(2, 2, 4, 16)[0, 1] == 3).all()


def test_bad_layout_and_page_size_name_the_flag():
    spec = get_model("tiny-llama")
    with pytest.raises(KvbenchError, match="--vmm-layout"):
        VirtualKVArena(
            spec, ranges=1, range_slots=8, page_tokens=8, num_pages=1, layout="per-token",
            dtype=torch.float32, device=CPU,
        )  # fmt: skip


def test_vmm_map_is_a_checked_real_run_option():
    from kvbench.config import RunConfig, check_real_options

    with pytest.raises(KvbenchError, match="--vmm-map"):
        check_real_options(RunConfig(engine="vmm", vmm_map="later"))
    with pytest.raises(KvbenchError, match="--tensor-parallel 1"):
        check_real_options(RunConfig(engine="vmm", tensor_parallel=2))
    check_real_options(RunConfig(engine="vmm", vmm_map="ahead"))
