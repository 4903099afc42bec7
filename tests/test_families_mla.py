"""DeepSeek-V2 (MLA and experts) decoded by kvbench against transformers, on the CPU in fp32.

A tiny DeepseekV2ForCausalLM (3 layers: one dense, two of 8 routed experts choosing 2 plus 2
shared ones; latent 16, rope 8, nope 16, v 16) with every weight random, saved as safetensors
and loaded through `load_checkpoint`; then the prefill in two chunks and the decode steps of
`tests/test_families.py`, paged and contiguous, logits within 1e-4. The arena holds only the
latent and rope key of each token (poisoned with NaN elsewhere), so matching logits show that
the absorbed attention needs nothing else.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kvbench.errors import KvbenchError  # noqa: E402
from kvbench.modeling.arena import KVArena  # noqa: E402
from kvbench.modeling.hf_config import spec_from_hf_config  # noqa: E402
from kvbench.modeling.weights import load_checkpoint  # noqa: E402
from kvbench.models import MlaShape, ModelSpec, MoeShape  # noqa: E402
from tests.test_families import compare  # noqa: E402

CPU = torch.device("cpu")
TINY = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128, rms_norm_eps=1e-6,
    kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8,
    n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1, routed_scaling_factor=1.5,
    tie_word_embeddings=False, rope_theta=5000.0,
)  # fmt: skip


def reference(tmp_path, q_lora_rank: int | None):
    """The transformers model as its files say (saved, reloaded), and the folder."""
    torch.manual_seed(0)
    config = transformers.DeepseekV2Config(**TINY, q_lora_rank=q_lora_rank)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # transformers starts them at 1
                param.add_(torch.randn_like(param) * 0.1)
            if name.endswith("mlp.gate.weight"):  # a decisive router: no near-ties between experts
                param.copy_(torch.randn_like(param))
    folder = tmp_path / f"deepseek-v2-q{q_lora_rank}"
    model.save_pretrained(folder, safe_serialization=True)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, attn_implementation="eager"
    )
    return reloaded.eval(), folder


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("q_lora_rank", [None, 32], ids=["q_proj", "q_lora"])
def test_logits_equal_transformers_for_prefill_and_decode(tmp_path, q_lora_rank, paged):
    ref, folder = reference(tmp_path, q_lora_rank)
    model = load_checkpoint(folder, torch.float32, CPU)
    assert model.spec.family == "deepseek" and model.spec.moe.top_k == 2
    layers = model.model.layers
    assert len(layers[1].mlp.experts) == 8 and not hasattr(layers[0].mlp, "experts")  # one dense layer
    assert hasattr(layers[0].self_attn, "q_a_proj") == (q_lora_rank is not None)
    compare(ref, model, paged=paged)


def test_the_arena_holds_the_latent_and_rope_key_only(tmp_path):
    """(kv_lora_rank + qk_rope_head_dim) x layers x dtype bytes per slot, as the spec sizes it:
    16 + 8 values, not 2 x 4 heads x (16 + 8) keys and 4 x 16 values."""
    spec = spec_from_hf_config(transformers.DeepseekV2Config(**TINY).to_dict(), "tiny-deepseek")
    assert spec.decoded and spec.dtype_bytes == 2  # no dtype in the config: 16-bit
    assert spec.kv_bytes_per_token == 3 * (16 + 8) * 2
    assert KVArena(spec, 100, torch.bfloat16, CPU).nbytes == 100 * spec.kv_bytes_per_token
    arena = KVArena(spec, 100, torch.float32, CPU)
    assert arena.nbytes == 100 * 3 * (16 + 8) * 4
    assert tuple(arena.k.shape) == (3, 100, 1, 24) and arena.v.numel() == 0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model_type": "deepseek_v3"}, "model_type"),
        ({"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1}, "topk_method"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope_parameters"),
        ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, "rope_scaling"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
    ids=["v3", "grouped-top-k", "dynamic-rope", "longrope-old-key", "gelu"],
)
def test_a_config_kvbench_would_decode_wrongly_is_refused_in_one_line(tmp_path, change, named):
    """Refused when the weights load (before they are read), named in one line; the same folder
    is still sized, as `kvbench simulate --model folder` reads it."""
    import json

    from kvbench.config import resolve_model

    config = transformers.DeepseekV2Config(**TINY).to_dict() | change
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(KvbenchError, match=rf"^--model {tmp_path}: config.json.*{named}") as caught:
        load_checkpoint(tmp_path, torch.float32, CPU)
    assert "\n" not in str(caught.value)
    assert resolve_model(str(tmp_path)).kv_bytes_per_token == 3 * (16 + 8) * 2


def test_experts_without_a_top_k_are_sized_but_not_built():
    """No num_experts_per_tok: the router is unknown, so the spec sizes the model and a real
    run refuses it in one line rather than guessing how many experts a token takes."""
    from kvbench.modeling.weights import empty_model

    config = transformers.DeepseekV2Config(**TINY).to_dict() | {"num_experts_per_tok": None}
    spec = spec_from_hf_config(config, "tiny")
    assert not spec.decoded and spec.kv_bytes_per_token == 3 * (16 + 8) * 2
    with pytest.raises(KvbenchError, match=r"^--model tiny: kvbench decodes .* not run$"):
        empty_model(spec, torch.float32, CPU)


MLA_TINY = ModelSpec(
    "tiny-mla", "deepseek", 3, 64, 4, 4, 128, 512, 64, norm_eps=1e-6,
    mla=MlaShape(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
    moe=MoeShape(experts=4, shared_experts=1, expert_ffn=32, dense_layers=1, top_k=2, routed_scale=1.5),
)  # fmt: skip


def _moe_with_an_unchosen_expert(dtype: torch.dtype, device: torch.device):
    """The first MoE layer of a seeded tiny MLA model and 6 rows of positive input, expert 3
    chosen by no row and the rows choosing different mixes of the others. The router is set by
    hand, not left to the seed: random weights drawn on a GPU differ from the CPU's, and the
    choices must be the same on both."""
    from kvbench.modeling.mla import MoE
    from kvbench.modeling.weights import random_model

    model = random_model(MLA_TINY, dtype, device, seed=4)
    moe = next(m for m in model.modules() if isinstance(m, MoE))
    half = MLA_TINY.hidden // 2
    x = torch.rand(6, MLA_TINY.hidden, generator=torch.Generator().manual_seed(1))  # [T, hidden]
    x[:3, :half] *= 3.0  # rows 0-2 weigh more in the first half, rows 3-5 in the second
    x[3:, half:] *= 3.0
    x = x.to(device, dtype)
    with torch.no_grad():
        moe.gate.weight.zero_()
        moe.gate.weight[0, :half] = 1.0  # expert 0 scores the first half's sum, expert 1 the second's,
        moe.gate.weight[1, half:] = 1.0  # expert 2 their mean (always second), expert 3 -sum(x)
        moe.gate.weight[2] = 0.5
        moe.gate.weight[3] = -1.0
        chosen = torch.nn.functional.linear(x.float(), moe.gate.weight.float()).topk(2, dim=-1).indices
    assert [sorted(row) for row in chosen.tolist()] == [[0, 2]] * 3 + [[1, 2]] * 3
    return model, moe, x


def test_grouped_expert_dispatch_gives_what_the_routed_dispatch_gives():
    """The grouped dispatch (each chosen pair once, sorted by expert, two grouped matmuls) sums
    what the host-side dispatch sums, with an expert no row chose (an empty group) and a token's
    choices spread over several groups."""
    _, moe, x = _moe_with_an_unchosen_expert(torch.float32, CPU)
    with torch.no_grad():
        grouped, routed = moe(x, dispatch="grouped"), moe(x, dispatch="sparse")
        assert torch.allclose(grouped, routed, rtol=1e-5, atol=1e-7)
        alone = grouped - moe.shared_experts(x)
        assert alone.abs().max() > 1e-6  # the routed experts contribute: the check is not vacuous


def test_stacked_experts_hold_each_weight_once_and_take_later_copies():
    """Stacking makes every expert's parameters views of one tensor per projection: no weight
    is held twice, and a weight copied in after (a checkpoint loaded into the model) reaches
    the grouped dispatch."""
    _, moe, x = _moe_with_an_unchosen_expert(torch.float32, CPU)
    gate_up, down = moe._stacked
    for index, expert in enumerate(moe.experts):
        assert expert.gate_up_proj.weight.data_ptr() == gate_up[index].data_ptr()
        assert expert.down_proj.weight.data_ptr() == down[index].data_ptr()
    with torch.no_grad():
        before = moe(x, dispatch="grouped")
        moe.experts[0].down_proj.weight.mul_(2.0)  # expert 0 is chosen by some rows
        after, routed = moe(x, dispatch="grouped"), moe(x, dispatch="sparse")
    assert not torch.allclose(before, after) and torch.allclose(after, routed, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_grouped_expert_dispatch_replays_from_a_cuda_graph():
    """On a GPU in bf16 the grouped dispatch captured in a CUDA graph gives, replayed on new
    inputs, what it gives eagerly, and what the dense dispatch gives up to bf16 rounding."""
    from kvbench.modeling.mla import set_expert_dispatch

    cuda = torch.device("cuda")
    model, moe, x = _moe_with_an_unchosen_expert(torch.bfloat16, cuda)
    set_expert_dispatch(model, "grouped")
    static = x.clone()
    with torch.no_grad():
        moe(static)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe(static)
        for seed in (2, 3):
            fresh = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed)).to(cuda, x.dtype)
            static.copy_(fresh)
            graph.replay()
            eager, dense = moe(fresh, dispatch="grouped"), moe(fresh, dispatch="dense")
            assert out.equal(eager)
            assert torch.allclose(out.float(), dense.float(), rtol=2e-2, atol=2e-2)


def test_every_engine_decodes_the_same_greedy_tokens_on_an_mla_model():
    """The real engine loop on the CPU over the latent arena (poisoned with NaN), through each
    engine's addressing (extents, blocks, a prefix cache): the same greedy tokens everywhere."""
    from tests.support import greedy_tokens_by_engine

    tokens = greedy_tokens_by_engine(MLA_TINY, ("static", "orca-max", "paged", "paged-prefix"))
    assert len(set(map(tuple, tokens.values()))) == 1, f"engines disagree on greedy tokens: {tokens}"


def test_decode_steps_through_grouped_experts_give_the_same_greedy_tokens():
    """The real engine loop with the grouped expert dispatch chosen: decode steps run it (prefills
    keep the host dispatch), and every engine decodes the tokens the default dispatch does."""
    from kvbench.modeling.mla import MoE, set_expert_dispatch
    from tests.support import greedy_tokens_by_engine

    calls = []

    def grouped(model):
        set_expert_dispatch(model, "grouped")
        for moe in (m for m in model.modules() if isinstance(m, MoE)):
            run = moe._grouped
            moe._grouped = lambda *args, run=run: calls.append(1) or run(*args)

    engines = ("orca-max", "paged")
    assert greedy_tokens_by_engine(MLA_TINY, engines, grouped) == greedy_tokens_by_engine(MLA_TINY, engines)
    assert calls  # the decode steps did go through the grouped dispatch


def test_a_real_run_of_a_checkpoint_takes_the_grouped_expert_dispatch(tmp_path):
    """`kvbench run` on a DeepSeek-V2 checkpoint, `--expert-dispatch` left at `auto`: the run's
    decode steps go through the grouped dispatch (on the CPU too) and config.json records
    `grouped`; a model without experts records `dense`, as every cell before `auto` did."""
    from tests.test_cli import kvbench

    _, folder = reference(tmp_path, None)
    out = tmp_path / "run"
    proc = kvbench(
        "run", "--engine", "paged", "--model", str(folder), "--device", "cpu", "--kv-cache-gib", "0.0002",
        "--trace", "uniform:prompt=4..20,output=5..12", "--num-requests", "4", "--rate", "20",
        "--attention", "torch", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["expert_dispatch"] == "grouped"
    from kvbench.config import RunConfig, with_expert_dispatch

    for model, dispatch in (
        (str(folder), "grouped"),
        ("tiny-llama", "dense"),
        ("deepseek-v2-lite", "grouped"),
    ):
        assert (
            with_expert_dispatch(RunConfig("paged", model=model, expert_dispatch="auto")).expert_dispatch
            == dispatch
        )
    assert with_expert_dispatch(RunConfig("paged", model=str(folder))).expert_dispatch == "dense"  # as asked
    assert json.loads((out / "summary.json").read_text())["completed"] == 4
    # one session's model serves every run of a sweep: each run sets the dispatch it names
    from kvbench.config import RunConfig, resolve_model
    from kvbench.modeling.mla import MoE
    from kvbench.parallel.session import open_session
    from kvbench.real.run import run_real
    from workloads.spec import WorkloadSpec

    config = RunConfig(
        "paged", model=str(folder), workload=WorkloadSpec("uniform:prompt=4..20,output=5..12", num_requests=2,
        rate=20.0), kv_cache_gib=0.0002, device="cpu", attention="torch",
    )  # fmt: skip
    spec = resolve_model(str(folder))
    opened = open_session(str(folder), spec, tensor_parallel=1, dtype=torch.float32, device=CPU, seed=0)
    with opened as session:
        for dispatch in ("grouped", "dense", "grouped"):
            run_real(replace(config, expert_dispatch=dispatch), session=session)
            moes = [m for m in session.model.modules() if isinstance(m, MoE)]
            assert moes and {moe.small_step_dispatch for moe in moes} == {dispatch}


def test_an_arena_of_k_and_v_per_head_is_refused_in_one_line():
    """An arena laid out for K and V per head (as the vmm engine's virtual one still is) would
    be read as latents: the layer refuses it, naming the model."""
    from dataclasses import replace

    from kvbench.modeling.attention import AttentionMetadata
    from kvbench.modeling.weights import random_model

    model = random_model(MLA_TINY, torch.float32, CPU)
    arena = KVArena(replace(MLA_TINY, mla=None), 16, torch.float32, CPU)  # [L, S, 4 heads, 16]
    meta = AttentionMetadata(
        True, torch.arange(3), torch.tensor([0, 3]), torch.tensor([3], dtype=torch.int32),
        starts=torch.tensor([0]), max_new=3,
    )  # fmt: skip
    with pytest.raises(KvbenchError, match=r"^--model tiny-mla: MLA needs an arena of latent") as caught:
        model(torch.tensor([1, 2, 3]), torch.arange(3), meta, arena)
    assert "\n" not in str(caught.value)


def test_dense_expert_dispatch_gives_what_the_routed_dispatch_gives():
    """A decode step on a GPU runs every expert over every row, weighted 0 where the router did
    not choose it (capturable in a CUDA graph); a prefill dispatches each expert over its own
    rows. Both give the same output, every row having chosen a different mix of experts, one
    expert chosen by no row at all."""
    from kvbench.modeling.mla import DENSE_DISPATCH_ROWS, MoE
    from kvbench.modeling.weights import random_model
    from kvbench.real.decode_loop import MAX_GRAPH_BATCH

    assert DENSE_DISPATCH_ROWS >= MAX_GRAPH_BATCH  # every graph bucket's step dispatches densely

    model = random_model(MLA_TINY, torch.float32, CPU, seed=4)
    moe = next(m for m in model.modules() if isinstance(m, MoE))
    x = torch.rand(6, MLA_TINY.hidden, generator=torch.Generator().manual_seed(1))  # [T, hidden], > 0
    with torch.no_grad():
        moe.gate.weight[3] = -1.0  # expert 3 scores -sum(x) < -10 for every row: never chosen
        chosen = torch.nn.functional.linear(x, moe.gate.weight).topk(2, dim=-1).indices
        assert 3 not in chosen.tolist() and len({tuple(sorted(row)) for row in chosen.tolist()}) > 1
        dense, routed = moe(x, dispatch="dense"), moe(x, dispatch="sparse")
        assert torch.allclose(dense, routed, rtol=1e-5, atol=1e-9)
        assert moe(x).equal(routed)  # on the CPU the default is the routed dispatch
        alone = moe(x, dispatch="dense") - moe.shared_experts(x)
        assert alone.abs().max() > 1e-6  # the routed experts contribute: the check is not vacuous
