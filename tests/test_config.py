"""Sizing: model presets, KV budgets, reservation policies, cost model, trace checks."""

from __future__ import annotations

import pytest

from engines.contiguous import MaxReservation, OracleReservation, Pow2Reservation
from kvbench.budget import GIB, GPUS, activation_reserve, budget_emulating, budget_from_gib
from kvbench.config import RunConfig, check_trace, prepare
from kvbench.cost_model import CostModel
from kvbench.errors import KvbenchError
from kvbench.models import MODELS, get_model
from kvbench.requests import Request, Trace
from workloads.spec import WorkloadSpec


@pytest.mark.parametrize(
    ("name", "params_b", "kv_bytes"),
    [
        ("opt-125m", 0.125, 36_864),
        ("opt-13b", 12.85, 819_200),  # PAPER.md Table 1
        ("opt-66b", 65.7, 2_359_296),
        ("opt-175b", 174.6, 4_718_592),
        ("llama-13b", 13.0, 819_200),
        ("llama-3-8b", 8.03, 131_072),  # GQA: 8 KV heads of 32
    ],
)
def test_presets_match_the_public_architectures(name, params_b, kv_bytes):
    model = get_model(name)
    assert model.num_params / 1e9 == pytest.approx(params_b, rel=0.005)
    assert model.kv_bytes_per_token == kv_bytes


def test_every_preset_is_listed_once():
    assert len(MODELS) == 20 and all(
        model.head_dim * model.num_heads == model.hidden
        for model in MODELS.values()
        if model.family in ("opt", "llama")
    )


def test_the_papers_budget_gives_the_papers_slots():
    budget = budget_from_gib(12, get_model("opt-13b"))
    assert budget.num_slots == 15_728  # "15.7K" slots, 12 GB / 800 KiB
    assert budget.num_slots // 2048 == 7  # Orca (Max) fits 7 requests


def test_emulated_budget_follows_the_documented_formula():
    model, gpu = get_model("opt-13b"), GPUS["a100-40gb"]
    budget = budget_emulating(gpu, model, utilization=0.85)  # not the paper's setting: the estimate
    expected = 40 * GIB * 0.85 - model.weight_bytes - activation_reserve(model, 2048, 256)
    assert budget.budget_bytes == int(expected)
    assert budget.num_slots == int(expected // 819_200) == 12_890
    assert budget.source.startswith("--emulate-gpu a100-40gb: 40.0 GiB x 0.85")


def test_the_papers_own_setting_is_emulated_with_its_published_kv_cache():
    """OPT-13B on one A100-40GB: the paper's 12 GiB (Table 1), 15,728 slots, so Orca (Max) fits
    7 requests and leaves Figure 2's 8.9 %; the estimate (15,512 slots) is named beside it."""
    budget = budget_emulating(GPUS["a100-40gb"], get_model("opt-13b"))
    assert (budget.budget_bytes, budget.num_slots) == (12 * GIB, 15_728)
    assert round(100 * (15_728 - 7 * 2048) / 15_728, 1) == 8.9
    assert "the PagedAttention paper's KV cache" in budget.source and "estimate: 11.83 GiB" in budget.source
    assert budget_emulating(GPUS["a100-80gb"], get_model("opt-175b"), gpus=8).num_slots == 60_074  # "60.1K"
    assert budget_emulating(GPUS["a100-80gb"], get_model("opt-13b")).budget_bytes != 12 * GIB  # not published
    prepared = prepare(RunConfig(engine="paged", model="opt-13b", emulate_gpu="a100-40gb"))
    assert prepared.options.num_slots == 15_728


def test_a_model_too_big_for_the_emulated_gpu_is_refused():
    with pytest.raises(KvbenchError, match="--emulate-gpu a100-40gb leaves -"):
        budget_emulating(GPUS["a100-40gb"], get_model("opt-66b"))


def test_reservation_policies():
    r = Request(0, 0.0, prompt_len=100, output_len=25)  # kv_len 124
    assert MaxReservation(2048).slots(r) == 2048
    assert Pow2Reservation(2048).slots(r) == 100 + 32 - 1  # the paper's "25 -> 32" on the output
    assert OracleReservation().slots(r) == 124
    assert Pow2Reservation(2048).slots(Request(2, 0.0, 100, 1500)) == 2048  # capped, like Max
    exact = Request(1, 0.0, prompt_len=10, output_len=32)
    assert Pow2Reservation(2048).slots(exact) == OracleReservation().slots(exact) == 41


def test_roofline_cost_model_for_opt13b_on_a100():
    cost = CostModel.roofline(get_model("opt-13b"), GPUS["a100-40gb"])
    assert cost.fixed_s == pytest.approx(25.707e9 / (1.555e12 * 0.8), rel=1e-3)
    step = cost.fixed_s + 30 * cost.per_token_s + 30 * 400 * cost.per_kv_token_s
    assert step == pytest.approx(0.0327, abs=1e-4)  # the figure quoted in the module docstring


def test_check_trace_names_the_request_that_exceeds_the_model():
    model = get_model("opt-13b")
    ok = Trace("t", (Request(0, 0.0, 1000, 1048),))
    check_trace(ok, model)
    long = Trace("t", (Request(0, 0.0, 10, 10), Request(1, 0.0, 1500, 600)))
    with pytest.raises(KvbenchError, match="request 1 has prompt 1500 \\+ output 600 tokens, more than"):
        check_trace(long, model)


def test_prepare_resolves_defaults():
    prepared = prepare(RunConfig(engine="paged", workload=WorkloadSpec(num_requests=10, rate=1.0)))
    assert prepared.options.scheduler.max_num_batched_tokens == 2048
    assert prepared.options.num_slots == 15_728  # the paper's A100-40GB by default
    assert len(prepared.trace) == 10


def test_block_size_larger_than_the_arena_is_refused():
    with pytest.raises(KvbenchError, match="--block-size 4096 exceeds the KV arena"):
        prepare(RunConfig(engine="paged", kv_cache_gib=0.002, block_size=4096))


def test_emulated_budget_can_subtract_measured_weights():
    model, gpu = get_model("opt-6.7b"), GPUS["a100-40gb"]
    fp16 = budget_emulating(gpu, model)
    fp32 = budget_emulating(gpu, model, weight_bytes=2 * model.weight_bytes)  # the same model in fp32
    assert fp16.budget_bytes - fp32.budget_bytes == model.weight_bytes
    assert "(measured)" in fp32.source and "(fp16)" in fp16.source
