"""What a Hugging Face config.json gives kvbench's `ModelSpec`, pinned where a mutation run of
`kvbench/kvspec/` found it unpinned: OPT read from its own config.json (every field of the
preset), the keys a reader falls back on when a config leaves one out (`dtype` beside
`torch_dtype`, Gemma 3's `text_config`, the KV heads of a pre-GQA Llama, DeepSeek's shared
experts and dense layers), the keys that override a family's default (tied embeddings, Gemma's
query scale and soft caps, Gemma 3's local rotary base, a top-level `rope_theta` beside
`rope_parameters`), and every refusal's whole line (the supported families and dtypes, a
projected OPT embedding, MoE on every n-th layer, bad rotary parameters, bad layer types, a
config.json that cannot be read, decoded or parsed, or is no JSON object).

Each config is written to tmp_path as a published checkpoint writes it (or a tiny one of the same
shape); where transformers' own config class reads the same file, its values are the expected
ones. docs/MUTATION.md says why such tests exist; the mutants they kill, and those that are
equivalent, are in results/mutation/kvspec/.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from kvbench.kvspec.config_json import ConfigKeys, json_kind
from kvbench.kvspec.hf import read_model_config
from kvbench.kvspec.model import ModelSpec, MoeShape
from kvbench.modeling.hf_config import read_checkpoint_spec
from kvbench.models import MODELS
from tests.test_models_hf_config import folder_with

# facebook/opt-125m config.json (the keys kvbench reads, and a few it does not)
OPT_125M = {
    "architectures": ["OPTForCausalLM"], "model_type": "opt", "activation_function": "relu",
    "do_layer_norm_before": True, "ffn_dim": 3072, "hidden_size": 768, "max_position_embeddings": 2048,
    "num_attention_heads": 12, "num_hidden_layers": 12, "torch_dtype": "float16", "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}  # fmt: skip
# huggyllama/llama-7b config.json: written before grouped-query attention, no num_key_value_heads
LLAMA_7B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 2048,
    "num_attention_heads": 32, "num_hidden_layers": 32, "rms_norm_eps": 1e-06, "torch_dtype": "float16",
    "vocab_size": 32000,
}  # fmt: skip
# Qwen/Qwen3-0.6B config.json: the LM head is the embedding
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
    "sliding_window": None, "use_sliding_window": False, "max_window_layers": 28,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 151936,
}  # fmt: skip
# google/gemma-2-9b config.json
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
    "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "torch_dtype": "bfloat16", "vocab_size": 256000,
}  # fmt: skip
# google/gemma-3-1b-pt config.json
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
    "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "sliding_window": 512, "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 256, "attn_logit_softcapping": None, "final_logit_softcapping": None,
    "torch_dtype": "bfloat16", "vocab_size": 262144,
}  # fmt: skip
# google/gemma-3-27b-pt config.json: its text_config scales queries by 168 (hidden / heads), not
# by its head_dim of 128; the rest is Gemma3TextConfig's defaults
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
        "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
    "torch_dtype": "bfloat16",
}  # fmt: skip
# deepseek-ai/DeepSeek-V2-Lite config.json
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "max_position_embeddings": 163840, "rope_theta": 10000, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 102400,
}  # fmt: skip
TINY = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 1024,
}  # fmt: skip


def read(tmp_path: Path, config: object, name: str = "ckpt") -> ModelSpec:
    return read_model_config(folder_with(tmp_path, config, name))


def refusal(tmp_path: Path, config: object, name: str = "bad", reader=read_model_config) -> str:
    """The one line reading `config` raises, after its `--model FOLDER: config.json` head."""
    folder = folder_with(tmp_path, config, name)
    with pytest.raises(KvbenchError) as error:
        reader(folder)
    message = str(error.value)
    head = f"--model {folder}: config.json"
    assert message.startswith(head) and "\n" not in message
    return message[len(head) :]


def without(config: dict, *keys: str) -> dict:
    return {k: v for k, v in config.items() if k not in keys}


def transformers_config(model_type: str, config: dict):
    """transformers' own config class reading the same dict (its defaults for what is absent); a
    copy, since it fills the nested rope_parameters in place."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **copy.deepcopy(without(config, "model_type")))


# ---------------------------------------------------------------- OPT and the shape of a model


def test_an_opt_config_gives_its_preset_exactly_with_or_without_word_embed_proj_dim(tmp_path):
    """OPT is read by its own branch: ffn_dim for the feed-forward width, one KV head per head.
    Every field of the spec it builds, named after the folder, is opt-125m's preset, whether the
    config writes word_embed_proj_dim (equal to hidden_size) or leaves it to its default (the
    hidden size, as OPTConfig has it)."""
    for name, config in (("given", OPT_125M), ("absent", without(OPT_125M, "word_embed_proj_dim"))):
        folder = folder_with(tmp_path, config, name)
        model = read_model_config(folder)
        assert model == replace(MODELS["opt-125m"], name=str(folder))
        assert model.family == "opt" and model.ffn == 3072 and model.kv_bytes_per_token == 12 * 2 * 768 * 2
    fp32 = read(tmp_path, {**OPT_125M, "torch_dtype": "float32"}, "fp32")
    assert fp32.dtype_bytes == 4 and fp32.kv_bytes_per_token == 12 * 2 * 768 * 4


def test_a_projected_opt_embedding_is_refused_in_one_whole_line(tmp_path):
    """opt-350m projects its 512-wide embeddings to the 1,024-wide layers, which kvbench does not
    size: the refusal names the key, its value and what it would mean."""
    config = {**OPT_125M, "hidden_size": 1024, "num_attention_heads": 16, "word_embed_proj_dim": 512}
    assert (
        refusal(tmp_path, config)
        == ": word_embed_proj_dim 512: a projected embedding (opt-350m) is not supported"
    )


def test_a_llama_written_before_grouped_query_attention_has_a_kv_head_per_head(tmp_path):
    """A Llama config.json without num_key_value_heads (LLaMA-1, early Llama 2) keeps K and V for
    every attention head, as LlamaConfig reads it: 32 KV heads of 128, 0.5 MiB a token."""
    model = read(tmp_path, LLAMA_7B)
    hf = transformers_config("llama", LLAMA_7B)
    assert model.num_kv_heads == hf.num_key_value_heads == 32
    assert model.kv_bytes_per_token == 32 * 2 * 32 * 128 * 2 == 524_288


def test_tie_word_embeddings_given_overrides_the_familys_default(tmp_path):
    """Qwen3-0.6B ties its LM head to its embeddings (Qwen3's default is untied): read from its
    config.json it is the preset, embedding parameters counted once."""
    folder = folder_with(tmp_path, QWEN3_06B)
    model = read_model_config(folder)
    assert model == replace(MODELS["qwen3-0.6b"], name=str(folder))
    assert model.tied_embeddings and model.embedding_params == 151936 * 1024
    untied = read(tmp_path, {**GEMMA2_9B, "tie_word_embeddings": False}, "gemma2")
    assert not untied.tied_embeddings  # Gemma's default is tied


def test_head_dim_given_lifts_the_rule_that_hidden_divides_by_heads(tmp_path):
    """With head_dim in the config, the attention width need not be the hidden size (as transformers
    builds q_proj from heads x head_dim): 5 heads of 32 over a hidden size of 96 read. Without
    head_dim the head size would be 96 / 5, so that config is refused in one whole line."""
    config = {**TINY, "model_type": "qwen3", "hidden_size": 96, "num_attention_heads": 5,
              "num_key_value_heads": 1, "head_dim": 32}  # fmt: skip
    model = read(tmp_path, config)
    assert (model.head_dim, model.head_size, model.num_heads) == (32, 32, 5)
    assert model.kv_bytes_per_token == 6 * 2 * 1 * 32 * 2
    message = refusal(tmp_path, without(config, "head_dim"))
    assert message == ": hidden_size 96 does not divide by num_attention_heads 5"


def test_a_key_of_another_family_does_not_change_a_model(tmp_path):
    """DeepSeek's expert keys mean nothing to a Llama (transformers' LlamaConfig ignores them):
    a Llama config that carries them is sized dense, as without them."""
    stray = {**LLAMA_7B, "n_routed_experts": 8, "moe_layer_freq": 2}
    model = read(tmp_path, stray)
    assert model.moe is None and model == replace(read(tmp_path, LLAMA_7B, "plain"), name=model.name)


# ---------------------------------------------------------------- dtype: the bytes of every entry


def test_the_newer_dtype_key_sets_the_bytes_where_torch_dtype_is_absent(tmp_path):
    """transformers 4.56 and later write `dtype` instead of `torch_dtype`: float32 there doubles
    every cache entry, as torch_dtype would."""
    model = read(tmp_path, {**without(LLAMA_7B, "torch_dtype"), "dtype": "float32"})
    assert model.dtype_bytes == 4 and model.kv_bytes_per_token == 32 * 2 * 32 * 128 * 4


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_gemma3_text_config_s_own_dtype_wins_over_the_checkpoint_s(tmp_path, key):
    """A multimodal Gemma 3 checkpoint may give its language model a dtype of its own (either
    key) inside text_config: that one sizes the cache, not the top-level bfloat16."""
    config = {**GEMMA3_27B, "text_config": {**GEMMA3_27B["text_config"], key: "float32"}}
    model = read(tmp_path, config)
    assert model.dtype_bytes == 4
    assert model.kv_bytes_per_token == 62 * 2 * 16 * 128 * 4
    assert read(tmp_path, GEMMA3_27B, "outer").dtype_bytes == 2


def test_an_unsupported_dtype_or_family_is_refused_naming_what_is_supported(tmp_path):
    """The refusal lists the dtypes and the model_type values kvbench reads, comma-separated."""
    message = refusal(tmp_path, {**LLAMA_7B, "torch_dtype": "int8"})
    assert message == ": torch_dtype 'int8' is not supported (one of: float16, bfloat16, float32)"
    message = refusal(tmp_path, {**LLAMA_7B, "model_type": "gpt2"}, "gpt2")
    assert message == (
        ": unsupported architecture 'gpt2' (model_type; one of: opt, llama, mistral, qwen2, qwen3, "
        "gemma2, gemma3, gemma3_text, deepseek_v2, deepseek_v3)"
    )


# ---------------------------------------------------------------- Gemma: query scale, soft caps


def test_gemma2_without_soft_cap_keys_caps_as_transformers_defaults_do(tmp_path):
    """Gemma2Config caps attention scores at 50 and the final logits at 30 where the config
    leaves the keys out: a decoded Gemma 2 computes with those caps."""
    config = without(GEMMA2_9B, "attn_logit_softcapping", "final_logit_softcapping")
    model = read(tmp_path, config)
    hf = transformers_config("gemma2", config)
    assert (model.attn_softcap, model.final_softcap) == (
        hf.attn_logit_softcapping,
        hf.final_logit_softcapping,
    )
    assert (model.attn_softcap, model.final_softcap) == (50.0, 30.0)


def test_gemma2_soft_caps_given_or_null_are_read_as_written(tmp_path):
    """A cap given is that cap; a null one (written to switch capping off) is no capping (0),
    as transformers reads it (None); Gemma 3, uncapped by default, caps where its config says."""
    model = read(tmp_path, {**GEMMA2_9B, "attn_logit_softcapping": 40.0, "final_logit_softcapping": 20.0})
    assert (model.attn_softcap, model.final_softcap) == (40.0, 20.0)
    nulls = {**GEMMA2_9B, "attn_logit_softcapping": None, "final_logit_softcapping": None}
    assert transformers_config("gemma2", nulls).attn_logit_softcapping is None
    model = read(tmp_path, nulls, "nulls")
    assert (model.attn_softcap, model.final_softcap) == (0.0, 0.0)
    model = read(
        tmp_path, {**GEMMA3_1B, "attn_logit_softcapping": 40.0, "final_logit_softcapping": 20.0}, "g3"
    )
    assert (model.attn_softcap, model.final_softcap) == (40.0, 20.0)
    assert (read(tmp_path, GEMMA3_1B, "g3plain").attn_softcap, MODELS["gemma-3-1b"].attn_softcap) == (
        0.0,
        0.0,
    )


def test_a_bad_soft_cap_is_refused_naming_the_file_and_the_key(tmp_path):
    message = refusal(tmp_path, {**GEMMA2_9B, "attn_logit_softcapping": -1})
    assert message == ": attn_logit_softcapping must be a number > 0, got -1"
    message = refusal(tmp_path, {**GEMMA2_9B, "final_logit_softcapping": "30"}, "final")
    assert message == ": final_logit_softcapping must be a number > 0, got '30'"


def test_gemma3_27b_scales_queries_by_its_query_pre_attn_scalar_not_its_head_dim(tmp_path):
    """Gemma 3 27B's heads are 128 wide but its scores are scaled by 168^-1/2 (query_pre_attn_scalar,
    as Gemma3TextConfig reads it); where the scalar is the head size, 0 says "head_dim's"."""
    model = read(tmp_path, GEMMA3_27B)
    hf = transformers_config("gemma3_text", GEMMA3_27B["text_config"])
    assert (model.head_dim, model.query_scale) == (hf.head_dim, hf.query_pre_attn_scalar) == (128, 168.0)
    assert read(tmp_path, GEMMA3_1B, "1b").query_scale == 0.0  # 256: its head_dim
    gemma2 = read(tmp_path, {**GEMMA2_9B, "query_pre_attn_scalar": 224}, "g2")  # 3,584 / 16
    assert gemma2.query_scale == 224.0


# ---------------------------------------------------------------- rotary bases


def test_a_llama_without_rope_theta_takes_transformers_default_base(tmp_path):
    """No rope_theta and no rope_parameters: LlamaConfig's base, 10,000 (1,000,000 is Gemma 3's)."""
    model = read(tmp_path, LLAMA_7B)
    hf = transformers_config("llama", LLAMA_7B)
    assert model.rope_theta == hf.rope_parameters["rope_theta"] == 10_000.0


def test_a_top_level_rope_theta_holds_beside_rope_parameters_without_one(tmp_path):
    """A config.json may keep rope_theta at the top and its scaling in rope_parameters (transformers
    folds the top-level base into them): the base is the top-level one, not the default."""
    config = {**LLAMA_7B, "rope_theta": 500000.0, "max_position_embeddings": 131072}
    config["rope_parameters"] = {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }  # fmt: skip
    model = read(tmp_path, config)
    assert model.rope_theta == transformers_config("llama", config).rope_parameters["rope_theta"] == 500000.0
    gemma = {**GEMMA3_1B, "rope_theta": 2e6, "rope_local_base_freq": 20000.0}
    gemma["rope_parameters"] = {"full_attention": {"rope_type": "default"}, "sliding_attention": {}}
    model = read(tmp_path, gemma, "gemma")
    assert (model.rope_theta, model.local_rope_theta) == (2e6, 20000.0)


def test_a_base_in_rope_parameters_wins_over_a_top_level_one_as_in_transformers(tmp_path):
    """A config.json that writes a base twice, at the top and in rope_parameters, rotates with the
    nested one in transformers (its config classes fold the top-level key in only where the
    nested object names none); read the other way, a decoded model would rotate every position
    with another base than the checkpoint's and no size would show it. The sizing reader and the
    decoded Llama's reader agree."""
    config = {**LLAMA_7B, "rope_theta": 500000.0}
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0}
    hf = transformers_config("llama", config).rope_parameters["rope_theta"]
    assert read(tmp_path, config).rope_theta == hf == 1_000_000.0
    assert read_checkpoint_spec(folder_with(tmp_path, config, "decoded")).rope_theta == hf
    gemma = {**GEMMA3_1B, "rope_theta": 3e6, "rope_local_base_freq": 20000.0}
    gemma["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": 2e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
    }
    hf = transformers_config("gemma3_text", gemma).rope_parameters
    model = read(tmp_path, gemma, "gemma")
    assert model.rope_theta == hf["full_attention"]["rope_theta"] == 2e6
    assert model.local_rope_theta == hf["sliding_attention"]["rope_theta"] == 5000.0
    # Gemma 3 keeps its bases per layer type: a flat object is read for neither, and a null
    # layer type's entry is filled in from the top-level keys, as transformers does
    flat = {**gemma, "rope_parameters": {"rope_type": "default", "rope_theta": 2e6}}
    hf = transformers_config("gemma3_text", flat).rope_parameters
    model = read(tmp_path, flat, "flat")
    assert model.rope_theta == hf["full_attention"]["rope_theta"] == 3e6
    assert model.local_rope_theta == hf["sliding_attention"]["rope_theta"] == 20000.0
    null = {**gemma, "rope_parameters": {"full_attention": {"rope_theta": 2e6}, "sliding_attention": None}}
    hf = transformers_config("gemma3_text", null).rope_parameters
    assert read(tmp_path, null, "null").local_rope_theta == hf["sliding_attention"]["rope_theta"] == 20000.0


def test_gemma3_local_rotary_base_from_rope_local_base_freq_or_its_default(tmp_path):
    """Gemma 3's sliding layers rotate with rope_local_base_freq where given; a rope_parameters
    whose sliding_attention names no base gives Gemma3TextConfig's 10,000, exactly."""
    model = read(tmp_path, {**GEMMA3_1B, "rope_local_base_freq": 20000.0})
    assert model.local_rope_theta == 20000.0
    nested = {**without(GEMMA3_1B, "rope_theta", "rope_local_base_freq")}
    nested["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": 2_000_000.0},
        "sliding_attention": {"rope_type": "default"},
    }
    hf = transformers_config("gemma3_text", nested).rope_parameters
    model = read(tmp_path, nested, "nested")
    assert model.local_rope_theta == hf["sliding_attention"]["rope_theta"] == 10_000.0
    assert model.rope_theta == hf["full_attention"]["rope_theta"] == 2_000_000.0


@pytest.mark.parametrize(
    ("rope_parameters", "line"),
    [
        (
            {"full_attention": 5, "sliding_attention": {"rope_theta": 10000.0}},
            ": rope_parameters must hold objects, got {'full_attention': 5, 'sliding_attention': "
            "{'rope_theta': 10000.0}}",
        ),
        (
            {"full_attention": {"rope_type": "default", "rope_theta": -1}, "sliding_attention": {}},
            ": rope_parameters: rope_theta must be a number > 0, got -1",
        ),
        (
            {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 0}},
            ": rope_parameters.sliding_attention: rope_theta must be a number > 0, got 0",
        ),
    ],
)
def test_bad_rope_parameters_are_refused_in_one_whole_line(tmp_path, rope_parameters, line):
    config = {**without(GEMMA3_1B, "rope_theta", "rope_local_base_freq"), "rope_parameters": rope_parameters}
    assert refusal(tmp_path, config) == line


# ---------------------------------------------------------------- DeepSeek's experts


def test_deepseek_without_shared_experts_or_dense_layers_has_none(tmp_path):
    """DeepSeek's own configuration code (the checkpoint's auto_map) defaults n_shared_experts to
    None (no shared expert) and first_k_dense_replace to 0 (every layer MoE); null keys read so."""
    config = {**DEEPSEEK_V2_LITE, "n_shared_experts": None, "first_k_dense_replace": None}
    model = read(tmp_path, config)
    assert model.moe == MoeShape(experts=64, shared_experts=0, expert_ffn=1408, dense_layers=0, top_k=6)
    assert model.moe == replace(MODELS["deepseek-v2-lite"].moe, shared_experts=0, dense_layers=0)


def test_moe_on_every_nth_layer_is_refused_in_one_whole_line(tmp_path):
    message = refusal(tmp_path, {**DEEPSEEK_V2_LITE, "moe_layer_freq": 2})
    assert message == ": moe_layer_freq 2: MoE on every n-th layer only is not supported"


# ---------------------------------------------------------------- other refusals, whole


def test_layer_types_of_the_wrong_length_are_refused_listing_the_layer_kinds(tmp_path):
    message = refusal(tmp_path, {**GEMMA2_9B, "layer_types": ["sliding_attention"] * 41})
    assert message == (
        f": layer_types must list 42 of full_attention, sliding_attention (one per layer), got "
        f"{['sliding_attention'] * 41!r:.120}"
    )


def test_a_number_must_be_above_zero_not_zero(tmp_path):
    """An epsilon or a rotary base of 0 is no value (a division by zero later): refused."""
    assert refusal(tmp_path, {**LLAMA_7B, "rms_norm_eps": 0}) == ": rms_norm_eps must be a number > 0, got 0"
    assert (
        refusal(tmp_path, {**LLAMA_7B, "rope_theta": 0.0}, "r")
        == ": rope_theta must be a number > 0, got 0.0"
    )


def test_a_decoded_llama_with_another_activation_is_refused_naming_the_one_supported(tmp_path):
    """The checkpoint reader checks the keys of a decoded model's arithmetic with
    `ConfigKeys.choice`: a GELU Llama would decode wrong tokens, so it is refused."""
    message = refusal(tmp_path, {**LLAMA_7B, "hidden_act": "gelu"}, reader=read_checkpoint_spec)
    assert message == ": hidden_act 'gelu' is not supported (only 'silu')"
    assert read_checkpoint_spec(folder_with(tmp_path, LLAMA_7B, "silu")).num_kv_heads == 32


@pytest.mark.parametrize(
    ("text", "kind"),
    [("null", "null"), ('"llama"', "string"), ("true", "boolean"), ("7", "number"), ("2.5", "number"),
     ("[]", "list")],
)  # fmt: skip
def test_a_config_json_that_is_no_object_is_refused_naming_what_it_is(tmp_path, text, kind):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    with pytest.raises(KvbenchError) as error:
        read_model_config(folder)
    assert str(error.value) == f"--model {folder}: config.json: expected a JSON object, got a JSON {kind}"


def test_json_kind_names_each_json_type():
    """The kind names every config.json reader's refusals share (`kvbench.modeling` too)."""
    kinds = [json_kind(v) for v in (None, "a", False, 1, 1.5, [], {})]
    assert kinds == ["null", "string", "boolean", "number", "number", "list", "object"]


def test_a_config_json_that_cannot_be_read_decoded_or_parsed_is_one_whole_line(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = folder / "config.json"
    config.write_bytes(b'{"model_type": "\xff"}')
    with pytest.raises(KvbenchError) as error:
        read_model_config(folder)
    assert str(error.value) == f"--model {folder}: config.json is not UTF-8 text (invalid start byte)"
    config.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(KvbenchError) as error:
        read_model_config(folder)
    assert str(error.value) == f"--model {folder}: config.json nests too deeply to read"


@pytest.mark.skipif(not Path("/proc/self/mem").is_file(), reason="needs Linux's /proc/self/mem")
def test_a_config_json_whose_read_fails_is_named_with_the_reason(tmp_path):
    """A config.json that is a file but fails to read (here a link to /proc/self/mem, whose first
    page is unmapped: EIO, even for root) is one line with the system's reason."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    os.symlink("/proc/self/mem", folder / "config.json")
    with pytest.raises(KvbenchError) as error:
        read_model_config(folder)
    assert str(error.value) == f"--model {folder}: cannot read config.json (Input/output error)"


def test_config_keys_choice_refuses_any_other_value_in_one_whole_line():
    keys = ConfigKeys({"hidden_act": "gelu"}, "--model m: config.json")
    with pytest.raises(KvbenchError) as error:
        keys.choice("hidden_act", "silu")
    assert str(error.value) == "--model m: config.json: hidden_act 'gelu' is not supported (only 'silu')"
    keys.choice("activation_function", "relu")  # absent: the supported value


# ---------------------------------------------------------------- ModelSpec's window layers


def test_a_window_of_one_token_and_a_single_window_layer_are_valid():
    """A 1-token window is a window (each token attends to itself only), and one sliding layer,
    first or last, is a valid placement."""
    one = ModelSpec("w1", "mistral", 4, 64, 4, 4, 128, 512, 1024, window=1, window_layers=(0, 1, 2, 3))
    assert one.full_bytes_per_token == 0 and one.kv_bytes_held(100) == 4 * 2 * 4 * 16 * 2  # 1 token kept
    for index in (0, 3):
        single = ModelSpec("s", "mistral", 4, 64, 4, 4, 128, 512, 1024, window=8, window_layers=(index,))
        assert single.window_bytes_per_token == 2 * 4 * 16 * 2


@pytest.mark.parametrize(
    ("window", "layers"), [(8, (0, 1, 4)), (8, (2, 4)), (8, (1, 1)), (8, (2, 1)), (8, (-1, 0)), (0, (0,))]
)
def test_window_layers_outside_the_model_or_unsorted_or_of_no_window_are_refused(window, layers):
    """Every index of a window layer lies in 0 .. num_layers - 1, sorted, once, and the window
    holds at least one token."""
    with pytest.raises(ValueError) as error:
        ModelSpec("m", "mistral", 4, 64, 4, 4, 128, 512, 1024, window=window, window_layers=layers)
    assert str(error.value) == f"m: window layers {layers} of window {window}"
