"""The cost model's K/V term per layer group: a sliding-window layer reads its window, not the
whole context.

A tiny Gemma-3-shaped model (five window layers of W = 6 tokens per full layer, 8 bytes a token
in each: a slot is 48 bytes, the window group 40 of them) priced at `per_kv_token_s` = 0.06 s
per slot: a token read by the full layer costs 0.01 s, one read by the window group 0.05 s. Every
step time below is worked out by hand from that; a model without window layers must give what
the formula gave before groups were priced, to the bit.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engines import ENGINES, EngineOptions
from engines.hybrid import GroupShape, group_shapes
from engines.scheduler import Batch
from kvbench.budget import get_gpu
from kvbench.calibrate.fit import calibrate, fit_shape, read_rows
from kvbench.cost_model import CostModel, CostModelRunner, KvReads
from kvbench.engine import Engine
from kvbench.errors import KvbenchError
from kvbench.kvspec.layers import FullAttention, SlidingWindow, kv_groups
from kvbench.models import get_model
from kvbench.requests import Request, Trace
from kvbench.sequence import Sequence

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 6
TINY = kv_groups((SlidingWindow(1, 2, WINDOW),) * 5 + (FullAttention(1, 2),))  # 40 + 8 bytes a token
COST = CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.06)  # 0.05 s window, 0.01 s full


def reads_of(groups) -> KvReads:
    return KvReads.of(group_shapes(groups))


def decoding(prompt: int, output: int = 50) -> Sequence:
    """A sequence just prefilled: prompt + 1 tokens known, its prompt computed."""
    seq = Sequence(Request(0, 0.0, prompt, output))
    seq.advance(1, end_s=0.0)
    return seq


def decode_batch(*prompts: int) -> Batch:
    seqs = tuple(decoding(p) for p in prompts)
    context = sum(seq.num_tokens for seq in seqs)
    return Batch(seqs, is_prefill=False, num_tokens=len(seqs), num_context=context, steps_to_finish=49)


def test_the_tiny_model_reads_five_sixths_of_a_slot_in_its_window_group():
    assert reads_of(TINY) == KvReads(((WINDOW, 40 / 48),))
    assert reads_of(get_model("opt-125m").groups) == KvReads()  # one full group: nothing to skip
    assert KvReads.of((GroupShape(1),)) == KvReads()


def test_decode_steps_below_and_above_the_window_by_hand():
    """One row of context 4 (prompt 3): 5, 6 fit the window, 7 and 8 spill 1 and 2 tokens;
    0.01 s per token of context (full layer) + 0.05 s per token of min(context, 6)."""
    runner = CostModelRunner(COST, reads_of(TINY))
    durations = runner.run(decode_batch(3), 5, 0.0, math.inf).durations
    assert durations.tolist() == pytest.approx([1.24, 1.30, 1.36, 1.37, 1.38])  # contexts 4..8
    # priced as if every layer read everything: 1 + 0.06 x context
    full = CostModelRunner(COST).run(decode_batch(3), 5, 0.0, math.inf).durations
    assert full.tolist() == pytest.approx([1.24, 1.30, 1.36, 1.42, 1.48])


def test_each_row_is_windowed_on_its_own_context():
    """Rows of context 4 and 10 read 4 + 6 window tokens, not min(14, 6): the window is per row."""
    runner = CostModelRunner(COST, reads_of(TINY))
    durations = runner.run(decode_batch(3, 9), 3, 0.0, math.inf).durations
    # step j: contexts 4 + j and 10 + j; window reads min(4 + j, 6) + 6
    assert durations.tolist() == pytest.approx([
        1 + 0.01 * 14 + 0.05 * (4 + 6),
        1 + 0.01 * 16 + 0.05 * (5 + 6),
        1 + 0.01 * 18 + 0.05 * (6 + 6),
    ])  # fmt: skip
    assert durations.tolist() == pytest.approx([1.64, 1.71, 1.78])
    # the multi-step formula is the one-step formula at every step
    for j, seconds in enumerate(durations):
        batch = decode_batch(3 + j, 9 + j)
        assert runner.run(batch, 1, 0.0, math.inf).durations[0] == pytest.approx(seconds, rel=1e-12)


def test_a_prefill_reads_every_token_its_own_queries_reach():
    """A prefill of 10 tokens: its last query reads 6, its first reads 1, and together they read
    all 10 (min(c, W + t - 1) = min(10, 15)): no window saving inside one prompt."""
    runner = CostModelRunner(COST, reads_of(TINY))
    seq = Sequence(Request(0, 0.0, 10, 5))
    seq.num_tokens = 10
    prefill = Batch((seq,), is_prefill=True, num_tokens=10, num_context=10)
    assert runner.run(prefill, 1, 0.0, math.inf).durations[0] == pytest.approx(1 + 0.06 * 10)
    # 2 tokens fed over a context of 10 (8 computed before, as a prefix-cache hit leaves it):
    # the window group reads min(10, 6 + 2 - 1) = 7 tokens, the full layer 10
    seq.num_computed = 8
    cached = Batch((seq,), is_prefill=True, num_tokens=2, num_context=10)
    assert runner.run(cached, 1, 0.0, math.inf).durations[0] == pytest.approx(1 + 0.01 * 10 + 0.05 * 7)


def old_formula(cost: CostModel, batch: Batch, k: int) -> np.ndarray:
    """The step times before K/V was priced per group (every layer reads the whole context)."""
    n = len(batch.seqs)
    later = cost.fixed_s + cost.per_token_s * n + cost.above_knee(n) + cost.per_kv_token_s * batch.num_context
    durations = later + cost.per_kv_token_s * n * np.arange(k)
    durations[0] = cost.fixed_s + cost.per_token(batch.is_prefill) * batch.num_tokens
    durations[0] += cost.per_kv_token_s * batch.num_context
    return durations


@pytest.mark.parametrize("model", ["opt-13b", "llama-3.1-8b", "deepseek-v2-lite"])
def test_a_model_without_window_layers_is_priced_as_before_to_the_bit(model):
    spec = get_model(model)
    # a MoE model's routed-expert reads came with their own term (tests/test_cost_model_experts.py)
    cost = replace(CostModel.roofline(spec, get_gpu("h200-141gb")), routed_experts_s=0.0)
    runner = CostModelRunner(cost, reads_of(spec.groups))
    batch = decode_batch(100, 377, 1500, 9)
    assert np.array_equal(runner.run(batch, 64, 0.0, math.inf).durations, old_formula(cost, batch, 64))


def test_mla_is_priced_at_its_latent_bytes():
    """DeepSeek-V2-Lite keeps a 512 + 64 latent per token and layer (27 layers, 2 bytes each):
    that, not K and V per head, is what a token of context costs to read."""
    spec, gpu = get_model("deepseek-v2-lite"), get_gpu("h200-141gb")
    cost = CostModel.roofline(spec, gpu)
    assert cost.per_kv_token_s == pytest.approx(27 * (512 + 64) * 2 / (0.8 * gpu.read_bandwidth), rel=1e-12)


def steps_of(groups, cost: CostModel, trace: Trace, coalesce: bool, reads: bool = True):
    model = get_model("gemma-3-1b")
    options = EngineOptions(num_slots=4000, max_len=model.max_len, block_size=4, kv_groups=groups)
    sched = ENGINES["hybrid"].build(options)
    runner = CostModelRunner(cost, reads_of(groups) if reads else None)
    return Engine(sched, runner, coalesce=coalesce, windows=group_shapes(groups)).run(trace)


def test_the_engine_writes_the_kv_read_and_a_coalesced_segment_costs_its_steps():
    """steps.csv's kv_tokens_read: context_tokens less 5/6 of each token the window skips; a
    decode segment run in one call takes what its steps one by one take."""
    trace = Trace("two", (Request(0, 0.0, 3, 8), Request(1, 0.0, 9, 6)))
    slow = steps_of(TINY, COST, trace, coalesce=False)
    fast = steps_of(TINY, COST, trace, coalesce=True)
    assert len(fast.steps) < len(slow.steps)
    assert [s.finish_s for s in fast.sequences] == pytest.approx(
        [s.finish_s for s in slow.sequences], rel=1e-9
    )
    rows = slow.steps
    assert rows[0].kind == "prefill" and rows[0].context_tokens == 12 and rows[0].kv_tokens_read == 12
    # first decode step: contexts 4 and 10; the long row skips 10 - 6 = 4 window tokens
    assert rows[1].context_tokens == 14 and rows[1].kv_tokens_read == pytest.approx(14 - 4 * 40 / 48)
    assert rows[1].duration_s == pytest.approx(1.64)
    for coalesced in (slow, fast):  # the same totals however the steps were grouped
        assert sum(r.kv_tokens_read for r in coalesced.steps) == pytest.approx(
            sum(r.kv_tokens_read for r in rows), rel=1e-12
        )
    # what the rows read is what they were priced at: 1 s a step + 0.06 s a slot read
    for row in rows:
        assert row.duration_s == pytest.approx(row.num_steps + 0.06 * row.kv_tokens_read, rel=1e-12)


def test_without_window_layers_kv_read_is_the_context():
    groups = kv_groups((FullAttention(1, 2),) * 3)
    run = steps_of(groups, COST, Trace("one", (Request(0, 0.0, 30, 20),)), coalesce=True)
    assert all(row.kv_tokens_read == row.context_tokens for row in run.steps)
    assert all(isinstance(row.kv_tokens_read, int) for row in run.steps)


def test_a_fit_to_a_windowed_models_steps_recovers_the_cost_it_was_simulated_with(tmp_path):
    """calibrate reads kv_tokens_read: the count the simulator priced, so a fit to a simulated
    Gemma 3 run (fitting is refused for simulated runs but for such checks) returns its constants;
    fitted on context_tokens, the same rows give a K/V price less than a fifth of the true one."""
    out = tmp_path / "run"
    proc = kvbench_simulate(
        out, "--cost-fixed-s", "0.01", "--cost-per-token-s", "1e-4", "--cost-per-kv-token-s", "2e-7",
        "--num-requests", "12", "--rate", "4", trace="uniform:prompt=200..6000,output=5..300",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(out, simulated_ok=True)
    steps = read_csv(out / "steps.csv")
    assert rows.counts[:, 2].tolist() == pytest.approx([float(r["kv_tokens_read"]) for r in steps])
    assert any(float(r["kv_tokens_read"]) < int(r["context_tokens"]) for r in steps)
    fitted = calibrate([out], simulated_ok=True).cost
    assert (fitted.fixed_s, fitted.per_token_s, fitted.per_kv_token_s) == pytest.approx(
        (0.01, 1e-4, 2e-7), rel=1e-6
    )
    every_layer = rows.counts.copy()
    every_layer[:, 2] = [int(r["context_tokens"]) for r in steps]
    wrong = fit_shape(every_layer, rows.durations, rows.batch)[0]
    assert wrong[2] < 0.2 * 2e-7


def test_a_windowed_runs_steps_without_kv_read_are_refused(tmp_path):
    out = tmp_path / "run"
    assert kvbench_simulate(out, "--num-requests", "2", "--arrivals", "all").returncode == 0
    table = read_csv(out / "steps.csv")
    with open(out / "steps.csv", "w", newline="") as f:  # as an older kvbench wrote it
        writer = csv.DictWriter(
            f, [name for name in table[0] if name != "kv_tokens_read"], extrasaction="ignore"
        )
        writer.writeheader()
        writer.writerows(table)
    with pytest.raises(KvbenchError, match="no column 'kv_tokens_read'.*gemma-3-1b's sliding-window"):
        read_rows(out, simulated_ok=True)


# ------------------------------------------------------- kvbench simulate on a Gemma 3 preset


def kvbench_simulate(
    out: Path, *args: str, trace: str = "fixed:prompt=8000,output=40"
) -> subprocess.CompletedProcess:
    command = ["simulate", "--engine", "hybrid", "--model", "gemma-3-1b", "--emulate-gpu", "h200-141gb",
               "--trace", trace, "--out", str(out)]  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *command, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )  # a safety net only


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_simulated_gemma3_decode_steps_read_the_window_not_the_context(tmp_path):
    """gemma-3-1b: 22 window layers of 512 tokens and 4 full ones, 1,024 bytes a token in each
    (one KV head of 256, fp16), so a slot is 26,624 bytes. Four 8,000-token prompts decoding
    together at contexts c: every layer as full reads 4c slots a step; by group, 4 x (4c + 22 x
    512) / 26. At the first decode step (c = 8,001) that is 6,656.6 slots instead of 32,004:
    4.81x less K/V, at the roofline's H200 price per slot."""
    out = tmp_path / "run"
    proc = kvbench_simulate(out, "--num-requests", "4", "--arrivals", "all", "--step-by-step")
    assert proc.returncode == 0, proc.stderr
    model, gpu = get_model("gemma-3-1b"), get_gpu("h200-141gb")
    assert (model.kv_bytes_per_token, model.window, len(model.window_layers)) == (26_624, 512, 22)
    constants = json.loads((out / "config.json").read_text())["cost_model_constants"]
    cost = CostModel.roofline(model, gpu)
    assert constants["per_kv_token_s"] == cost.per_kv_token_s == 26_624 / (0.8 * gpu.read_bandwidth)
    decodes = [row for row in read_csv(out / "steps.csv") if row["kind"] == "decode"]
    assert len(decodes) == 39 and {row["batch_size"] for row in decodes} == {"4"}
    for j, row in enumerate(decodes):
        c = 8001 + j
        read = 4 * (4 * c + 22 * 512) / 26
        assert int(row["context_tokens"]) == 4 * c
        assert float(row["kv_tokens_read"]) == pytest.approx(read, rel=1e-12)
        windowed = cost.fixed_s + 4 * cost.per_token_s + cost.per_kv_token_s * read
        assert float(row["duration_s"]) == pytest.approx(windowed, rel=1e-9)
    first = decodes[0]
    assert float(first["kv_tokens_read"]) == pytest.approx(6656.6154, rel=1e-6)
    # the same step priced without windows, and what the K/V term alone saves
    unwindowed = cost.fixed_s + 4 * cost.per_token_s + cost.per_kv_token_s * 4 * 8001
    kv_seconds = cost.per_kv_token_s * 4 * 8001
    assert kv_seconds / (cost.per_kv_token_s * 6656.6154) == pytest.approx(4.8079, rel=1e-4)
    assert unwindowed - float(first["duration_s"]) == pytest.approx(
        cost.per_kv_token_s * (32_004 - 6656.6154)
    )

