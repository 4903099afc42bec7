"""Chunked prefill (`--chunked-prefill`, engines/chunked.py): the budget rules of every step, the
tokens a real model decodes, the latency it buys in simulation, and the inputs it refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from engines import ENGINES, EngineOptions
from engines.chunked import ChunkedScheduler
from engines.scheduler import Batch, SchedulerConfig
from kvbench.cli.app import app
from kvbench.config import RunConfig
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.engine import Engine
from kvbench.models import get_model
from kvbench.requests import Request, Trace
from kvbench.runner import StepResult
from kvbench.sequence import SeqStatus
from kvbench.simulate import simulate
from tests.support import INTERPRETED
from workloads.spec import WorkloadSpec

STEP = CostModel(fixed_s=0.01, per_token_s=1e-4, per_kv_token_s=1e-6)
CONTINUOUS = [name for name, spec in ENGINES.items() if spec.scheduler.__name__ == "IterationScheduler"]


class Recorder:
    """A cost-model runner that keeps, for each step it runs, the batch and what every running
    sequence still had to compute when it was scheduled (the rules are about that moment)."""

    allocates_ahead = False

    def __init__(self, scheduler: ChunkedScheduler) -> None:
        self.scheduler = scheduler
        self.inner = CostModelRunner(STEP)
        self.steps: list[tuple[Batch, dict[int, int], list[int]]] = []

    def run(self, batch: Batch, max_steps: int, start_s: float, until_s: float) -> StepResult:
        # uncomputed tokens, 0 for a running decode (a prompt's last 1-token chunk counts 1)
        todo = {
            seq.seq_id: 0 if seq.num_generated and seq.num_tokens - seq.num_computed == 1 else
            seq.num_tokens - seq.num_computed for seq in self.scheduler.running
        }  # fmt: skip
        waiting = [seq.seq_id for seq in self.scheduler.waiting]
        self.steps.append((batch, todo, waiting))
        return self.inner.run(batch, max_steps, start_s, until_s)


def trace_of(*lengths: tuple[int, int], gap: float = 0.004) -> Trace:
    return Trace("hand", tuple(Request(i, i * gap, p, o) for i, (p, o) in enumerate(lengths)))


def chunked_run(engine: str, trace: Trace, budget: int, seqs: int = 4, slots: int = 4096):
    config = SchedulerConfig(seqs, budget, chunked_prefill=True)
    scheduler = ENGINES[engine].build(
        EngineOptions(num_slots=slots, max_len=256, block_size=4, scheduler=config)
    )
    assert isinstance(scheduler, ChunkedScheduler)
    recorder = Recorder(scheduler)
    return Engine(scheduler, recorder, coalesce=False).run(trace), recorder


@pytest.mark.parametrize("engine", CONTINUOUS)
def test_every_step_keeps_the_budget_runs_every_decode_and_chunks_in_arrival_order(engine):
    lengths = [(40, 6), (9, 12), (70, 3), (5, 9), (33, 5), (21, 7), (64, 4), (3, 8)]
    budget = 16
    run, recorder = chunked_run(engine, trace_of(*lengths), budget)
    chunks_of: dict[int, list[tuple[int, int]]] = {}  # request -> [(step, chunk)]
    for index, (batch, todo, waiting) in enumerate(recorder.steps):
        ids = [seq.seq_id for seq in batch.seqs]
        chunks = batch.chunks or (1,) * len(ids)
        assert sum(chunks) == batch.num_tokens <= budget
        decoding = {sid for sid, left in todo.items() if left == 0}
        assert decoding <= set(ids), f"step {index} stalls a running decode"
        prompts = [(sid, chunk) for sid, chunk in zip(ids, chunks, strict=True) if todo[sid]]
        # FCFS: prompt chunks go to the oldest first, and only the last one may stop short
        assert [sid for sid, _ in prompts] == sorted(sid for sid, _ in prompts)
        for sid, chunk in prompts[:-1]:
            assert chunk == todo[sid]
        for sid, chunk in prompts:
            chunks_of.setdefault(sid, []).append((index, chunk))
        if prompts:  # nobody older waits for a chunk, in the queue or running, while this one gets one
            newest = prompts[-1][0]
            assert all(sid in ids for sid, left in todo.items() if sid < newest and left)
            assert all(sid > newest for sid in waiting)
    for sid, (prompt, output) in enumerate(lengths):
        seq = next(s for s in run.sequences if s.seq_id == sid)
        assert seq.status is SeqStatus.FINISHED and seq.num_generated == output
        assert seq.num_preemptions == 0
        steps = [index for index, _ in chunks_of[sid]]
        assert sum(chunk for _, chunk in chunks_of[sid]) == prompt  # every prompt token, once
        assert steps == list(range(steps[0], steps[0] + len(steps)))  # consecutive steps
        assert len(steps) >= -(-prompt // budget)
        first, last = run.steps[steps[0]], run.steps[steps[-1]]  # one row per step: not coalesced
        assert seq.first_token_s == last.start_s + last.duration_s  # the last chunk samples it
        assert seq.admitted_s == first.start_s
    # the rows say what ran: mixed steps carry the chunks, and tokens add up
    kinds = {row.kind for row in run.steps}
    assert kinds == {"mixed", "decode"}
    assert sum(row.num_tokens for row in run.steps) == sum(p + o - 1 for p, o in lengths)


def test_a_first_token_comes_with_the_last_chunk():
    # one request alone: 50 prompt tokens in chunks of 16, 16, 16, 2; then its decodes
    run, recorder = chunked_run("paged", trace_of((50, 3)), budget=16)
    assert [batch.chunks for batch, _, _ in recorder.steps[:4]] == [(16,), (16,), (16,), (2,)]
    assert [row.kind for row in run.steps] == ["mixed"] * 4 + ["decode"] * 2
    seq = run.sequences[0]
    fourth_end = run.steps[3].start_s + run.steps[3].duration_s
    assert seq.first_token_s == pytest.approx(fourth_end)
    assert seq.admitted_s == 0.0
    assert seq.token_times[0] == pytest.approx(fourth_end)


@pytest.mark.parametrize(
    ("engine", "preemption"), [("paged", "recompute"), ("paged", "swap"), ("vmm", "recompute")]
)
def test_coalesced_runs_match_step_by_step_runs_through_preemptions(engine, preemption):
    """2 GiB of OPT-13B K/V is too little for this ShareGPT load: requests are preempted (by
    recompute or swapping) and come back; every one still finishes, as it does step by step."""
    workload = WorkloadSpec("sharegpt-paper", num_requests=120, rate=6.0, seed=4)
    config = RunConfig(
        engine=engine, model="opt-13b", workload=workload, kv_cache_gib=2,
        max_num_batched_tokens=512, chunked_prefill=True, preemption=preemption,
    )  # fmt: skip
    fast, slow = simulate(config), simulate(config, coalesce=False)
    assert len(fast.run.steps) < len(slow.run.steps)
    assert fast.summary["completed"] == 120 and fast.summary["num_preemptions"] > 0
    pairs = zip(fast.run.sequences, slow.run.sequences, strict=True)
    for a, b in pairs:
        # the same steps; summed in another order, times may differ in their last bit
        times = (a.admitted_s, a.first_token_s, a.finish_s)
        assert times == pytest.approx((b.admitted_s, b.first_token_s, b.finish_s), rel=1e-12)
        assert a.num_preemptions == b.num_preemptions


@pytest.mark.parametrize("rate", [20.0, 30.0])
def test_chunked_prefill_lowers_the_decode_latency_of_a_prefill_heavy_trace(rate):
    """Alpaca on OPT-13B at a high rate: unchunked, every admission stops the running decodes for
    a prefill step; chunked, they run beside the prompts, so tokens come faster between steps."""
    workload = WorkloadSpec("alpaca-paper", num_requests=400, rate=rate, seed=0)
    runs = {}
    for chunked in (False, True):
        config = RunConfig(
            engine="paged", model="opt-13b", workload=workload, kv_cache_gib=12, chunked_prefill=chunked,
            max_num_batched_tokens=512 if chunked else None,
        )  # fmt: skip
        runs[chunked] = simulate(config)
    plain, chunked = runs[False].summary, runs[True].summary
    assert plain["completed"] == chunked["completed"] == 400
    assert chunked["mean_tpot_s"] < 0.8 * plain["mean_tpot_s"]
    assert chunked["mean_itl_s"] < 0.8 * plain["mean_itl_s"]
    steps = runs[True].run.steps
    assert {row.kind for row in steps} == {"mixed", "decode"}
    requests = runs[True].prepared.trace.requests
    assert sum(row.num_tokens for row in steps) == sum(r.prompt_len + r.output_len - 1 for r in requests)


def real_chunked_and_whole(engine: str, workload: WorkloadSpec, budget: int, **options) -> dict:
    """{chunked: (greedy tokens by request, step kinds in order)} of one real run with prompts
    in chunks of at most `budget` tokens and one with them prefilled whole, else alike."""
    from kvbench.real.run import run_real

    runs = {}
    for chunked in (False, True):
        config = RunConfig(
            engine=engine, model="tiny-llama", workload=workload,
            max_num_batched_tokens=budget if chunked else None, chunked_prefill=chunked, **options,
        )  # fmt: skip
        run = run_real(config).run
        assert all(len(seq.output_ids) == seq.request.output_len for seq in run.sequences)
        tokens = {seq.seq_id: list(seq.output_ids) for seq in run.sequences}
        runs[chunked] = (tokens, [row.kind for row in run.steps])
    return runs


@INTERPRETED
@pytest.mark.parametrize(
    ("engine", "attention"), [("paged", "auto"), ("orca-oracle", "auto"), ("paged", "torch")]
)
def test_the_real_model_decodes_the_same_tokens_with_prompts_in_chunks(engine, attention, monkeypatch):
    """Prefix-aware prefill is exact: a prompt computed in chunks of at most 16 tokens, beside
    other requests' decodes, gives every request the greedy tokens it gets prefilled whole (the
    Triton kernels, interpreted, over blocks and extents; and the PyTorch reference). The mixed
    steps' decodes attend through the decode kernel (counted by wrapping the split, which still
    computes); whole prompts never do."""
    from kvbench.modeling import attention as module

    split_rows, real = [], module._split_prefill
    monkeypatch.setattr(module, "_split_prefill", lambda *a: split_rows.append(a[3].decode_rows) or real(*a))
    # all six within a millisecond, before the first step ends: four run at once from the second
    # step on, so chunks of the later prompts run beside the earlier ones' decodes, however fast.
    # Two or three tokens out: the decodes beside the chunks are what is checked, not long tails
    # of decode-only steps (each step runs the interpreted kernels)
    workload = WorkloadSpec("uniform:prompt=20..48,output=2..3", num_requests=6, rate=1e4, seed=2)
    runs = real_chunked_and_whole(
        engine, workload, 16, kv_cache_gib=0.01, block_size=4, max_num_seqs=4, attention=attention
    )
    (whole, whole_kinds), (chunked, kinds) = runs[False], runs[True]
    assert chunked == whole
    assert "mixed" in kinds and "mixed" not in whole_kinds
    assert kinds.count("mixed") >= 12  # six prompts of 20-48 tokens: at least two chunks each
    layers = get_model("tiny-llama").num_layers  # one split call per layer of each mixed step with a decode
    assert split_rows and len(split_rows) % layers == 0 and min(split_rows) >= 1


@INTERPRETED
@pytest.mark.parametrize(("backend", "window"), [("torch", 0), ("triton", 0), ("triton", 9)])
@pytest.mark.parametrize("block_size", [0, 8])
def test_a_prefills_one_token_rows_through_the_decode_kernel_give_what_the_extend_kernel_gives(
    backend, window, block_size
):
    """A prefill leading with two 1-token rows (`decode_rows` 2: decode kernel, 3 splits) and
    two prompt chunks behind them attends as the same prefill does through the extend kernel
    alone, over blocks and extents, full and windowed, with NaN wherever no sequence lives."""
    import torch

    from kvbench.modeling.attention import AttentionMetadata, attention
    from tests.test_kernels import Arena, _rand

    gen = torch.Generator().manual_seed(7)
    lens, new, head_dim = [70, 33, 20, 45], [1, 1, 6, 20], 16
    arena = Arena(lens, 2, head_dim, torch.float32, torch.device("cpu"), block_size=block_size, gen=gen)
    tokens = sum(new)
    q = _rand((tokens, 4, head_dim), torch.float32, "cpu", gen)  # [T, H, D]
    k, v = (_rand((tokens, 2, head_dim), torch.float32, "cpu", gen) for _ in range(2))  # [T, Hkv, D]
    slots = torch.cat(
        [arena.slots(b, torch.arange(n - m, n)) for b, (n, m) in enumerate(zip(lens, new, strict=True))]
    )
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()])
    whole = AttentionMetadata(
        True, slots, cu, arena.lens, max_new=max(new), backend=backend, **arena.addressing()
    )  # fmt: skip
    layer = {"window": window} if window else {}
    expected = attention(q, k, v, arena.k, arena.v, whole, head_dim**-0.5, **layer)
    split = attention(
        q, k, v, arena.k, arena.v, replace(whole, decode_rows=2, num_splits=3), head_dim**-0.5, **layer
    )
    assert not split.isnan().any()
    assert (split - expected).abs().max() <= 1e-5


# --- refused inputs -----------------------------------------------------------------------------


def refused(*args: str) -> str:
    result = CliRunner().invoke(app, ["simulate", *args, "--num-requests", "4", "--chunked-prefill"])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("engine", ["static", "paged-static"])
def test_static_engines_refuse_chunked_prefill(engine, tmp_path):
    line = refused("--engine", engine, "--out", str(tmp_path / "out"))
    assert "--chunked-prefill" in line and engine in line


def test_a_budget_below_the_running_decodes_is_refused(tmp_path):
    line = refused(
        "--engine", "paged", "--max-num-seqs", "64", "--max-num-batched-tokens", "32", "--out", str(tmp_path)
    )
    assert "--max-num-batched-tokens 32" in line and "--max-num-seqs 64" in line


def test_requests_with_several_outputs_are_refused(tmp_path):
    line = refused("--engine", "paged", "--n", "2", "--out", str(tmp_path / "out"))
    assert "--chunked-prefill" in line and "--n" in line


def test_a_budget_below_the_model_length_is_taken_when_chunked(tmp_path):
    result = CliRunner().invoke(app, [
        "simulate", "--engine", "paged", "--num-requests", "20", "--max-num-seqs", "32",
        "--max-num-batched-tokens", "64", "--chunked-prefill", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    without = CliRunner().invoke(app, [
        "simulate", "--engine", "paged", "--num-requests", "20", "--max-num-batched-tokens", "64",
        "--out", str(tmp_path / "other"),
    ])  # fmt: skip
    assert without.exit_code == 2


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("engine", ["paged", "orca-oracle"])
def test_gpu_mixed_steps_beside_graph_decodes_give_the_unchunked_tokens(engine):
    """On a GPU, mixed steps run eagerly through the prefill kernels while decode-only steps
    replay CUDA graphs captured before the first step: the greedy tokens (float32) are those of
    the same requests prefilled whole, and both kinds of step occur."""
    workload = WorkloadSpec("uniform:prompt=40..200,output=8..40", num_requests=24, rate=400.0, seed=5)
    runs = real_chunked_and_whole(
        engine,
        workload,
        64,
        kv_cache_gib=0.05,
        block_size=16,
        max_num_seqs=16,
        device="cuda",
        dtype="float32",
        cuda_graphs=True,
    )
    (whole, whole_kinds), (chunked, kinds) = runs[False], runs[True]
    assert chunked == whole
    assert set(kinds) == {"mixed", "decode"} and "mixed" not in whole_kinds


def test_the_chunked_step_budget_is_2048_unless_set_whatever_the_model_length():
    """Unchunked, a step must hold a whole prompt (a long-context model's whole length); chunked,
    the budget is vLLM's 2,048 unless set, not 131,072 tokens a step that would stall decodes."""
    from kvbench.config import batched_tokens
    from kvbench.models import get_model

    gemma = get_model("gemma-3-12b")
    unchunked = RunConfig("paged", model="gemma-3-12b")
    assert batched_tokens(unchunked, gemma) == gemma.max_len == 131072
    assert batched_tokens(replace(unchunked, chunked_prefill=True), gemma) == 2048
    assert (
        batched_tokens(replace(unchunked, chunked_prefill=True, max_num_batched_tokens=8192), gemma) == 8192
    )
