"""The decode buffers' block tables, updated in place between segments, equal tables built anew.

`kvbench.real.block_tables.DeviceBlockTables` writes only what changed since the last segment
(appended blocks, a shrunk tail, rows that moved when the batch shifted). Every check here
compares the device table with `block_table_array` of the allocator's `addressing`, the path
it replaced, after whatever the real paged allocator did in between: appends grown ahead and
trimmed, frees, recompute and swap preemption, copy-on-write of forked blocks, rows reused by
other sequences and padding rows left behind by a shrinking batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engines import ENGINES, EngineOptions
from engines.allocator import BlockTable
from engines.hybrid import HybridAllocator
from engines.paged import PagedAllocator
from engines.scheduler import SchedulerConfig
from kvbench.engine import Engine
from kvbench.kvspec.layers import FullAttention, SlidingWindow, kv_groups
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.real.block_tables import DeviceBlockTables, block_table_array
from kvbench.real.model_runner import ModelRunner
from kvbench.requests import Request, Trace
from kvbench.sequence import sequence_for
from tests.support import VIRTUAL_CLOCK

CPU = torch.device("cpu")
DEVICES = [  # on CUDA: the pinned mirror, its asynchronous upload and the event guarding it
    pytest.param(CPU, id="cpu"),
    pytest.param(
        torch.device("cuda"),
        id="cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")],
    ),
]
BLOCK = 4
WIDTH = 24  # blocks: 96 positions


def scratch(alloc, seqs, rows: int) -> torch.Tensor:
    """The table as the runner built it before: from every sequence's `addressing`."""
    return torch.from_numpy(block_table_array([alloc.addressing(seq) for seq in seqs], rows, WIDTH))


class Driver:
    """The real paged allocator driven as the engine loop drives it, with random events between
    segments; the device table is checked after every segment's update."""

    def __init__(
        self, seed: int, device: torch.device = CPU, num_blocks: int = 160, host_blocks: int = 64
    ) -> None:
        self.rng = np.random.default_rng(seed)
        self.alloc = PagedAllocator(num_blocks * BLOCK, BLOCK, watermark=0.0, host_blocks=host_blocks)
        self.tables = DeviceBlockTables(16, WIDTH, device)
        self.batch: list = []  # resident, in the scheduler's order
        self.parked: list = []  # preempted (recompute) or swapped out, waiting to come back
        self.next_id = 0
        self.seen = dict.fromkeys(("shifted", "trimmed", "copied", "recomputed", "swapped", "shrunk"), 0)
        self.checks = 0

    def admit(self) -> None:
        prompt = int(self.rng.integers(1, 30))
        seq = sequence_for(Request(self.next_id, 0.0, prompt, int(self.rng.integers(4, 50))))
        self.next_id += 1
        self.alloc.allocate(seq)
        seq.advance(1, 0.0, 0.0)
        self.batch.append(seq)

    def segment(self) -> None:
        alloc, batch = self.alloc, self.batch
        for seq in batch:
            self.seen["copied"] += len(alloc.append(seq))
        k = alloc.growth_horizon(batch, int(self.rng.integers(1, 9)))
        grown = k > 1 and alloc.grow(batch, k) is not None
        rows = len(batch) + int(self.rng.integers(0, 3))  # padding rows, as a graph bucket adds
        self.tables.update(alloc.block_lists(batch), rows, [seq.sample_key for seq in batch])
        assert torch.equal(self.tables.table[:rows].cpu(), scratch(alloc, batch, rows))
        self.checks += 1
        ran = int(self.rng.integers(1, k + 1))  # a segment cut early gives its late blocks back
        self.seen["trimmed"] += grown and ran < k
        alloc.trim(ran)
        for seq in list(batch):
            if seq.advance(ran, 0.0):
                alloc.free(seq)
                self.seen["shifted"] += seq is not batch[-1]
                batch.remove(seq)

    def events(self) -> None:
        """What happens between segments: preemption (either kind), a fork, admissions, returns."""
        alloc, batch, rng = self.alloc, self.batch, self.rng
        if len(batch) > 2 and rng.random() < 0.3:
            victim = batch[int(rng.integers(0, len(batch)))]
            batch.remove(victim)
            if alloc.can_swap_out(victim) and rng.random() < 0.5:
                alloc.swap_out(victim)
                victim.swap_out()
            else:
                alloc.free(victim)
                victim.preempt()
            self.parked.append(victim)
        if self.parked and rng.random() < 0.4:
            seq = self.parked.pop(0)
            if seq.num_computed == 0:  # recomputed: fresh blocks for every token so far
                alloc.allocate(seq)
                seq.num_computed = seq.num_tokens - 1
                self.seen["recomputed"] += 1
            else:
                alloc.swap_in(seq)
                self.seen["swapped"] += 1
            batch.insert(int(rng.integers(0, len(batch) + 1)), seq)
        if batch and len(batch) < 12 and rng.random() < 0.2:  # a forked sample shares every block
            parent = batch[int(rng.integers(0, len(batch)))]
            child = sequence_for(
                Request(self.next_id, 0.0, parent.request.prompt_len, parent.request.output_len)
            )
            self.next_id += 1
            child.copy_progress(parent)
            alloc.fork(parent, child)
            batch.append(child)
        while len(batch) < 6 or (len(batch) < 12 and rng.random() < 0.3):
            if alloc.num_free_blocks < 12:
                break
            self.admit()
        if len(batch) > 3 and rng.random() < 0.1:  # the batch shrinks: its old rows become padding
            self.seen["shrunk"] += 1
            for seq in batch[len(batch) // 2 :]:
                alloc.free(seq)
            del batch[len(batch) // 2 :]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
def test_the_updated_table_equals_one_built_from_scratch_after_every_allocator_event(seed, device):
    driver = Driver(seed, device)
    for _ in range(6):
        driver.admit()
    for _ in range(150):
        if driver.batch:
            driver.segment()
        driver.events()
        driver.alloc.check_integrity()
    assert driver.checks > 100
    assert all(count > 0 for count in driver.seen.values()), driver.seen  # every case was exercised


def test_unchanged_rows_are_not_written_again():
    """Only the rows between the first and the last that changed are uploaded: a value put into
    an unchanged row's device entry outside that range survives the next update."""
    alloc = PagedAllocator(64 * BLOCK, BLOCK, watermark=0.0)
    tables = DeviceBlockTables(8, WIDTH, CPU)
    seqs = [sequence_for(Request(i, 0.0, 10, 20)) for i in range(4)]
    for seq in seqs:
        alloc.allocate(seq)
        seq.advance(1, 0.0, 0.0)
        alloc.append(seq)
    keys = [seq.sample_key for seq in seqs]
    tables.update(alloc.block_lists(seqs), 4, keys)
    tables.table[0, WIDTH - 1] = -7  # where row 0 holds no block
    seqs[3].advance(2, 0.0)  # position 12: a fourth block, the last row's only change
    alloc.append(seqs[3])
    tables.update(alloc.block_lists(seqs), 4, keys)
    assert tables.table[0, WIDTH - 1] == -7
    expected = scratch(alloc, seqs, 4)
    assert torch.equal(tables.table[1:4], expected[1:4])
    assert tables.table[3, 3] == alloc.addressing(seqs[3]).blocks[3]  # the appended block arrived
    # a row that moved (the batch lost its first sequence) carries its blocks with it
    alloc.free(seqs[0])
    tables.update(alloc.block_lists(seqs[1:]), 4, keys[1:])
    assert torch.equal(tables.table[:4], scratch(alloc, seqs[1:], 4))


def hybrid_tables(alloc, seqs, rows: int) -> list[torch.Tensor]:
    """Each of a grouped allocator's tables as built from scratch, from its memory rows."""
    per_seq = [alloc.memory_tables(seq) for seq in seqs]  # [seq][table]
    return [
        torch.from_numpy(block_table_array([BlockTable(tuple(r[t]), BLOCK) for r in per_seq], rows, WIDTH))
        for t in range(len(alloc.memory_layout()))
    ]


@pytest.mark.parametrize("seed", range(3))
def test_hybrid_tables_updated_by_version_equal_tables_built_from_scratch(seed):
    """`HybridAllocator.memory_versions` lets the update skip every row whose version its owner's
    row already holds: through decode steps that append blocks and free window blocks, admissions,
    frees (the batch shifts), recompute, and forks that copy on write, every table still equals
    one built from scratch; and rows were skipped (a row changed behind the allocator's back,
    its version kept, is not read again, where an update without versions reads it)."""
    rng = np.random.default_rng(seed)
    # 4 window layers and 2 full ones of 8 B a token: pages of 16 B, so 3 tables (vLLM's layout)
    groups = kv_groups((SlidingWindow(1, 2, 6),) * 4 + (FullAttention(1, 2),) * 2)
    alloc = HybridAllocator(400, BLOCK, groups, watermark=0.0)
    count = len(alloc.memory_layout())
    tables = [DeviceBlockTables(16, WIDTH, CPU) for _ in range(count)]
    batch, next_id, seen = [], 0, dict.fromkeys(("freed", "forked", "recomputed", "shifted"), 0)

    def admit(seq=None):
        nonlocal next_id
        if seq is None:
            seq = sequence_for(Request(next_id, 0.0, int(rng.integers(1, 20)), int(rng.integers(4, 60))))
            next_id += 1
        if alloc.can_allocate(seq):
            alloc.allocate(seq)
            seq.advance(1, 0.0, 0.0)
            batch.insert(int(rng.integers(0, len(batch) + 1)), seq)

    for _ in range(5):
        admit()
    for _ in range(200):
        if batch and alloc.append_all(batch) is not None:
            rows = len(batch) + int(rng.integers(0, 3))
            per_seq = [alloc.memory_tables(seq) for seq in batch]
            versions = alloc.memory_versions(batch)
            for t, device in enumerate(tables):
                device.update([r[t] for r in per_seq], rows, [seq.sample_key for seq in batch], versions)
            for device, expected in zip(tables, hybrid_tables(alloc, batch, rows), strict=True):
                assert torch.equal(device.table[:rows], expected)
            seen["freed"] = max(seen["freed"], sum(r.count(-1) for p in per_seq for r in p))
            for seq in list(batch):
                if seq.advance(1, 0.0):
                    alloc.free(seq)
                    seen["shifted"] += seq is not batch[-1]
                    batch.remove(seq)
        elif batch:  # no room: the newest is preempted and recomputed later
            victim = batch.pop()
            alloc.free(victim)
            victim.preempt()
            seen["recomputed"] += 1
            admit(victim)
        if batch and len(batch) < 8 and rng.random() < 0.1:  # a forked sample shares every block
            parent = batch[int(rng.integers(0, len(batch)))]
            child = sequence_for(Request(next_id, 0.0, parent.request.prompt_len, parent.request.output_len))
            next_id += 1
            child.copy_progress(parent)
            alloc.fork(parent, child)
            batch.append(child)
            seen["forked"] += 1
        if len(batch) < 4 or (len(batch) < 12 and rng.random() < 0.2):  # 16 rows: room for padding
            admit()
        alloc.check_integrity()
    assert all(n > 0 for n in seen.values()), seen
    # a change the versions do not announce is skipped; without versions it is read
    keys = [seq.sample_key for seq in batch]
    per_seq = [alloc.memory_tables(seq) for seq in batch]
    full = count - 1  # the full group's table
    per_seq[0][full][0] = 399  # behind the allocator's back, its version kept
    tables[full].update([r[full] for r in per_seq], len(batch), keys, alloc.memory_versions(batch))
    assert tables[full].table[0, 0] != 399
    tables[full].update([r[full] for r in per_seq], len(batch), keys)
    assert tables[full].table[0, 0] == 399


class CheckingRunner(ModelRunner):
    """The real runner; after every decode load, its device table is checked against the table
    built from scratch, and the batches whose rows moved are counted."""

    loads = shifted = 0
    previous: tuple = ()

    def _load(self, seqs):
        rows = super()._load(seqs)
        expected = block_table_array(
            [self.allocator.addressing(s) for s in seqs], rows, self.decoder.tables.shape[1]
        )
        assert torch.equal(self.decoder.tables[:rows], torch.from_numpy(expected))
        self.loads += 1
        self.shifted += any(a is not b for a, b in zip(seqs, self.previous, strict=False)) and bool(
            set(seqs) & set(self.previous)
        )
        self.previous = tuple(seqs)
        return rows


def run_real(engine: str, num_slots: int, trace: Trace, **options):
    spec = get_model("tiny-llama")
    arena = KVArena(spec, num_slots, torch.float32, CPU)
    arena.fill(float("nan"))  # a slot read through a wrong table entry poisons the tokens
    preemption = "swap" if options.get("host_blocks") else "recompute"
    sched = ENGINES[engine].build(
        EngineOptions(
            num_slots=num_slots,
            max_len=64,
            block_size=BLOCK,
            scheduler=SchedulerConfig(preemption=preemption),
            **options,
        )
    )
    runner = CheckingRunner(
        random_model(spec, torch.float32, CPU, seed=3), arena, sched.allocator, max_batch=4, max_len=64,
        seed=5, attention="torch", clock=VIRTUAL_CLOCK,
    )  # fmt: skip
    return Engine(sched, runner).run(trace), runner


def trace(count: int = 12, n: int = 1) -> Trace:
    rng = np.random.default_rng(1)
    prompts, outputs = rng.integers(3, 24, count), rng.integers(2, 20, count)
    return Trace(
        "upload",
        tuple(
            Request(i, 0.01 * i, int(p), int(o), n=n)
            for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
        ),
    )


@pytest.mark.parametrize(
    ("engine", "host_blocks", "n"),
    [("paged", 0, 1), ("paged", 32, 1), ("paged", 0, 2), ("paged-prefix", 0, 1)],
)
def test_a_real_run_uploads_exact_tables_and_decodes_the_roomy_runs_tokens(engine, host_blocks, n):
    """A tight arena (preemption, swaps with host blocks), parallel samples (forks, copy-on-write):
    every decode load's device table is the scratch one, and the tokens are a roomy run's."""
    tight, runner = run_real(engine, 56, trace(n=n), host_blocks=host_blocks)
    roomy, _ = run_real(engine, 1024, trace(n=n))
    assert runner.loads > 10 and runner.shifted > 0  # rows moved between segments
    assert sum(seq.num_preemptions for seq in tight.sequences) > 0
    if host_blocks:
        assert any(row.num_swapped for row in tight.steps)
    assert [s.output_ids for s in tight.sequences] == [s.output_ids for s in roomy.sequences]
