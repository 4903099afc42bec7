"""A real run prices sliding-window layers as the simulator does: the virtual step clock and
the roofline collector read min(context, W + fed - 1) tokens of a row in a window group.

Tiny Gemma-3-shaped (five window layers of 8 tokens, one full) and Mistral-shaped (every layer a
window of 8) models decode `tests.test_modeling.small_trace` for real on the CPU (PyTorch
attention, the `paged` engine), contexts up to 38 tokens; every engine call is checked against
the simulator's pricing of the same batch and against a hand count of the bytes read. OPT and
Llama, without window layers, keep the old count to the bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engines import ENGINES
from engines.hybrid import group_shapes
from kvbench.cost_model import CostModelRunner, KvReads
from kvbench.engine import Engine
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import ModelSpec, get_model
from kvbench.real.collectors import CollectingRunner, Roofline
from kvbench.real.model_runner import ModelRunner
from tests.support import VIRTUAL_CLOCK
from tests.test_modeling import engine_options, small_trace

CPU = torch.device("cpu")
WEIGHT_BYTES = 1000  # the roofline's weights per step: any number, the same in the hand count
GEMMA3_TINY = ModelSpec(
    "tiny-gemma3", "gemma3", 6, 64, 4, 2, 128, 512, 64, norm_eps=1e-6, rope_theta=1e6, head_size=32,
    window=8, window_layers=(0, 1, 2, 3, 4), local_rope_theta=10000.0, tied_embeddings=True, query_scale=24.0,
)  # fmt: skip
MISTRAL_TINY = ModelSpec(
    "tiny-mistral", "mistral", 2, 64, 4, 2, 128, 512, 64, norm_eps=1e-6, head_size=32, window=8,
    window_layers=(0, 1),
)  # fmt: skip


class Seen:
    """A collector that keeps what each engine call was, before the engine advances its rows:
    the contexts, the steps run, the durations the runner gave, and the simulator's own pricing
    of the same batch, with the model's window groups and with every layer read as full."""

    def __init__(self, reads: KvReads) -> None:
        self.reads = reads
        self.calls: list[dict] = []

    def begin(self) -> None:
        """Nothing to note before a call."""

    def row(self, batch, contexts, result):
        k = len(result.durations)
        self.calls.append(
            dict(
                prefill=batch.is_prefill, contexts=list(contexts), steps=k, durations=result.durations.copy(),
                simulated=CostModelRunner(VIRTUAL_CLOCK, self.reads).run(batch, k, 0.0, math.inf).durations,
                all_full=CostModelRunner(VIRTUAL_CLOCK).run(batch, k, 0.0, math.inf).durations,
            )
        )  # fmt: skip
        return {}

    def finish(self, rows, spans):
        return {}


def decode(spec: ModelSpec) -> tuple[Seen, list[dict]]:
    """`small_trace` decoded for real under the virtual clock, a roofline (1 byte/s, so its
    seconds are bytes) told the model's window groups, beside a `Seen`."""
    reads = KvReads.of(group_shapes(spec.groups))
    model = random_model(spec, torch.float32, CPU, seed=3)
    arena = KVArena(spec, 300, torch.float32, CPU)
    arena.fill(float("nan"))
    sched = ENGINES["paged"].build(engine_options(300))
    runner = ModelRunner(
        model, arena, sched.allocator, max_batch=10, max_len=64, seed=5, attention="torch",
        clock=VIRTUAL_CLOCK,
    )  # fmt: skip
    seen = Seen(reads)
    roofline = Roofline(WEIGHT_BYTES, spec.kv_bytes_per_token, 1.0, reads)
    collecting = CollectingRunner(runner, [roofline, seen])
    trace = small_trace()
    run = Engine(sched, collecting).run(trace)
    assert [len(seq.output_ids) for seq in run.sequences] == [r.output_len for r in trace.requests]
    return seen, collecting.rows


def bytes_by_hand(spec: ModelSpec, contexts: list[int], k: int) -> int:
    """A decode segment of k steps over rows of `contexts` tokens (the fed one included): step j
    of row c reads c - 1 + j earlier positions in a full layer and min(c + j, W) - 1 in a window
    layer (its query's W keys, less its own), and writes one token in every layer."""
    slot = spec.kv_bytes_per_token
    full = spec.full_bytes_per_token
    window = slot - full
    read = sum(
        full * (c - 1 + j) + window * (min(c + j, spec.window) - 1) for c in contexts for j in range(k)
    )  # fmt: skip
    return k * WEIGHT_BYTES + read + k * len(contexts) * slot


def bytes_all_full(spec: ModelSpec, contexts: list[int], k: int) -> int:
    """The same segment with every layer reading its whole context (the count before groups)."""
    read = sum(c - 1 + j for c in contexts for j in range(k))
    return k * WEIGHT_BYTES + (read + k * len(contexts)) * spec.kv_bytes_per_token


@pytest.fixture(scope="module", params=[GEMMA3_TINY, MISTRAL_TINY], ids=lambda spec: spec.name)
def window_run(request):
    spec = request.param
    return spec, *decode(spec)


def test_window_model_roofline_counts_only_what_window_layers_read(window_run):
    spec, seen, rows = window_run
    decodes = [(call, row) for call, row in zip(seen.calls, rows, strict=True) if not call["prefill"]]
    past = [call for call, _ in decodes if max(call["contexts"]) + call["steps"] - 1 > spec.window]
    assert len(past) >= 5, "the trace must decode past the window"
    for call, row in decodes:
        expected = bytes_by_hand(spec, call["contexts"], call["steps"])
        assert row["roofline_s"] == pytest.approx(expected, rel=1e-12, abs=0.0)
    # past the window the count is below the all-full one: by what the window layers skip
    call, row = next((c, r) for c, r in decodes if min(c["contexts"]) > spec.window)
    assert row["roofline_s"] < bytes_all_full(spec, call["contexts"], call["steps"])
    prefills = [row for call, row in zip(seen.calls, rows, strict=True) if call["prefill"]]
    assert prefills and all(math.isnan(row["roofline_s"]) for row in prefills)


def test_gemma3_roofline_row_by_hand():
    """One row worked through: Gemma-3-shaped, slot = 6 layers x 2 x 2 heads x 32 x 2 B = 1,536 B
    (1,280 in the five window layers, 256 in the full one); rows of 20 and 5 tokens, 3 steps.
    Full layer reads 19+20+21 + 4+5+6 = 75; window layers min(c + j, 8) - 1: 7+7+7 + 4+5+6 = 36."""
    from engines.scheduler import Batch
    from kvbench.requests import Request
    from kvbench.runner import StepResult
    from kvbench.sequence import Sequence

    assert (GEMMA3_TINY.kv_bytes_per_token, GEMMA3_TINY.full_bytes_per_token) == (1536, 256)
    seqs = []
    for prompt in (19, 4):
        seq = Sequence(Request(prompt, 0.0, prompt, 50))
        seq.advance(1, end_s=0.0)  # prefilled: prompt + 1 tokens known, the last one fed next
        seqs.append(seq)
    batch = Batch(tuple(seqs), is_prefill=False, num_tokens=2, num_context=25, steps_to_finish=49)
    roofline = Roofline(WEIGHT_BYTES, 1536, 1.0, KvReads.of(group_shapes(GEMMA3_TINY.groups)))
    row = roofline.row(batch, [20, 5], StepResult(np.ones(3)))
    assert row["roofline_s"] == pytest.approx(3 * 1000 + 256 * 75 + 1280 * 36 + 3 * 2 * 1536, rel=1e-12)


def test_window_model_clock_is_the_simulators_pricing(window_run):
    _, seen, _ = window_run
    for call in seen.calls:
        np.testing.assert_array_equal(call["durations"], call["simulated"])
    # and not the all-full pricing: rows past the window are cheaper
    cheaper = [call for call in seen.calls if (call["durations"] < call["all_full"]).any()]
    assert len(cheaper) >= 5
    assert all((call["durations"] <= call["all_full"]).all() for call in seen.calls)


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
def test_model_without_windows_counts_and_clocks_as_before(name):
    spec = get_model(name)
    assert KvReads.of(group_shapes(spec.groups)) == KvReads()
    seen, rows = decode(spec)
    decodes = [(call, row) for call, row in zip(seen.calls, rows, strict=True) if not call["prefill"]]
    assert any(call["steps"] > 1 for call, _ in decodes)
    for call, row in decodes:  # to the bit: the formula without windows
        assert row["roofline_s"] == bytes_all_full(spec, call["contexts"], call["steps"]) / 1.0
    for call in seen.calls:
        np.testing.assert_array_equal(call["durations"], call["all_full"])


def test_build_collectors_hands_the_roofline_the_models_window_groups():
    """What `kvbench run --collectors roofline` builds (on CUDA; only the device's kind is read)."""
    from kvbench.real.collectors import build_collectors

    reads = KvReads.of(group_shapes(GEMMA3_TINY.groups))
    assert reads.windows == ((8, 1280 / 1536),)
    (roofline,) = build_collectors(
        ("roofline",), device=torch.device("cuda"), weight_bytes=WEIGHT_BYTES, kv_bytes_per_token=1536,
        read_bandwidth=1.0, reads=reads,
    )  # fmt: skip
    assert isinstance(roofline, Roofline) and roofline.reads == reads
