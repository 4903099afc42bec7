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
    """Asserts after each call's mapping that the arena backs exactly what the allocator holds
    (sync), or at least that and never more pages than the budget (ahead)."""

    def _map_pages(self, seqs):
        super()._map_pages(seqs)
        need = self.virtual.backed(self.allocator.mapped_counts())  # range 0's first page: always
        if self.map_ahead:
            assert (self.virtual.mapped >= need).all()
        else:
            assert (self.virtual.mapped == need).all()
        assert self.virtual.mapped.sum() <= self.virtual.num_pages + self.virtual.pinned  # pinned: beyond
        arena = self.virtual
        mapped = enumerate(arena.mapped.tolist())
        assert arena.driver_pages == {p for r, n in mapped for j in range(n) for p in arena.group(r, j)}

    def _map_ahead(self, seqs, steps):
        """Ahead never maps a page past a request's final length: no step would write it."""
        super()._map_ahead(seqs, steps)
        floor = self.virtual.backed(self.allocator.mapped_counts())
        for seq in seqs:
            r = self._range(seq)
            assert self.virtual.mapped[r] <= max(self.allocator.pages_for(seq.request.kv_len), floor[r])


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


def test_a_prefill_batch_keeps_the_pages_decoding_sequences_mapped_ahead():
    """`sync` for a batch of new prompts keeps every held range's early pages, not only the
    batch's: a decoding sequence's next page, mapped while its segment ran, is still there for
    its next segment; once it finishes, its range is idle and the early page goes."""
    from tests.test_vmm import admit, seq_of, small

    spec = get_model("tiny-llama")
    alloc = small(max_len=12)  # 5 pages of 4 slots, 3 ranges of 12
    arena = VirtualKVArena.for_allocator(spec, alloc, "per-layer", torch.float32, CPU)
    a = seq_of(1, 4, 8)
    admit(alloc, a)  # range 0, one page
    arena.sync(alloc.mapped_counts())
    arena.prefetch({0: 2})  # a's second page, early
    b = seq_of(2, 4, 1)
    admit(alloc, b)  # a prefill batch of b alone: range 1
    arena.sync(alloc.mapped_counts(), keep=[1])
    assert arena.mapped.tolist() == [2, 1, 0]  # a's early page kept
    alloc.free(a)
    arena.sync(alloc.mapped_counts(), keep=[1])
    assert arena.mapped.tolist() == [1, 1, 0]  # a finished: its range is idle, the early page unmapped
    arena.close()


def test_pages_mapped_ahead_that_new_requests_take_are_counted_lost():
    """The loss a saturated real run showed: `prefetch` maps a decoding sequence's next page out
    of the free pool, which the allocator still counts as its own unmapped pages; it grants
    them to new requests, and `sync` unmaps the early page to fit them before any step wrote
    it. `ahead_lost` counts it; an early page the allocator later counts under its range is
    used, not lost."""
    from tests.test_vmm import admit, run_one_step, seq_of, small

    spec = get_model("tiny-llama")
    alloc = small(max_len=12)  # 5 pages of 4 slots, 3 ranges of 12
    arena = VirtualKVArena.for_allocator(spec, alloc, "per-layer", torch.float32, CPU)
    a = seq_of(1, 4, 8)
    admit(alloc, a)  # range 0, one page
    run_one_step(alloc, a)  # prefill: 5 tokens, the next decode step writes position 4
    arena.sync(alloc.mapped_counts(), keep=[0])
    arena.prefetch({0: 2})  # a's second page, out of the 4 the allocator counts as unmapped
    assert arena.mapped.tolist() == [2, 0, 0] and arena.ahead_maps == 1 and arena.ahead_lost == 0
    b, c = seq_of(2, 8, 1), seq_of(3, 8, 1)
    admit(alloc, b)  # a prefill batch of b and c takes all 4 unmapped pages
    admit(alloc, c)
    assert alloc.mapped_counts().tolist() == [1, 2, 2]
    arena.sync(alloc.mapped_counts(), keep=[1, 2])
    assert arena.mapped.tolist() == [1, 2, 2]  # a's early page gave way to the budget
    assert arena.ahead_lost == arena.ahead_maps == 1 and arena.stats()["vmm_ahead_lost"] == 1
    alloc.free(b)  # range 1 idle with 2 pages: the allocator reclaims from it next
    arena.sync(alloc.mapped_counts(), keep=[0])
    arena.prefetch({0: 2})  # a's second page again: range 1's last page is unmapped early for it
    assert arena.mapped.tolist() == [2, 1, 2] and (arena.ahead_maps, arena.ahead_unmaps) == (2, 1)
    run_one_step(alloc, a)  # position 4: the allocator takes that page for range 0
    assert alloc.mapped_counts().tolist() == [2, 1, 2]
    calls = arena.maps + arena.unmaps
    arena.sync(alloc.mapped_counts(), keep=[0])
    assert arena.maps + arena.unmaps == calls and arena.ahead_lost == 1  # used, not lost
    arena.sync(np.array([1, 1, 2]))  # a page the allocator counted and then gave back: still not lost
    assert arena.unmaps == 3 and arena.ahead_lost == 1
    arena.close()


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


def test_sync_maps_and_unmaps_at_each_ranges_end_and_ahead_stays_in_the_budget():
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
    arena.prefetch({0: 2, 2: 2})  # budget 4: range 0 gets one, range 2 one more
    assert arena.mapped.tolist() == [2, 1, 1] and arena.ahead_maps == 2
    arena.sync(np.array([1, 1, 0]), keep=[0])  # range 0's early page stays, range 2's goes
    assert arena.mapped.tolist() == [2, 1, 0]
    arena.sync(np.array([1, 2, 1]), keep=[0])  # over the budget with it kept: it goes too
    assert arena.mapped.tolist() == [1, 2, 1] and arena.mapped.sum() <= arena.num_pages
    arena.sync(np.array([0, 0, 0]))  # range 0 keeps its first page, pinned
    assert arena.mapped.tolist() == [1, 0, 0] and arena.unmaps == 6
    arena.close()
    assert arena.driver_pages == frozenset() and arena.mapped.sum() == 0


def test_ahead_reclaims_the_idle_page_the_allocator_takes_next_so_its_take_costs_no_call():
    """With every physical page mapped (deferred reclamation), mapping ahead first unmaps the
    idle page the allocator will reclaim next; when it does, `sync` has nothing left to do. A
    prediction the allocator does not follow is mapped back by `sync`."""
    from tests.test_vmm import admit, run_one_step, seq_of, small

    spec = get_model("tiny-llama")
    alloc = small(max_len=12)  # 5 pages of 4 slots, 3 ranges of 12
    arena = VirtualKVArena.for_allocator(spec, alloc, "per-layer", torch.float32, CPU)
    a, b, c = seq_of(1, 4, 8), seq_of(2, 8, 1), seq_of(3, 8, 4)
    for seq in (a, b, c):
        admit(alloc, seq)  # ranges 0, 1, 2 hold 1, 2 and 2 pages: none is unmapped
    alloc.free(b)  # range 1 idle with 2 pages
    arena.sync(alloc.mapped_counts())
    assert arena.mapped.tolist() == [1, 2, 2] and alloc.reclaim_order(3) == [1, 1]
    arena.prefetch({2: 3})  # c's third page: none is unmapped, so range 1's last goes first
    assert arena.mapped.tolist() == [1, 1, 3] and (arena.ahead_maps, arena.ahead_unmaps) == (1, 1)
    run_one_step(alloc, c)  # prefill
    run_one_step(alloc, c)  # position 8: the allocator reclaims range 1's last page
    assert alloc.mapped_counts().tolist() == [1, 1, 3]
    calls = arena.maps + arena.unmaps
    arena.sync(alloc.mapped_counts(), keep=[2])
    assert arena.maps + arena.unmaps == calls  # predicted: no call inside the step's time
    arena.prefetch({0: 2})  # a's second page: range 1's last idle page goes early again
    assert arena.mapped.tolist() == [2, 0, 3] and arena.ahead_unmaps == 2
    alloc.free(a)  # a finishes instead: the reclaim never comes
    arena.sync(alloc.mapped_counts(), keep=[2])
    assert arena.mapped.tolist() == arena.backed(alloc.mapped_counts()).tolist() == [1, 1, 3]
    arena.close()


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
