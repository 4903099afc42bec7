"""A local Hugging Face `config.json` sized without its weights: keys mapped to a `ModelSpec`.

`--model path/to/folder` needs nothing but the folder's config.json: no weights, no network, and
never `trust_remote_code` (the file is read as JSON, nothing in it runs). Every key the sizes
depend on is read typed (`ConfigKeys`); a missing or unsupported one is one line naming the
folder, config.json and the key, since a guessed default would size the cache silently wrong.
Keys that change only the arithmetic of a layer (activations, soft-capping, rope scaling) do not
change what is stored per token and are not read here; kvbench's own decoding reads its
checkpoints through `kvbench.modeling.hf_config`, which refuses them.
"""

from __future__ import annotations

from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.kvspec.config_json import ConfigKeys, json_kind, read_config_json
from kvbench.kvspec.model import Family, MlaShape, ModelSpec, MoeShape

FAMILIES: dict[str, Family] = {
    "opt": "opt", "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
    "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
}  # fmt: skip
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
LAYER_TYPES = {"full_attention": False, "sliding_attention": True}  # is the layer windowed
TIED = ("gemma2", "gemma3")  # transformers' defaults for tie_word_embeddings
# keys the published Gemma 3 checkpoints leave to transformers' Gemma3TextConfig defaults (the
# 4B-27B text_config gives only the sizes that differ): the defaults, as that class sets them
# (its rotary bases and layer pattern: in `rope_bases` and `_windows`)
GEMMA3_DEFAULTS = {"vocab_size": 262208, "head_dim": 256, "max_position_embeddings": 131072}


def read_model_config(path: Path) -> ModelSpec:
    """The architecture of the folder `path`, from its config.json alone."""
    return spec_from_config(read_config_json(path), str(path))


def spec_from_config(config: object, name: str) -> ModelSpec:
    """A `ModelSpec` from a parsed config.json of the folder `name` (any family in `FAMILIES`)."""
    where = f"--model {name}: config.json"
    if not isinstance(config, dict):
        raise KvbenchError(f"{where}: expected a JSON object, got a JSON {json_kind(config)}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise KvbenchError(
            f"{where}: unsupported architecture {model_type!r} (model_type; one of: {', '.join(FAMILIES)})"
        )
    family = FAMILIES[model_type]
    dtype = config.get("torch_dtype") or config.get("dtype") or "float16"
    if model_type == "gemma3":  # the multimodal checkpoint: its language model is text_config
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise KvbenchError(f"{where}: text_config must be an object, got a JSON {json_kind(text)}")
        config, where = text, f"{where}: text_config"
        dtype = config.get("torch_dtype") or config.get("dtype") or dtype
    if family == "gemma3":
        config = {**GEMMA3_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    key = ConfigKeys(config, where)
    layers, hidden = key.count("num_hidden_layers"), key.count("hidden_size")
    heads, vocab = key.count("num_attention_heads"), key.count("vocab_size")
    max_len = key.count("max_position_embeddings")
    if dtype not in DTYPE_BYTES:
        raise KvbenchError(
            f"{where}: torch_dtype {dtype!r} is not supported (one of: {', '.join(DTYPE_BYTES)})"
        )
    if not key.given("head_dim") and hidden % heads:
        raise KvbenchError(f"{where}: hidden_size {hidden} does not divide by num_attention_heads {heads}")
    if family == "opt":
        if key.count("word_embed_proj_dim", hidden) != hidden:
            key.unsupported("word_embed_proj_dim", "a projected embedding (opt-350m)")
        ffn = key.count("ffn_dim")
        return ModelSpec(name, "opt", layers, hidden, heads, heads, ffn, vocab, max_len, DTYPE_BYTES[dtype])
    kv_heads = key.count("num_key_value_heads", heads)
    if heads % kv_heads:
        raise KvbenchError(
            f"{where}: num_attention_heads {heads} does not divide by num_key_value_heads {kv_heads}"
        )
    head_dim = key.count("head_dim", hidden // heads)
    window, window_layers = _windows(key, family, layers)
    theta, local_theta = rope_bases(key, family)
    return ModelSpec(
        name, family, layers, hidden, heads, kv_heads, key.count("intermediate_size"), vocab, max_len,
        DTYPE_BYTES[dtype], norm_eps=key.number("rms_norm_eps", 1e-6), rope_theta=theta,
        head_size=0 if head_dim * heads == hidden else head_dim, window=window, window_layers=window_layers,
        local_rope_theta=local_theta, tied_embeddings=key.flag("tie_word_embeddings", family in TIED),
        **(_gemma_scores(key, family, head_dim) if family in ("gemma2", "gemma3") else {}),
        mla=_mla(key) if family == "deepseek" else None, moe=_moe(key) if family == "deepseek" else None,
    )  # fmt: skip


def _windows(key: ConfigKeys, family: Family, layers: int) -> tuple[int, tuple[int, ...]]:
    """The window and the indices of the sliding-window layers: `layer_types` where given, else
    each family's rule (as transformers applies it)."""
    if family in ("llama", "deepseek"):
        return 0, ()
    if family in ("qwen2", "qwen3") and not key.flag("use_sliding_window", False):
        return 0, ()
    if family == "mistral" and "sliding_window" in key.config and not key.given("sliding_window"):
        return 0, ()  # null: full attention (Mistral v0.2 and later); absent is refused, not guessed
    window = key.count("sliding_window")
    types = key.config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
            raise KvbenchError(
                f"{key.where}: layer_types must list {layers} of {', '.join(LAYER_TYPES)} (one per layer), "
                f"got {types!r:.120}"
            )
        return window, tuple(i for i, kind in enumerate(types) if LAYER_TYPES[kind])
    if family == "mistral":
        return window, tuple(range(layers))
    if family in ("qwen2", "qwen3"):  # the layers from max_window_layers on
        return window, tuple(range(min(key.count("max_window_layers"), layers), layers))
    if family == "gemma2":  # local, global, local, ...
        return window, tuple(range(0, layers, 2))
    pattern_key = (
        "sliding_window_pattern" if key.given("sliding_window_pattern") else "_sliding_window_pattern"
    )
    period = key.count(pattern_key, 6)  # gemma3: (period - 1) local layers, then a global one
    return window, tuple(i for i in range(layers) if (i + 1) % period)


def rope_bases(key: ConfigKeys, family: Family) -> tuple[float, float | None]:
    """The rotary base (Gemma 3: its global layers') and Gemma 3's local one, as transformers
    reads them: `rope_parameters` where newer configs keep them (per layer type for Gemma 3)
    wins over a top-level `rope_theta` (`rope_local_base_freq`), which fills in where the
    nested object names none; where neither gives one, transformers' default for the family.
    The one rule for sizing a config.json and for decoding a checkpoint
    (`kvbench.modeling.hf_config`)."""
    nested = key.config.get("rope_parameters") or {}
    if not isinstance(nested, dict):
        raise KvbenchError(f"{key.where}: rope_parameters must be an object, got {nested!r:.80}")
    top = key.number("rope_theta", 1_000_000.0 if family == "gemma3" else 10_000.0)
    top_local = key.number("rope_local_base_freq", 10_000.0) if family == "gemma3" else None
    if family == "gemma3":  # per layer type; a flat object transformers reads for no layer of it
        full, sliding = nested.get("full_attention") or {}, nested.get("sliding_attention") or {}
    else:
        full, sliding = nested, {}
    if not isinstance(full, dict) or not isinstance(sliding, dict):
        raise KvbenchError(f"{key.where}: rope_parameters must hold objects, got {nested!r:.80}")
    theta = ConfigKeys(full, f"{key.where}: rope_parameters").number("rope_theta", top)
    if top_local is None:
        return theta, None
    where = f"{key.where}: rope_parameters.sliding_attention"
    return theta, ConfigKeys(sliding, where).number("rope_theta", top_local)


def _gemma_scores(key: ConfigKeys, family: Family, head_dim: int) -> dict[str, float]:
    """Gemma's query scale (0 where it is head_dim's) and soft caps (0: none): no KV size depends
    on them, but a decoded Gemma computes with them. Absent keys take transformers' defaults
    (Gemma 2 caps at 50 and 30, Gemma 3 not); a null one means no capping."""
    capped = family == "gemma2"

    def cap(name: str, default: float | None) -> float:
        value = key.config.get(name, default)
        return 0.0 if value is None else ConfigKeys({name: value}, key.where).number(name, 1.0)

    scale = key.number("query_pre_attn_scalar", 256.0)
    return {
        "query_scale": 0.0 if scale == head_dim else scale,
        "attn_softcap": cap("attn_logit_softcapping", 50.0 if capped else None),
        "final_softcap": cap("final_logit_softcapping", 30.0 if capped else None),
    }


def _mla(key: ConfigKeys) -> MlaShape:
    return MlaShape(
        kv_lora_rank=key.count("kv_lora_rank"),
        qk_rope_head_dim=key.count("qk_rope_head_dim"),
        qk_nope_head_dim=key.count("qk_nope_head_dim"),
        v_head_dim=key.count("v_head_dim"),
        q_lora_rank=key.count("q_lora_rank") if key.given("q_lora_rank") else 0,
    )


def _moe(key: ConfigKeys) -> MoeShape | None:
    if not key.given("n_routed_experts"):
        return None
    if key.count("moe_layer_freq", 1) != 1:
        key.unsupported("moe_layer_freq", "MoE on every n-th layer only")
    experts = key.count("n_routed_experts")
    top_k = key.count("num_experts_per_tok") if key.given("num_experts_per_tok") else 0
    if top_k > experts:  # a token picks among the routed experts: no more picks than experts
        raise KvbenchError(f"{key.where}: num_experts_per_tok {top_k} exceeds n_routed_experts {experts}")
    return MoeShape(
        experts=experts,
        shared_experts=key.count("n_shared_experts") if key.given("n_shared_experts") else 0,
        expert_ffn=key.count("moe_intermediate_size"),
        dense_layers=key.count("first_k_dense_replace") if key.given("first_k_dense_replace") else 0,
        top_k=top_k,
        routed_scale=key.number("routed_scaling_factor", 1.0),
    )
