"""A Hugging Face checkpoint's `config.json` read into kvbench's `ModelSpec`, every value checked.

This is the one place a checkpoint's architecture enters kvbench, so each key is checked here
(its JSON type, its range, how the sizes divide) and a failure is one line naming the folder,
`config.json` and the key. Unchecked, a bad value surfaces much later: as a shape error inside
the model, or blamed on an unrelated flag (a negative layer count made the KV budget negative,
which read as a bad --kv-cache-gib). Keys that select computations kvbench's OPT and Llama do
not implement (another activation, biases, a projected embedding) are refused rather than
ignored, since ignoring them would decode silently wrong tokens. Torch-free: the configuration
check needs no model code.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.kvspec.config_json import ConfigKeys as _Keys
from kvbench.kvspec.config_json import json_kind as _json_kind
from kvbench.kvspec.config_json import read_config_json
from kvbench.kvspec.hf import FAMILIES as SIZED_FAMILIES
from kvbench.kvspec.hf import rope_bases, spec_from_config
from kvbench.modeling.rope_config import ROPE_TYPES, read_rope_scaling
from kvbench.models import ModelSpec

HF_MODEL_TYPES = {"opt": "opt", "llama": "llama"}  # the rest: `kvbench.kvspec.hf`, then `_decoding_keys`


def read_checkpoint_spec(path: Path) -> ModelSpec:
    """The architecture of the checkpoint folder `path`, from its config.json."""
    config = read_config_json(path)
    return spec_from_hf_config(config, str(path))


def spec_from_hf_config(config: object, name: str) -> ModelSpec:
    """A `ModelSpec` from a parsed `config.json` (OPT, Llama) of the folder `name`; the other
    families kvbench sizes (Mistral, Qwen, Gemma, DeepSeek) come from the sizing reader, `kvbench.kvspec.hf`,
    and, where kvbench decodes them, the keys of their arithmetic checked (`_decoding_keys`)."""
    where = f"--model {name}: config.json"
    if not isinstance(config, dict):
        raise KvbenchError(f"{where}: expected a JSON object, got a JSON {_json_kind(config)}")
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in SIZED_FAMILIES and model_type not in HF_MODEL_TYPES:
        spec = spec_from_config(config, name)  # sized; decoded where kvbench has the family's code
        if spec.family == "deepseek":  # arithmetic keys checked as weights load (deepseek_decoding_keys)
            return _deepseek_rope(config, spec, where)
        return _decoding_keys(config, spec, where) if spec.decoded else spec
    if not isinstance(model_type, str) or model_type not in HF_MODEL_TYPES:
        supported = ", ".join(HF_MODEL_TYPES)
        raise KvbenchError(
            f"{where}: unsupported architecture {model_type!r} (model_type; one of: {supported})"
        )
    key = _Keys(config, where)
    layers, hidden = key.count("num_hidden_layers"), key.count("hidden_size")
    heads, vocab = key.count("num_attention_heads"), key.count("vocab_size")
    max_len = key.count("max_position_embeddings")
    if hidden % heads:
        raise KvbenchError(f"{where}: hidden_size {hidden} does not divide by num_attention_heads {heads}")
    if HF_MODEL_TYPES[model_type] == "opt":
        if key.count("word_embed_proj_dim", hidden) != hidden:
            key.unsupported("word_embed_proj_dim", "a projected embedding (opt-350m)")
        if not key.flag("do_layer_norm_before", True):
            key.unsupported("do_layer_norm_before", "post-LayerNorm OPT")
        if key.flag("_remove_final_layer_norm", False):
            key.unsupported("_remove_final_layer_norm", "OPT without its final LayerNorm")
        if not key.flag("enable_bias", True):
            key.unsupported("enable_bias", "OPT without biases")
        key.choice("activation_function", "relu")
        return ModelSpec(name, "opt", layers, hidden, heads, heads, key.count("ffn_dim"), vocab, max_len)
    kv_heads = key.count("num_key_value_heads", heads)
    if heads % kv_heads:
        raise KvbenchError(
            f"{where}: num_attention_heads {heads} does not divide by num_key_value_heads {kv_heads}"
        )
    head_dim = hidden // heads
    if key.count("head_dim", head_dim) != head_dim:
        key.unsupported("head_dim", f"a head size other than hidden_size / num_attention_heads ({head_dim})")
    if head_dim % 2:
        raise KvbenchError(f"{where}: rotary embeddings need an even head size, got {hidden} / {heads}")
    key.choice("hidden_act", "silu")
    for bias in ("attention_bias", "mlp_bias"):
        if key.flag(bias, False):
            key.unsupported(bias, "Llama with biases")
    theta, _ = rope_bases(key, "llama")  # as the sizing reader and transformers read it
    return ModelSpec(
        name, "llama", layers, hidden, heads, kv_heads, key.count("intermediate_size"), vocab,
        max_len, norm_eps=key.number("rms_norm_eps", 1e-6), rope_theta=theta,
        rope_scaling=read_rope_scaling(config, where),
    )  # fmt: skip


ACTIVATIONS = {"qwen2": "silu", "qwen3": "silu", "mistral": "silu", "gemma2": "gelu_pytorch_tanh",
               "gemma3": "gelu_pytorch_tanh", "deepseek": "silu"}  # fmt: skip


def _decoding_keys(config: dict, spec: ModelSpec, where: str) -> ModelSpec:
    """The keys that change a decoded family's arithmetic but not its KV sizes, refused where
    kvbench's model would compute something else."""
    if spec.family == "gemma3" and isinstance(config.get("text_config"), dict):
        config, where = config["text_config"], f"{where}: text_config"
    key = _Keys(config, where)
    if spec.family != "deepseek" and spec.head_dim % 2:
        raise KvbenchError(f"{where}: rotary embeddings need an even head size, got head_dim {spec.head_dim}")
    if spec.family.startswith("gemma"):
        key.choice("hidden_activation", ACTIVATIONS[spec.family])
    else:
        key.choice("hidden_act", ACTIVATIONS[spec.family])
    for bias in ("attention_bias", "mlp_bias"):
        if key.flag(bias, False):
            key.unsupported(bias, f"{spec.family} with these biases")
    # Gemma 3 scales its global layers only, which kvbench's layers cannot yet tell apart
    types = ("default",) if spec.family.startswith("gemma") else ROPE_TYPES
    scaling = read_rope_scaling(config, where, types)
    return replace(spec, rope_scaling=scaling)  # Gemma's query scale, soft caps: read with its sizes


def deepseek_decoding_keys(path: Path, spec: ModelSpec) -> None:
    """A DeepSeek checkpoint's keys of arithmetic, refused where `kvbench/modeling/mla.py` would
    compute something else (it computes V2's greedy softmax router, and plain, YaRN or llama3
    rotary embeddings): checked when its weights load, not when it is sized."""
    config = read_config_json(path)
    where = f"--model {path}: config.json"
    _decoding_keys(config, spec, where)
    key = _Keys(config, where)
    if config.get("model_type") != "deepseek_v2":
        key.unsupported("model_type", "DeepSeek-V3's router (sigmoid scores, a bias, grouped top-k)")
    if spec.mla is not None and spec.mla.qk_rope_head_dim % 2:
        raise KvbenchError(f"{key.where}: qk_rope_head_dim must be even, got {spec.mla.qk_rope_head_dim}")
    if spec.moe is not None:
        key.choice("topk_method", "greedy")


def _deepseek_rope(config: dict, spec: ModelSpec, where: str) -> ModelSpec:
    """A DeepSeek spec with the rope scaling its config sets, where kvbench computes it. A type it
    does not compute is left out here, since sizing does not need it (`kvbench simulate` runs a
    V3 config): `deepseek_decoding_keys` refuses it, in one line, before any weight loads."""
    try:
        return replace(spec, rope_scaling=read_rope_scaling(config, where))
    except KvbenchError:
        return spec
