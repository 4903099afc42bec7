"""Rotary scaling (YaRN and Llama 3.1's "llama3") against transformers, on the CPU.

First the pieces, number for number: the frequencies and the cos/sin attention factor of each
type and variant (transformers' `ROPE_INIT_FUNCTIONS`), queries and keys rotated by both
layouts (halves for Llama and Qwen, pairs for DeepSeek), DeepSeek's softmax scale with
mscale_all_dim, and the Triton rotation (interpreted) with the factor applied after it. Then
whole models: tiny Llama, Qwen2 and DeepSeek-V2 checkpoints whose config.json sets the scaling,
loaded through `load_checkpoint`, with transformers' logits (prefill and decode) and greedy
tokens; the same weights with plain frequencies give other logits, so the check can fail.
Last, the config.json spellings read, and the types kvbench does not compute refused in one line
naming the key.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from kernels.reference import rotary_ref  # noqa: E402
from kvbench.errors import KvbenchError  # noqa: E402
from kvbench.kvspec.model import RopeScaling  # noqa: E402
from kvbench.modeling import ops, rope  # noqa: E402
from kvbench.modeling.arena import KVArena  # noqa: E402
from kvbench.modeling.attention import AttentionMetadata  # noqa: E402
from kvbench.modeling.hf_config import spec_from_hf_config  # noqa: E402
from kvbench.modeling.mla import MLAttention, rotary_pairs  # noqa: E402
from kvbench.modeling.rope_config import read_rope_scaling  # noqa: E402
from kvbench.modeling.weights import empty_model, load_checkpoint  # noqa: E402
from tests.support import INTERPRETED  # noqa: E402
from tests.test_families import compare  # noqa: E402
from tests.test_models_hf_config import DEEPSEEK_V2_LITE, LLAMA_31_8B  # noqa: E402

CPU = torch.device("cpu")
THETA = 10000.0
# head_dim 32; pretrained on 2,048 positions, extended to 8,192: YaRN's ramp runs over pairs 4 to
# 11 of 16, llama3's smoothing over wavelengths 512 to 2,048 (pairs 8 to 11)
LLAMA = dict(
    vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=False,
)  # fmt: skip
ORIGINAL = {"original_max_position_embeddings": 2048}
SCALINGS = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, **ORIGINAL},  # Qwen2.5's: cos/sin x (0.1 ln 4 + 1)
    "yarn-deepseek": {
        "rope_type": "yarn",
        "factor": 4.0,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        **ORIGINAL,
    },
    "yarn-mscales": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5, **ORIGINAL},
    "yarn-untruncated": {
        "rope_type": "yarn",
        "factor": 4.0,
        "beta_fast": 16,
        "beta_slow": 2,
        "truncate": False,
        **ORIGINAL,
    },
    "yarn-given-factor": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.8, **ORIGINAL},
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        **ORIGINAL,
    },
}
POSITIONS = torch.tensor([0, 1, 7, 100, 2047, 2048, 5000, 8191])


def llama_config(scaling: dict):
    return transformers.LlamaConfig(**LLAMA, rope_parameters={**scaling, "rope_theta": THETA})


def read(config) -> RopeScaling:
    scaling = read_rope_scaling(config.to_dict(), "test")
    assert scaling is not None
    return scaling


@pytest.mark.parametrize("name", SCALINGS)
def test_frequencies_and_attention_factor_equal_transformers(name):
    config = llama_config(SCALINGS[name])
    expected, factor = ROPE_INIT_FUNCTIONS[SCALINGS[name]["rope_type"]](config, CPU)
    scaling = read(config)
    freqs = ops.inv_freq(32, THETA, CPU, scaling)
    assert torch.allclose(freqs, expected, rtol=1e-6, atol=0)
    assert rope.attention_factor(scaling) == pytest.approx(factor, rel=1e-12)
    plain = ops.inv_freq(32, THETA, CPU)
    assert torch.equal(freqs[:4], plain[:4]) and (freqs[-4:] < plain[-4:] / 3.9).all()  # kept; / factor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["yarn", "yarn-mscales", "llama3"])
def test_rotated_halves_equal_transformers(name, dtype):
    """Llama's and Qwen's layout: transformers' cos and sin (factor included, rounded to the
    dtype) applied to q and k, against `ops.rotary` on the CPU."""
    from transformers.models.llama import modeling_llama

    config = llama_config(SCALINGS[name])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(len(POSITIONS), 4, 32, generator=gen).to(dtype)  # [T, H, D]
    k = torch.randn(len(POSITIONS), 2, 32, generator=gen).to(dtype)
    cos, sin = modeling_llama.LlamaRotaryEmbedding(config)(q, POSITIONS[None, :])  # [1, T, D]
    q_ref, k_ref = modeling_llama.apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin
    )
    scaling = read(config)
    bound = 1e-5 if dtype == torch.float32 else 1e-2
    assert (
        ops.rotary(q, POSITIONS, THETA, scaling).float() - q_ref[0].transpose(0, 1).float()
    ).abs().max() < bound
    assert (
        ops.rotary(k, POSITIONS, THETA, scaling).float() - k_ref[0].transpose(0, 1).float()
    ).abs().max() < bound
    assert (ops.rotary(q, POSITIONS, THETA).float() - q_ref[0].transpose(0, 1).float()).abs().max() > 0.1


DEEPSEEK = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=163840, rms_norm_eps=1e-6,
    kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
    n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, routed_scaling_factor=1.5,
    tie_word_embeddings=False,
)  # fmt: skip
# DeepSeek-V2-Lite's own scaling: 4,096 positions x 40, equal mscales (cos/sin x 1), softmax x mscale^2;
# on rope pairs of 8 the ramp runs over pairs 1 to 3
V2_LITE_YARN = {
    "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
    "mscale": 0.707, "mscale_all_dim": 0.707,
}  # fmt: skip


def deepseek_config(scaling: dict = V2_LITE_YARN, q_lora_rank: int | None = None):
    return transformers.DeepseekV2Config(
        **DEEPSEEK, rope_theta=THETA, rope_scaling=dict(scaling), q_lora_rank=q_lora_rank
    )


@pytest.mark.parametrize(
    "scaling", [V2_LITE_YARN, {**V2_LITE_YARN, "mscale": 1.0}], ids=["v2-lite", "mscales"]
)
def test_rotated_pairs_and_softmax_scale_equal_transformers(scaling):
    """DeepSeek's layout (pairs as complex numbers, x the attention factor) and its softmax
    scale qk_head_dim^-1/2 x mscale(factor, mscale_all_dim)^2."""
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as ds

    config = deepseek_config(scaling)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(len(POSITIONS), 4, 8, generator=gen)  # [T, H, rope]
    k = torch.randn(len(POSITIONS), 1, 8, generator=gen)
    turns = ds.DeepseekV2RotaryEmbedding(config)(q, POSITIONS[None, :])  # [1, T, rope / 2]
    q_ref, k_ref = ds.apply_rotary_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], turns)
    spec = spec_from_hf_config(config.to_dict(), "tiny")
    assert spec.rope_scaling == read(config)
    assert torch.allclose(
        rotary_pairs(q, POSITIONS, THETA, spec.rope_scaling), q_ref[0].transpose(0, 1), atol=1e-5
    )
    assert torch.allclose(
        rotary_pairs(k, POSITIONS, THETA, spec.rope_scaling), k_ref[0].transpose(0, 1), atol=1e-5
    )
    expected = ds.DeepseekV2Attention(config, layer_idx=0).scaling
    assert MLAttention(spec, device="meta").scale == pytest.approx(expected, rel=1e-12)
    assert expected > 1.5 * (16 + 8) ** -0.5  # mscale(40, 0.707)^2 = 1.59


@INTERPRETED
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"]
)
def test_the_triton_rotation_with_the_factor_after_it_equals_the_reference(dtype):
    """The GPU path (`ops.rotary_fused`: the kernel, then x attention factor), interpreted on the
    CPU, against the reference that scales cos and sin: within two roundings of the dtype at the
    largest value (measured: one, 0.03 on values up to 4.3 in bf16)."""
    scaling = read(llama_config(SCALINGS["yarn"]))
    factor = rope.attention_factor(scaling)
    freqs = ops.inv_freq(32, THETA, CPU, scaling)
    x = torch.randn(len(POSITIONS), 5, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = rotary_ref(x, POSITIONS, freqs, factor).float()
    bound = 2 * torch.finfo(dtype).eps * expected.abs().max()
    assert (ops.rotary_fused(x.clone(), POSITIONS, freqs, factor).float() - expected).abs().max() <= bound
    assert (ops.rotary_fused(x.clone(), POSITIONS, freqs, 1.0).float() - expected).abs().max() > 0.1


def reference(folder, config):
    """A random transformers model of `config` (norm scales perturbed), saved to `folder` and
    reloaded as its files say."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
            if name.endswith("mlp.gate.weight"):  # a decisive router: no near-ties between experts
                param.copy_(torch.randn_like(param))
    model.save_pretrained(folder, safe_serialization=True)
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, attn_implementation="eager"
    ).eval()  # fmt: skip


def last_logits(model, tokens: list[int], lo: int, arena: KVArena) -> torch.Tensor:
    """One sequence held in arena slots [0, len(tokens)): positions [lo, len) fed, positions
    before them read from the arena; the last position's logits `[V]`."""
    hi = len(tokens)
    meta = AttentionMetadata(
        hi - lo > 1, torch.arange(lo, hi), torch.tensor([0, hi - lo]), torch.tensor([hi], dtype=torch.int32),
        starts=torch.tensor([0]), max_new=hi - lo,
    )  # fmt: skip
    with torch.no_grad():
        return model(torch.tensor(tokens[lo:hi]), torch.arange(lo, hi), meta, arena)[0]


def greedy(model, prompt: list[int], steps: int) -> list[int]:
    """kvbench's greedy tokens: the prompt prefilled, then one token a step, through the arena."""
    arena = KVArena(model.spec, 64, torch.float32, CPU)
    arena.fill(float("nan"))
    tokens, done = list(prompt), 0
    for _ in range(steps):
        logits = last_logits(model, tokens, done, arena)
        done = len(tokens)
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt) :]


def greedy_reference(ref, prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(ref(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


MODELS = {
    "llama-yarn": lambda: llama_config(SCALINGS["yarn"]),
    "llama-llama3": lambda: llama_config({**SCALINGS["llama3"], "original_max_position_embeddings": 64}),
    "qwen2-yarn": lambda: transformers.Qwen2Config(
        **LLAMA, rope_theta=THETA, rope_scaling={"type": "yarn", "factor": 4.0, **ORIGINAL}
    ),  # Qwen2.5's long-context setting (saved as rope_parameters, as transformers 5 writes it)
    "deepseek-yarn": deepseek_config,
    "deepseek-q-lora-yarn": lambda: deepseek_config(q_lora_rank=32),
}


@pytest.mark.parametrize("kind", MODELS)
def test_a_scaled_checkpoint_decodes_as_transformers_does(tmp_path, kind):
    ref = reference(tmp_path / kind, MODELS[kind]())
    model = load_checkpoint(tmp_path / kind, torch.float32, CPU)
    assert model.spec.rope_scaling is not None
    compare(ref, model, paged=True)  # logits of a chunked prefill and decode steps, within 1e-4
    prompt = torch.randint(0, 512, (10,), generator=torch.Generator().manual_seed(2)).tolist()
    tokens = greedy(model, prompt, 20)
    assert tokens == greedy_reference(ref, prompt, 20)
    plain = empty_model(replace(model.spec, rope_scaling=None), torch.float32, CPU)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = ref(torch.tensor([prompt + tokens])).logits[0, -1]
    unscaled = last_logits(plain, prompt + tokens, 0, KVArena(plain.spec, 64, torch.float32, CPU))
    assert (unscaled - expected).abs().max() > 4e-4  # plain frequencies: over 4x what `compare` allows


def test_both_spellings_and_published_configs_read_the_same_scaling():
    lite = spec_from_hf_config({**DEEPSEEK_V2_LITE, "rope_scaling": V2_LITE_YARN}, "lite")
    assert lite.rope_scaling == RopeScaling("yarn", 40.0, 4096, 32.0, 1.0, mscale=0.707, mscale_all_dim=0.707)
    nested = {
        **{k: v for k, v in V2_LITE_YARN.items() if k != "type"},
        "rope_type": "yarn",
        "rope_theta": 1e4,
    }
    assert spec_from_hf_config({**DEEPSEEK_V2_LITE, "rope_parameters": nested}, "lite") == lite
    llama31 = spec_from_hf_config(LLAMA_31_8B, "llama")
    assert llama31.rope_scaling == RopeScaling("llama3", 8.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0)
    new = {k: v for k, v in LLAMA_31_8B.items() if k not in ("rope_scaling", "rope_theta")}
    new["rope_parameters"] = {**LLAMA_31_8B["rope_scaling"], "rope_theta": 500000.0}
    assert spec_from_hf_config(new, "llama") == llama31
    qwen = {
        **LLAMA,
        "model_type": "qwen2",
        "rope_scaling": {"type": "yarn", "factor": 4.0},
    }  # no original length
    assert spec_from_hf_config(qwen, "q").rope_scaling == RopeScaling("yarn", 4.0, 8192)
    top = {**qwen, "original_max_position_embeddings": 2048}  # Phi-3's place wins, as in transformers
    assert spec_from_hf_config(top, "q").rope_scaling.original_max_len == 2048
    derived = {**qwen, "rope_scaling": {"type": "yarn", "factor": None, **ORIGINAL}}  # null: the ratio
    assert spec_from_hf_config(derived, "q").rope_scaling.factor == 4.0
    assert spec_from_hf_config({**qwen, "rope_scaling": {"type": "default"}}, "q").rope_scaling is None
    assert spec_from_hf_config({**LLAMA_31_8B, "rope_scaling": None}, "llama").rope_scaling is None


def llama_json(**keys) -> dict:
    return {**LLAMA, "model_type": "llama", "rope_theta": THETA, **keys}


def yarn(**keys) -> dict:
    return {"type": "yarn", "factor": 4.0, **keys}


GEMMA3_JSON = {**LLAMA, "model_type": "gemma3_text", "head_dim": 32, "sliding_window": 8}
PER_LAYER = {
    "full_attention": {"rope_type": "linear", "factor": 8.0},
    "sliding_attention": {"rope_type": "default"},
}
REFUSED = {
    "dynamic": (
        llama_json(rope_scaling={"type": "dynamic", "factor": 2.0}),
        "rope_scaling: rope type 'dynamic'",
    ),
    "longrope-new-key": (
        llama_json(rope_parameters={"rope_type": "longrope", "rope_theta": THETA}),
        "rope_parameters",
    ),
    "qwen-linear": (
        llama_json(model_type="qwen2", rope_scaling={"type": "linear", "factor": 2}),
        "rope_scaling",
    ),
    "not-an-object": (llama_json(rope_scaling="yarn"), "rope_scaling must be an object"),
    "bad-factor": (llama_json(rope_scaling=yarn(factor="big")), "rope_scaling: factor"),
    "bad-beta": (llama_json(rope_scaling=yarn(beta_fast=-1)), "beta_fast"),
    "bad-truncate": (llama_json(rope_scaling=yarn(truncate=1)), "truncate"),
    "partial": (llama_json(rope_scaling=yarn(partial_rotary_factor=0.5)), "partial_rotary_factor"),
    "llama3-incomplete": (
        llama_json(rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}),
        "lacks 'low_freq_factor'",
    ),
    "llama3-bands": (
        llama_json(rope_scaling={**LLAMA_31_8B["rope_scaling"], "high_freq_factor": 1.0}),
        "high_freq_factor",
    ),
    "gemma-yarn": ({**GEMMA3_JSON, "rope_scaling": yarn()}, "rope_scaling: rope type 'yarn'"),
    "gemma-per-layer": ({**GEMMA3_JSON, "rope_parameters": PER_LAYER}, "rope_parameters.full_attention"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_scaling_kvbench_does_not_compute_is_refused_in_one_line_naming_the_key(case):
    config, named = REFUSED[case]
    with pytest.raises(KvbenchError) as caught:
        spec_from_hf_config(config, "tiny")
    message = str(caught.value)
    assert message.startswith("--model tiny: config.json") and named in message and "\n" not in message
