"""The vmm engine decoding for real on CPU: the virtual ranges emulated by one plain tensor as
long as all of them (`engines.allocator.address_slots`), the contiguous attention path reading
each request at its range's start."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from engines import ENGINES
from engines.allocator import address_slots
from kvbench.engine import Engine
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.real.model_runner import _step_addressing
from tests.support import VIRTUAL_CLOCK
from tests.test_modeling import CPU, engine_options, small_trace
from tests.test_modeling import RecordingRunner as _Recording


class PageCheckingRunner(_Recording):
    """Asserts, before each call, that every slot the call may write lies in a page mapped under
    the writing sequence's own range (on a GPU an unmapped address faults)."""

    def run(self, batch, max_steps, start_s, until_s):
        alloc = self.allocator
        for seq in batch.seqs:
            where = alloc.addressing(seq)
            last = seq.num_tokens - 1 + (0 if batch.is_prefill else max_steps - 1)
            slots = _step_addressing([where], [np.arange(seq.num_computed, last + 1)], CPU)[0]
            pages = (slots - where.start) // alloc.page_tokens
            assert (slots // alloc.range_slots == where.start // alloc.range_slots).all()
            assert pages.max() < len(alloc.page_table(seq)), f"seq {seq.seq_id} writes an unmapped page"
        return super().run(batch, max_steps, start_s, until_s)


def decode(engine: str, model_name: str, num_slots: int, *, coalesce: bool, page_tokens: int = 8):
    spec = get_model(model_name)
    model = random_model(spec, torch.float32, CPU, seed=3)
    sched = ENGINES[engine].build(engine_options(num_slots, block_size=page_tokens))
    arena = KVArena(spec, address_slots(sched.allocator), torch.float32, CPU)
    arena.fill(float("nan"))  # a read of a slot never written poisons the logits
    runner_type = PageCheckingRunner if engine == "vmm" else _Recording
    runner = runner_type(
        model, arena, sched.allocator, max_batch=10, max_len=64, seed=5, attention="torch",
        clock=VIRTUAL_CLOCK,
    )  # fmt: skip
    run = Engine(sched, runner, coalesce=coalesce).run(small_trace(16, seed=1))
    return run, sched.allocator


@pytest.mark.parametrize("model_name", ["tiny-opt", "tiny-llama"])
def test_vmm_gives_the_tokens_orca_oracle_gives(model_name):
    oracle, _ = decode("orca-oracle", model_name, 1024, coalesce=True)
    want = [seq.output_ids for seq in oracle.sequences]
    for coalesce in (True, False):
        run, alloc = decode("vmm", model_name, 1024, coalesce=coalesce)
        assert [seq.output_ids for seq in run.sequences] == want
        assert alloc.maps > 0 and alloc.reused > 0  # pages were mapped, and finished ranges reused


def test_vmm_under_memory_pressure_reclaims_preempts_and_keeps_the_tokens():
    oracle, _ = decode("orca-oracle", "tiny-llama", 1024, coalesce=True)
    run, alloc = decode("vmm", "tiny-llama", 48, coalesce=True)  # 6 pages of 8 slots
    assert sum(seq.num_preemptions for seq in run.sequences) > 0  # the case is exercised
    assert alloc.unmaps > 0  # idle pages were reclaimed under other ranges
    assert [seq.output_ids for seq in run.sequences] == [seq.output_ids for seq in oracle.sequences]


@pytest.mark.parametrize("layout", ["per-layer", "per-request"])
def test_the_warm_up_of_a_virtual_arena_reads_only_range_zero(layout):
    """The warm-up backs only range 0 of a virtual arena (`VirtualKVArena.scratch`), so its
    decode launches stay within that range's slots: with 64-slot ranges every split launch
    (128 positions and more) is skipped and the unsplit ones run over the range. On a GPU the
    slots past range 0 are unbacked and a launch reading them faults (an illegal address in the
    CUDA graph tests of this module); here a scratch past the range is refused instead."""
    from kvbench.modeling.virtual_arena import VirtualKVArena
    from kvbench.real.model_runner import ModelRunner

    spec = get_model("tiny-llama")
    sched = ENGINES["vmm"].build(engine_options(1024, block_size=8))
    arena = VirtualKVArena.for_allocator(spec, sched.allocator, layout, torch.float32, CPU)
    assert arena.range_slots == 64 and arena.num_slots > 128  # a split launch fits the span, not the range
    model = random_model(spec, torch.float32, CPU, seed=3)
    runner = ModelRunner(model, arena, sched.allocator, max_batch=2, max_len=64, attention="torch")
    ran = runner.warm_up()
    assert len(ran) == 2 and all(splits == 1 for _, splits in ran)  # a row of 1, then the large grid
    # pages of 8 slots: the prefill's 16 slots map 1 past the pinned one, each launch's 64 slots 7
    assert arena.scratch_maps == 1 + 7 + 7
    driver = arena._pages  # the CPU stand-in counts a GPU's driver calls: a page per tensor
    assert driver.maps == (arena.pinned + 15) * arena.tensors and driver.unmaps == 15 * arena.tensors
    assert int(arena.mapped.sum()) == 1  # the pinned page under slot 0 alone stays mapped
    with pytest.raises(ValueError, match="range 0 holds 64"), arena.scratch(65):
        pass


# ---------------------------------------------------------------------------- the virtual arena
# A `kvbench run --engine vmm` decodes over `VirtualKVArena`: on CPU a stand-in tensor, on CUDA
# memory reserved and mapped through the driver. tests/test_vmm_arena.py checks the arena's
# bookkeeping on CPU; here, whole runs.

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def real_run(engine: str, device: str, **options):
    from kvbench.config import RunConfig
    from kvbench.real.run import run_real
    from workloads.spec import WorkloadSpec

    # every request arrives within the first step: segments end at finishes, not at wall-clock arrivals
    workload = WorkloadSpec("uniform:prompt=4..60,output=2..40", num_requests=12, rate=1e6, seed=2)
    config = RunConfig(
        engine=engine, model="tiny-llama", workload=workload, kv_cache_gib=1 / 1024, max_num_seqs=8,
        device=device, dtype="float32", attention="torch" if device == "cpu" else "triton",
        collectors="none", **options,
    )  # fmt: skip
    return run_real(config)


@pytest.mark.parametrize("vmm_map", ["sync", "ahead"])
def test_kvbench_run_vmm_decodes_over_the_virtual_arena(vmm_map):
    """`run_real` builds the virtual arena (8 ranges of the model's 2,048 slots, 4 KiB pages of
    64 tokens in each of the 4 per-layer tensors), maps pages as the allocator holds them and
    reports the mapping work; the tokens are orca-oracle's."""
    oracle = real_run("orca-oracle", "cpu")
    result = real_run("vmm", "cpu", vmm_page_kib=4, vmm_map=vmm_map)
    summary = result.summary
    assert summary["arena_slots"] == 8 * 2048 and summary["vmm_layout"] == "per-layer"
    assert summary["vmm_maps"] > 0 and summary["vmm_map_s"] >= 0
    assert (summary["vmm_ahead_maps"] > 0) == (vmm_map == "ahead")
    assert 0 <= summary["vmm_ahead_lost"] <= summary["vmm_ahead_maps"]  # 0 without mapping ahead
    assert [s.output_ids for s in result.run.sequences] == [s.output_ids for s in oracle.run.sequences]


def wide_spec():
    """A Llama of 4 layers with 32 KV heads of 128 (128 KiB of float32 K/V per token): a 2 MiB
    driver page holds 16 tokens per request (per-request layout) or 128 per layer (per-layer),
    so requests of the small trace grow across pages on a real GPU."""
    from kvbench.models import ModelSpec

    return ModelSpec("wide-llama-test", "llama", 4, 4096, 32, 32, 1024, 512, 64, dtype_bytes=4)


@functools.cache
def wide_model():
    """Built once for every GPU test of this module (1.3 GB of float32 weights)."""
    return random_model(wide_spec(), torch.float32, torch.device("cuda"), seed=3)


@functools.cache
def oracle_tokens() -> list[list[int]]:
    run, _, _, _ = gpu_decode("orca-oracle")
    return [seq.output_ids for seq in run.sequences]


def gpu_decode(engine: str, *, layout="per-layer", vmm_map="sync", num_pages=10):
    from engines import EngineOptions
    from engines.scheduler import SchedulerConfig
    from kvbench.modeling.virtual_arena import VirtualKVArena

    device = torch.device("cuda")
    spec = wide_spec()
    model = wide_model()
    row = spec.kv_bytes_per_token if layout == "per-request" else spec.num_kv_heads * spec.head_dim * 4
    page_tokens = 2 * 2**20 // row  # a driver page of one virtual tensor
    scheduler = SchedulerConfig(max_num_seqs=8)
    if engine == "vmm":
        options = EngineOptions(
            num_slots=num_pages * page_tokens, max_len=64, page_tokens=page_tokens, num_pages=num_pages,
            scheduler=scheduler,
        )  # fmt: skip
    else:
        options = EngineOptions(num_slots=1024, max_len=64, scheduler=scheduler)
    sched = ENGINES[engine].build(options)
    if engine == "vmm":
        arena = VirtualKVArena.for_allocator(spec, sched.allocator, layout, torch.float32, device)
    else:
        arena = KVArena(spec, 1024, torch.float32, device)
    runner = _Recording(
        model, arena, sched.allocator, max_batch=8, max_len=64, seed=5, attention="triton",
        cuda_graphs=True, clock=VIRTUAL_CLOCK, vmm_map=vmm_map,
    )  # fmt: skip
    run = Engine(sched, runner).run(small_trace(16, seed=1))
    torch.cuda.synchronize()
    return run, sched.allocator, arena, runner


@CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("vmm_map", ["sync", "ahead"])
@pytest.mark.parametrize("layout", ["per-layer", "per-request"])
def test_gpu_virtual_arena_gives_orca_oracles_tokens_and_gives_its_memory_back(layout, vmm_map):
    """Real pages mapped through the driver, the contiguous Triton kernels and CUDA graphs
    captured before any page was mapped: orca-oracle's greedy tokens. No page is mapped twice
    (the driver wrapper refuses it, and its counts agree with the pages mapped at the end),
    physical memory never exceeds the budget, and closing the arena gives it back (the run's
    own allocations stay with torch's caching allocator, so the arena's are counted alone)."""
    want = oracle_tokens()
    run, alloc, arena, runner = gpu_decode("vmm", layout=layout, vmm_map=vmm_map)
    assert runner.cuda_graphs and runner.virtual is arena
    assert [seq.output_ids for seq in run.sequences] == want
    buffer = arena._pages.buffer
    # every driver map and unmap is the arena's: range 0's first page, pinned at construction,
    # the pages the warm-up reads past it (mapped for it and unmapped after), and the run's
    scratch = arena.scratch_maps
    assert arena.maps > 0 and buffer.maps == (arena.maps + arena.pinned + scratch) * arena.tensors
    assert buffer.unmaps == (arena.unmaps + scratch) * arena.tensors
    assert buffer.maps - buffer.unmaps == len(buffer.mapped_pages) == int(arena.mapped.sum()) * arena.tensors
    assert buffer.mapped_pages == arena.driver_pages
    assert (arena.mapped >= alloc.mapped_counts()).all()
    pinned = arena.pinned * arena.tensors * buffer.page  # range 0's first page may be beyond the budget
    assert buffer.held_bytes <= arena.nbytes + pinned  # spare handles included
    if layout == "per-request":  # pages of 16 tokens: requests grew across pages, and pages moved
        assert arena.unmaps > 0 and alloc.unmaps > 0
    held = buffer.held_bytes
    free = torch.cuda.mem_get_info()[0]
    arena.close()
    torch.cuda.synchronize()
    slack = arena.tensors * buffer.page  # one page of each virtual tensor
    assert held > 0 and torch.cuda.mem_get_info()[0] >= free + held - slack  # what it held came back


@CUDA
@pytest.mark.gpu
def test_gpu_arena_memory_follows_its_mapped_pages():
    from kvbench.modeling.virtual_arena import VirtualKVArena

    spec = wide_spec()
    arena = VirtualKVArena(
        spec, ranges=4, range_slots=128, page_tokens=128, num_pages=6, layout="per-layer",
        dtype=torch.float32, device=torch.device("cuda"),
    )  # fmt: skip  # per-layer: 8 tensors of 4 ranges of one 2 MiB page
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info()[0]  # range 0's first page is mapped already (pinned)
    arena.sync(np.array([1, 1, 1, 0]))
    arena.k[:, :384].fill_(1.0)  # every mapped page of K, all layers
    torch.cuda.synchronize()
    used = before - torch.cuda.mem_get_info()[0]
    assert used >= 2 * 8 * 2 * 2**20 and float(arena.k[3, 255].sum()) == 1.0 * 32 * 128
    arena.close()
    assert torch.cuda.mem_get_info()[0] >= before - 8 * 2 * 2**20


@CUDA
@pytest.mark.gpu
def test_gpu_driver_refuses_a_page_mapped_twice_and_a_graph_survives_a_remap():
    from kvbench.vmm.driver import Driver, DriverError, VirtualBuffer

    torch.cuda.init()
    buffer = VirtualBuffer(Driver(torch.cuda.current_device()), 2 * 2 * 2**20)
    n = buffer.page // 4
    try:
        buffer.map_page(0)
        with pytest.raises(DriverError, match="mapped already"):
            buffer.map_page(0)
        with pytest.raises(DriverError, match="not mapped"):
            buffer.unmap_page(1)
        t = buffer.tensor((2 * n,), torch.float32)[:n]  # page 0
        t.fill_(1.0)
        out = torch.zeros((), device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out.copy_(t.sum())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out.copy_(t.sum())
        graph.replay()
        torch.cuda.synchronize()
        assert float(out) == n
        buffer.unmap_page(0)
        buffer.map_page(1)  # takes page 0's handle
        buffer.map_page(0)  # a new handle: other physical memory at the same address
        assert buffer.creates == 2 and buffer.maps == 3 and buffer.unmaps == 1
        t.fill_(2.0)
        graph.replay()
        torch.cuda.synchronize()
        assert float(out) == 2 * n
    finally:
        torch.cuda.synchronize()
        buffer.close()
