"""The cost model's MoE terms: a token runs only the routed experts its router picks, and a step
reads only the routed experts one of its rows picks.

DeepSeek-V2-Lite routes each token to 6 of 64 experts (beside 2 shared ones) in 26 of its 27
layers, each expert 3 x 2,048 x 1,408 weights: 14.4 B of its 15.7 B parameters are routed
experts. Rows picking independently and uniformly, a step of r rows reads 1 - (58/64)^r of
them: 9.4 % at one row, 54.5 % at 8, 95.7 % at 32. Under the dense dispatch (every expert over
every row) a step reads and runs all of them whatever the rows pick.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from engines.scheduler import Batch
from kvbench.budget import get_gpu
from kvbench.calibrate.fit import cost_file_digest, load_cost_model
from kvbench.config import RunConfig, prepare
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.errors import KvbenchError
from kvbench.models import get_model
from kvbench.real.collectors import routed_expert_bytes
from kvbench.requests import Request
from kvbench.sequence import Sequence
from workloads.spec import WorkloadSpec

MODEL = "deepseek-v2-lite"
ROUTED = 26 * 64 * 3 * 2048 * 1408  # DeepSeek-V2-Lite's routed expert parameters
H200 = get_gpu("h200-141gb")
BANDWIDTH = 0.8 * H200.read_bandwidth  # the roofline's bandwidth efficiency
FLOPS = 0.6 * H200.fp16_flops  # and its compute efficiency


def test_a_moe_token_is_priced_at_the_experts_it_runs():
    """The other 58 experts' weights a layer cost a token no FLOPs, so the roofline's per-token
    cost is 2.66 B parameters', not 15.7 B; a dense model's is all of them."""
    spec = get_model(MODEL)
    assert spec.routed_expert_params == ROUTED
    assert spec.num_params - spec.active_params == 26 * 58 * 3 * 2048 * 1408
    assert 2.6e9 < spec.active_params < 2.7e9 and 15.6e9 < spec.num_params < 15.8e9
    cost = CostModel.roofline(spec, H200)
    assert cost.per_token_s == pytest.approx(2 * spec.active_params / FLOPS, rel=1e-12)
    unknown = replace(spec, moe=replace(spec.moe, top_k=0))  # a router's top-k not in its config: all
    assert unknown.active_params == unknown.num_params
    every = CostModel.roofline(unknown, H200)  # and every step reads every weight
    assert (every.fixed_s, every.routed_experts_s, every.expert_pick) == (
        unknown.weight_bytes / BANDWIDTH,
        0,
        0,
    )
    for dense in ("opt-13b", "llama-3.1-8b", "gemma-3-12b"):
        assert get_model(dense).active_params == get_model(dense).num_params
        assert get_model(dense).routed_expert_params == 0


def test_a_step_reads_the_routed_experts_its_rows_pick():
    spec = get_model(MODEL)
    cost = CostModel.roofline(spec, H200)
    assert cost.fixed_s == pytest.approx((spec.num_params - ROUTED) * 2 / BANDWIDTH, rel=1e-12)
    assert cost.routed_experts_s == pytest.approx(ROUTED * 2 / BANDWIDTH, rel=1e-12)
    assert cost.expert_pick == 6 / 64
    share = {rows: cost.expert_reads(rows) / cost.routed_experts_s for rows in (1, 8, 32, 64)}
    assert share[1] == pytest.approx(0.09375, rel=1e-12)
    assert share[8] == pytest.approx(0.5450285, rel=1e-6)
    assert share[32] == pytest.approx(0.9571514, rel=1e-6)
    assert 0.998 < share[64] < 1
    # one row reads the shared part and 6 of 64 routed experts: 5.9x less than every weight
    assert cost.fixed_s + cost.expert_reads(1) == pytest.approx(
        (spec.num_params - ROUTED + ROUTED * 6 / 64) * 2 / BANDWIDTH, rel=1e-12
    )
    assert spec.weight_bytes / BANDWIDTH / (cost.fixed_s + cost.expert_reads(1)) == pytest.approx(
        5.90, abs=0.01
    )


@pytest.mark.parametrize("term", ["fixed_s", "per_token_s", "per_kv_token_s", "routed_experts_s"])
def test_any_one_per_step_term_makes_a_step_take_time(term):
    """A cost model whose steps are all free is refused (`takes_time`); any one term above 0 is not."""
    free = CostModel(fixed_s=0.0, per_token_s=0.0, per_kv_token_s=0.0)
    assert not free.takes_time()
    assert replace(free, **{term: 1e-6}).takes_time()


def test_a_pick_of_one_reads_every_expert_every_step():
    """The dense dispatch's reads (every expert over every row), as a cost file can price them."""
    cost = replace(CostModel.roofline(get_model(MODEL), H200), expert_pick=1.0)
    assert cost.expert_reads(1) == cost.expert_reads(64) == cost.routed_experts_s


def test_a_dense_model_has_no_expert_terms():
    for name in ("opt-13b", "llama-3.1-8b"):
        spec = get_model(name)
        cost = CostModel.roofline(spec, H200)
        assert (cost.routed_experts_s, cost.expert_pick, cost.expert_reads(16)) == (0.0, 0.0, 0.0)
        assert cost.fixed_s == spec.weight_bytes / BANDWIDTH
        assert cost.per_token_s == 2 * spec.num_params / FLOPS


def decoding(prompt: int) -> Sequence:
    seq = Sequence(Request(0, 0.0, prompt, 50))
    seq.advance(1, end_s=0.0)
    return seq


def test_the_runner_charges_a_prefill_its_tokens_share_and_a_decode_its_rows():
    """A prefill of 20 tokens routes 20 rows (nearly every expert); each decode step of 3
    sequences routes 3."""
    cost = CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.0, routed_experts_s=10.0, expert_pick=0.5)
    runner = CostModelRunner(cost)
    seq = Sequence(Request(0, 0.0, 20, 5))
    prefill = Batch((seq,), is_prefill=True, num_tokens=20, num_context=20)
    assert runner.run(prefill, 1, 0.0, math.inf).durations[0] == pytest.approx(1 + 10 * (1 - 0.5**20))
    seqs = tuple(decoding(p) for p in (4, 5, 6))
    batch = Batch(seqs, is_prefill=False, num_tokens=3, num_context=sum(s.num_tokens for s in seqs))
    durations = runner.run(batch, 4, 0.0, math.inf).durations
    assert durations == pytest.approx([1 + 10 * (1 - 0.5**3)] * 4)  # 8.75 s a step


def test_a_graphs_padding_rows_are_one_more_pick():
    """Replayed from a CUDA graph, 5 sequences run 8 rows; the 3 padding rows are one token at one
    position, so they pick one set of experts between them: 6 picks, not 8."""
    cost = CostModel(fixed_s=1.0, per_token_s=0.0, per_kv_token_s=0.0, routed_experts_s=10.0, expert_pick=0.5)
    padded = replace(cost, pads_decode=True)
    seqs = tuple(decoding(p) for p in (4, 5, 6, 7, 8))
    batch = Batch(seqs, is_prefill=False, num_tokens=5, num_context=sum(s.num_tokens for s in seqs))
    assert CostModelRunner(padded).run(batch, 3, 0.0, math.inf).durations == pytest.approx(
        [1 + 10 * (1 - 0.5**6)] * 3
    )
    assert CostModelRunner(cost).run(batch, 3, 0.0, math.inf).durations == pytest.approx(
        [1 + 10 * (1 - 0.5**5)] * 3
    )
    full = Batch(seqs[:4], is_prefill=False, num_tokens=4, num_context=sum(s.num_tokens for s in seqs[:4]))
    assert CostModelRunner(padded).run(full, 1, 0.0, math.inf).durations == pytest.approx(
        [1 + 10 * (1 - 0.5**4)]
    )


def test_a_given_step_cost_is_every_weight_read():
    """`--cost-fixed-s` is what a step costs whatever it reads: no expert reads on top of it."""
    config = RunConfig(
        engine="paged", model=MODEL, emulate_gpu="h200-141gb", cost_fixed_s=0.005,
        workload=WorkloadSpec("fixed:prompt=16,output=4", num_requests=2, arrivals="all"),
    )  # fmt: skip
    cost = prepare(config).cost
    assert (cost.fixed_s, cost.routed_experts_s, cost.expert_reads(32)) == (0.005, 0.0, 0.0)


def test_the_real_roofline_prices_the_experts_of_the_grouped_dispatch_only():
    """Of DeepSeek-V2-Lite's weights as loaded, the routed experts' share is theirs of the parameters."""
    spec = get_model(MODEL)
    loaded = spec.num_params * 2  # bf16
    assert routed_expert_bytes(spec, "grouped", loaded) == (ROUTED * 2, 6 / 64)
    assert routed_expert_bytes(spec, "dense", loaded) == (0, 0.0)  # every expert over every row
    assert routed_expert_bytes(get_model("llama-3.1-8b"), "grouped", 16 * 10**9) == (0, 0.0)


@pytest.mark.parametrize("dispatch", ["dense", "grouped"])
def test_a_simulated_run_prices_the_experts_its_rows_pick(dispatch):
    """A simulation prices the grouped dispatch's reads whatever the real-run setting records
    (a simulated run records RunConfig's default, `dense`)."""
    config = RunConfig(
        engine="paged", model=MODEL, emulate_gpu="h200-141gb", expert_dispatch=dispatch,
        workload=WorkloadSpec("fixed:prompt=16,output=4", num_requests=2, arrivals="all"),
    )  # fmt: skip
    cost = prepare(config).cost
    assert (cost.expert_pick, cost.routed_experts_s) == (
        6 / 64,
        CostModel.roofline(get_model(MODEL), H200).routed_experts_s,
    )


def write(path, **terms) -> str:
    base = {"model": MODEL, "fixed_s": 0.001, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}
    path.write_text(json.dumps(base | terms))
    return str(path)


def test_a_cost_file_prices_expert_reads_only_with_a_share_a_row_picks(tmp_path):
    model = load_cost_model(write(tmp_path / "a.json", routed_experts_s=0.007, expert_pick=0.09375), MODEL)
    assert (model.routed_experts_s, model.expert_pick) == (0.007, 0.09375)
    with pytest.raises(
        KvbenchError, match=r"'expert_pick' is a share of routed experts, in \[0, 1\], got 1.5"
    ):
        load_cost_model(write(tmp_path / "b.json", routed_experts_s=0.007, expert_pick=1.5), MODEL)
    with pytest.raises(KvbenchError, match="'routed_experts_s' needs an 'expert_pick' > 0"):
        load_cost_model(write(tmp_path / "c.json", routed_experts_s=0.007), MODEL)
    with pytest.raises(
        KvbenchError, match=r"'expert_pick' is a share of routed experts, in \[0, 1\], got -0.1"
    ):
        load_cost_model(write(tmp_path / "d.json", expert_pick=-0.1), MODEL)


def test_a_file_without_expert_terms_keeps_its_digest(tmp_path):
    """Files written before the terms existed price as they did: zeros are left out of the digest."""
    assert cost_file_digest(write(tmp_path / "old.json")) == cost_file_digest(
        write(tmp_path / "new.json", routed_experts_s=0.0, expert_pick=0.0)
    )
    assert cost_file_digest(write(tmp_path / "old.json")) != cost_file_digest(
        write(tmp_path / "priced.json", routed_experts_s=0.007, expert_pick=0.09375)
    )
