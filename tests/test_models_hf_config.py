"""`--model path/to/folder`: a Hugging Face config.json sized without weights, for every family
kvbench sizes. Real-shaped configs (the published checkpoints' shape keys, written here) must give
exactly the preset of the same model; tiny ones exercise each family's window rule; bad ones fail
with one line naming the file and the key."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from kvbench.kvspec.hf import read_model_config
from kvbench.models import MODELS, get_model

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-06,
    "sliding_window": None,
    "use_sliding_window": False,
    "max_window_layers": 36,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "query_pre_attn_scalar": 256,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "torch_dtype": "bfloat16",
    "vocab_size": 256000,
}
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 256,
    "torch_dtype": "bfloat16",
    "vocab_size": 262144,
}
# the multimodal checkpoint gives only the text sizes that differ from Gemma3TextConfig's defaults
GEMMA3_12B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "sliding_window": 1024,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    },
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "num_hidden_layers": 27},
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "auto_map": {"AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"},  # never run
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_shared_experts": 2,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 102400,
}
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}  # fmt: skip
REAL = {
    "qwen3-8b": QWEN3_8B, "mistral-7b": MISTRAL_7B, "gemma-2-9b": GEMMA2_9B, "gemma-3-1b": GEMMA3_1B,
    "gemma-3-12b": GEMMA3_12B, "deepseek-v2-lite": DEEPSEEK_V2_LITE, "llama-3.1-8b": LLAMA_31_8B,
}  # fmt: skip


def folder_with(tmp_path: Path, config: object, name: str = "ckpt") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("preset", REAL)
def test_a_published_config_gives_its_preset_exactly(tmp_path, preset):
    folder = folder_with(tmp_path, REAL[preset])
    assert get_model(str(folder)) == replace(MODELS[preset], name=str(folder))


def test_simulation_reads_a_folder_of_a_family_it_does_not_decode(tmp_path):
    """`kvbench simulate --model folder` resolves through the checkpoint reader, which hands the
    families kvbench only sizes to the sizing reader; building the model is refused."""
    import torch

    from kvbench.config import resolve_model
    from kvbench.modeling.weights import random_model

    folder = folder_with(tmp_path, _without(DEEPSEEK_V2_LITE, "num_experts_per_tok"))  # router unknown
    assert resolve_model(str(folder)) == get_model(str(folder))
    with pytest.raises(KvbenchError, match="kvbench decodes OPT and Llama"):
        random_model(resolve_model(str(folder)), torch.float32, torch.device("cpu"))


TINY = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 1024,
}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "window", "window_layers"),
    [
        ({"model_type": "llama"}, 0, ()),
        ({"model_type": "mistral", "sliding_window": 32}, 32, (0, 1, 2, 3, 4, 5)),
        ({"model_type": "mistral", "sliding_window": None}, 0, ()),  # v0.2 and later
        ({"model_type": "qwen2", "sliding_window": 32, "use_sliding_window": False}, 0, ()),
        (
            {"model_type": "qwen2", "sliding_window": 32, "use_sliding_window": True, "max_window_layers": 4},
            32, (4, 5),
        ),
        ({"model_type": "gemma2", "sliding_window": 32}, 32, (0, 2, 4)),
        (  # head_dim given: Gemma 3's default is 256
            {"model_type": "gemma3_text", "sliding_window": 32, "sliding_window_pattern": 3, "head_dim": 16},
            32, (0, 1, 3, 4),
        ),
        (
            {"model_type": "qwen3", "sliding_window": 32, "use_sliding_window": True,
             "layer_types": ["full_attention"] * 2 + ["sliding_attention"] * 3 + ["full_attention"]},
            32, (2, 3, 4),
        ),
    ],
)  # fmt: skip
def test_each_family_places_its_window_layers_as_transformers_does(tmp_path, extra, window, window_layers):
    model = read_model_config(folder_with(tmp_path, {**TINY, **extra}))
    assert (model.window, model.window_layers) == (window, window_layers)
    per_layer = 2 * 2 * 16 * 2
    assert model.window_bytes_per_token == len(window_layers) * per_layer
    assert model.kv_bytes_per_token == 6 * per_layer


def test_torch_dtype_sets_the_bytes_of_every_cache_entry(tmp_path):
    fp32 = read_model_config(folder_with(tmp_path, {**TINY, "model_type": "llama", "torch_dtype": "float32"}))
    assert fp32.dtype_bytes == 4 and fp32.kv_bytes_per_token == 6 * 2 * 2 * 16 * 4
    mla = read_model_config(folder_with(tmp_path, {**DEEPSEEK_V2_LITE, "torch_dtype": "float32"}, "mla"))
    assert mla.kv_bytes_per_token == 27 * 576 * 4


def test_gemma3_layer_pattern_from_the_private_key_newer_configs_write(tmp_path):
    config = {**GEMMA3_1B, "sliding_window_pattern": None, "_sliding_window_pattern": 4}
    model = read_model_config(folder_with(tmp_path, config))
    assert [i for i in range(26) if i not in model.window_layers] == [3, 7, 11, 15, 19, 23]


def test_gemma3_rotary_bases_from_rope_parameters_of_newer_configs(tmp_path):
    config = {**GEMMA3_1B, "rope_theta": None, "rope_local_base_freq": None}
    config["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": 2_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5_000.0},
    }
    model = read_model_config(folder_with(tmp_path, config))
    assert (model.rope_theta, model.local_rope_theta) == (2_000_000.0, 5_000.0)


def _without(config: dict, *keys: str) -> dict:
    return {k: v for k, v in config.items() if k not in keys}


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (_without(QWEN3_8B, "num_hidden_layers"), ["lacks 'num_hidden_layers'"]),
        ({**QWEN3_8B, "model_type": "gpt2"}, ["unsupported architecture 'gpt2'", "model_type"]),
        ({**QWEN3_8B, "head_dim": "128"}, ["head_dim must be an integer >= 1", "'128'"]),
        ({**QWEN3_8B, "num_key_value_heads": 5}, ["num_attention_heads 32", "num_key_value_heads 5"]),
        ({**QWEN3_8B, "torch_dtype": "int8"}, ["torch_dtype 'int8' is not supported"]),
        (_without(GEMMA2_9B, "sliding_window"), ["lacks 'sliding_window'"]),
        ({**GEMMA2_9B, "layer_types": ["sliding_attention"] * 41}, ["layer_types must list 42"]),
        ({**GEMMA2_9B, "layer_types": ["chunked_attention"] * 42}, ["layer_types", "chunked_attention"]),
        ({**GEMMA3_12B, "text_config": [1]}, ["text_config must be an object", "list"]),
        (_without(DEEPSEEK_V2_LITE, "kv_lora_rank"), ["lacks 'kv_lora_rank'"]),
        ({**DEEPSEEK_V2_LITE, "moe_layer_freq": 2}, ["moe_layer_freq 2", "not supported"]),
        ({**DEEPSEEK_V2_LITE, "num_experts_per_tok": 65}, ["num_experts_per_tok 65 exceeds", "64"]),
        ({**MISTRAL_7B, "sliding_window": 0}, ["sliding_window must be an integer >= 1", "0"]),
        (_without(MISTRAL_7B, "sliding_window"), ["lacks 'sliding_window'"]),  # null would say: none
        (
            {**QWEN3_8B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": None},
            ["lacks 'max_window_layers'"],
        ),
        ({**TINY, "model_type": "opt", "ffn_dim": 256, "word_embed_proj_dim": 32}, ["word_embed_proj_dim"]),
        ({**GEMMA3_1B, "rope_theta": None, "rope_parameters": [1]}, ["rope_parameters must be an object"]),
        ([QWEN3_8B], ["expected a JSON object, got a JSON list"]),
    ],
)
def test_a_bad_config_is_one_line_naming_the_file_and_the_key(tmp_path, config, words):
    folder = folder_with(tmp_path, config)
    with pytest.raises(KvbenchError) as error:
        get_model(str(folder))
    message = str(error.value)
    assert message.startswith(f"--model {folder}: config.json") and "\n" not in message
    for word in words:
        assert word in message


def test_a_folder_without_a_readable_config_is_named(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(KvbenchError, match=r"^--model .*empty: no config.json in the checkpoint folder$"):
        get_model(str(empty))
    (empty / "config.json").write_text('{"model_type": ')
    with pytest.raises(KvbenchError, match=r"^--model .*empty: config.json is not valid JSON \(line 1\)$"):
        get_model(str(empty))


def test_the_command_line_sizes_a_folder_and_refuses_a_bad_one_in_one_line(tmp_path):
    import subprocess
    import sys

    run = [sys.executable, "-m", "kvbench", "simulate", "--engine", "paged", "--kv-cache-gib", "0.01"]
    run += ["--trace", "fixed:prompt=64,output=8", "--num-requests", "3", "--rate", "2"]
    good = folder_with(tmp_path, GEMMA3_1B, "gemma")
    proc = subprocess.run(
        [*run, "--model", str(good), "--out", str(tmp_path / "a")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["kv_bytes_per_token"] == 26_624 and summary["completed"] == 3
    bad = folder_with(tmp_path, _without(GEMMA3_1B, "num_hidden_layers"), "bad")
    proc = subprocess.run(
        [*run, "--model", str(bad), "--out", str(tmp_path / "b")], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --model {bad}: config.json lacks 'num_hidden_layers'"
