"""The vmm engine decoding for real on CPU: the virtual ranges emulated by one plain tensor as
long as all of them (`engines.allocator.address_slots`), the contiguous attention path reading
each request at its range's start."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engines import ENGINES
from engines.allocator import address_slots
from kvbench.engine import Engine
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import get_model
from kvbench.real.model_runner import _slots
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
            slots = _slots(where, np.arange(seq.num_computed, last + 1))
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
