"""Short prefills through static buffers (`kvbench.real.prefill_graphs`): the bucket rule, and the
same greedy tokens as the eager prefill for block tables and extents, with the PyTorch
attention and the Triton kernels (interpreted), in an arena poisoned with NaN, so a padding row
that stored K/V or a padding sequence that read any would show. On CPU the buffers run eagerly;
the graphs' replay is checked on a GPU (`gpu` marker)."""

from __future__ import annotations

import pytest
import torch

from kvbench.models import get_model
from kvbench.real.prefill_graphs import PrefillGraphs, prefill_bucket
from tests.support import INTERPRETED, greedy_tokens_by_engine

ENGINES = ("paged", "orca-oracle", "orca-max", "static")


@pytest.mark.parametrize(
    ("tokens", "seqs", "bucket"),
    [(1, 1, (16, 1)), (16, 1, (16, 1)), (17, 1, (32, 1)), (20, 3, (32, 4)), (256, 16, (256, 16)),
     (257, 1, None), (40, 17, None), (200, 9, (256, 16))],
)  # fmt: skip
def test_a_step_takes_the_smallest_bucket_holding_it_or_none_past_the_largest(tokens, seqs, bucket):
    assert prefill_bucket(tokens, seqs) == bucket


def counted(monkeypatch) -> list[tuple[int, int]]:
    """The buckets `PrefillGraphs.forward` ran, in order (it still runs)."""
    seen, forward = [], PrefillGraphs.forward

    def noted(graphs: PrefillGraphs, bucket: tuple[int, int]) -> torch.Tensor:
        seen.append(bucket)
        return forward(graphs, bucket)

    monkeypatch.setattr(PrefillGraphs, "forward", noted)
    return seen


@pytest.mark.parametrize(
    ("attention", "engines", "requests"),
    # interpreted kernels are slow: fewer requests, and static's batch for prefills of several
    # prompts. small_trace(4) decodes 1-5 tokens (small_trace(6): up to 14) and still has static
    # prefill two prompts in one bucket, (32, 2), beside paged's one-prompt buckets
    [("torch", ENGINES, 10), pytest.param("triton", ("paged", "static"), 4, marks=INTERPRETED)],
)
def test_static_prefills_give_the_eager_prefills_tokens(attention, engines, requests, monkeypatch):
    options = {"requests": requests, "attention": attention}
    eager = greedy_tokens_by_engine(get_model("tiny-llama"), engines, **options)
    seen = counted(monkeypatch)
    static = greedy_tokens_by_engine(get_model("tiny-llama"), engines, prefill_graphs=True, **options)
    assert static == eager
    # prompts of 3-23 tokens, 10 ms apart: every prefill fits a bucket, most with padding
    assert len(seen) >= 2 * len(engines) and all(bucket[0] >= 16 for bucket in seen)
    assert any(bucket[1] > 1 for bucket in seen)  # padding sequences, not only padding tokens


@INTERPRETED
def test_the_largest_buckets_long_prompts_and_learned_positions_through_the_kernels(monkeypatch):
    """Nine prompts arriving together, 248 tokens in all, one of 40 (two 32-query tiles of the
    extend kernel, whose grid the bucket's 256 tokens size), prefill in one step of the largest
    bucket, (256, 16): seven padding prompts, eight padding tokens. OPT's learned positions
    index an embedding. The interpreted Triton kernels give the eager prefill's tokens."""
    from kvbench.requests import Request, Trace

    prompts = (40, 30, 28, 25, 25, 25, 25, 25, 25)
    trace = Trace("together", tuple(Request(i, 0.0, p, 2) for i, p in enumerate(prompts)))
    options = {"trace": trace, "attention": "triton"}
    eager = greedy_tokens_by_engine(get_model("tiny-opt"), ("paged",), **options)
    seen = counted(monkeypatch)
    assert greedy_tokens_by_engine(get_model("tiny-opt"), ("paged",), prefill_graphs=True, **options) == eager
    assert seen == [(256, 16)]  # the one prefill step


def test_a_window_model_takes_them_with_every_engine_agreeing_but_not_on_a_table_per_group(monkeypatch):
    """Gemma 3's window layers read their window through the same buffers (the kernels' bound is
    per layer), contexts past the window. A grouped arena (a table per KV group: `hybrid` and
    `jenga` on a GPU) prefills eagerly."""
    from kvbench.modeling.weights import random_model
    from kvbench.real.prefill_graphs import static_prefill
    from tests.test_families import GEMMA3_TINY

    seen = counted(monkeypatch)
    engines = ("paged", "hybrid", "orca-oracle")
    tokens = greedy_tokens_by_engine(GEMMA3_TINY, engines, prefill_graphs=True)
    assert len(seen) >= 2 * len(engines)
    assert tokens == greedy_tokens_by_engine(GEMMA3_TINY, engines)
    model = random_model(GEMMA3_TINY, torch.float32, torch.device("cpu"), seed=0)
    assert static_prefill(model, 1) and not static_prefill(model, 2)


def test_a_soft_capped_model_prefills_from_the_static_buffers(monkeypatch):
    """Gemma 2 caps its scores, which the kernels do: its prefill takes the static buffers (and
    replays from graphs on a GPU) and gives the eager prefill's tokens."""
    from kvbench.modeling.weights import random_model
    from kvbench.real.prefill_graphs import static_prefill
    from tests.test_hybrid_real import GEMMA2

    assert GEMMA2.attn_softcap > 0
    assert static_prefill(random_model(GEMMA2, torch.float32, torch.device("cpu"), seed=0), 1)
    seen = counted(monkeypatch)
    engines = ("paged", "orca-oracle")
    assert greedy_tokens_by_engine(GEMMA2, engines, prefill_graphs=True) == greedy_tokens_by_engine(
        GEMMA2, engines
    )
    assert len(seen) >= 2 * len(engines)


def test_without_the_flag_and_on_mla_no_prefill_takes_the_static_buffers(monkeypatch):
    from tests.test_families_mla import MLA_TINY

    seen = counted(monkeypatch)
    greedy_tokens_by_engine(get_model("tiny-llama"), ("paged",))
    assert seen == []
    tokens = greedy_tokens_by_engine(MLA_TINY, ("paged",), prefill_graphs=True)
    assert seen == [] and tokens["paged"]  # MLA prefills attend through their own path: eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("engine", ["paged", "orca-oracle"])
def test_gpu_replayed_prefills_give_the_eager_prefills_tokens(engine):
    """A real run with every prefill replayed from its bucket's graph gives every request the
    greedy tokens of the same run with eager prefills. In fp32: the two paths pad a prefill to
    different row counts (a bucket of 16-256 against a multiple of 16), and a GEMM of other rows
    may sum in another order, which in bf16 can flip a near-tie of random weights' logits."""
    from kvbench.config import RunConfig
    from kvbench.real.run import run_real
    from workloads.spec import WorkloadSpec

    workload = WorkloadSpec("uniform:prompt=4..60,output=4..24", num_requests=40, rate=200.0, seed=3)
    runs = {}
    for graphs in (False, True):
        config = RunConfig(engine, model="tiny-llama", workload=workload, kv_cache_gib=0.05, device="cuda",
                           dtype="float32", prefill_graphs=graphs)  # fmt: skip
        result = run_real(config)
        runs[graphs] = {seq.seq_id: list(seq.output_ids) for seq in result.run.sequences}
        if graphs:  # every prefill a bucket holds replayed its graph
            rows = [row for row in result.run.steps if row.kind == "prefill"]
            fits = sum(prefill_bucket(row.num_tokens, row.batch_size) is not None for row in rows)
            assert result.summary["prefill_graph_replays"] == fits > 0
    assert runs[True] == runs[False]


@pytest.mark.parametrize("block_size", [16, 0])
def test_the_buffers_hold_the_largest_bucket_in_the_kernels_dtypes(block_size):
    """What the kernels and the model read: int64 ids, positions, slots (padding -1) and
    offsets, int32 context lengths and block tables `[B', ceil(max_len / block)]`, or int64
    extent starts; nothing replayed or captured yet."""
    from kvbench.modeling.arena import KVArena
    from kvbench.modeling.weights import random_model

    spec = get_model("tiny-llama")
    cpu = torch.device("cpu")
    model = random_model(spec, torch.float32, cpu, seed=0)
    graphs = PrefillGraphs(model, KVArena(spec, 64, torch.float32, cpu), block_size=block_size, max_len=40,
                           backend="torch")  # fmt: skip
    for buffer in (graphs.input_ids, graphs.positions, graphs.slots):
        assert buffer.dtype == torch.int64 and buffer.shape == (256,)
    assert (graphs.slots == -1).all()
    assert graphs.cu_seqlens.dtype == torch.int64 and graphs.cu_seqlens.shape == (17,)
    assert graphs.context.dtype == torch.int32 and graphs.context.shape == (16,)
    if block_size:
        assert graphs.starts is None and graphs.tables.dtype == torch.int32 and graphs.tables.shape == (16, 3)
    else:
        assert graphs.tables is None and graphs.starts.dtype == torch.int64 and graphs.starts.shape == (16,)
    assert graphs.replays == 0 and graphs.capture_s == 0.0


def test_a_real_run_reports_its_replays_only_when_asked_for_prefill_graphs():
    """On the CPU nothing is captured: the summary says 0 replays and 0 s of capture."""
    from dataclasses import replace

    from kvbench.config import RunConfig
    from kvbench.real.run import run_real
    from workloads.spec import WorkloadSpec

    workload = WorkloadSpec("uniform:prompt=4..20,output=2..4", num_requests=4, rate=100.0, seed=1)
    config = RunConfig("paged", model="tiny-llama", workload=workload, kv_cache_gib=0.01, device="cpu",
                       attention="torch", prefill_graphs=True)  # fmt: skip
    summary = run_real(config).summary
    assert summary["prefill_graph_replays"] == 0 and summary["prefill_graph_capture_s"] == 0.0
    assert "prefill_graph_replays" not in run_real(replace(config, prefill_graphs=False)).summary
