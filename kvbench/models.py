"""Model presets: real architecture numbers, for sizing the KV arena and the cost model.

Each preset is the public config.json of its model written in (the source named beside it);
what is derived from it (KV bytes per token and per layer group, parameter counts) is computed
by `ModelSpec` (kvbench/kvspec/model.py) and pinned by tests against the model cards. Every
preset is decoded by kvbench's own model code (`ModelSpec.decoded`: OPT, Llama, Qwen, Mistral,
Gemma 2/3 with their sliding windows, DeepSeek-V2 with MLA and experts). `--model` also takes
a folder holding a Hugging Face config.json (`kvbench.kvspec.hf`).
"""

from __future__ import annotations

from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.kvspec.hf import read_model_config
from kvbench.kvspec.model import MlaShape, ModelSpec, MoeShape

__all__ = ["MODELS", "ModelSpec", "get_model"]


def _opt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, "opt", layers, hidden, heads, heads, 4 * hidden, 50272, 2048)


def _local(layers: int, period: int) -> tuple[int, ...]:
    """Sliding-window layers when every `period`-th layer is global (Gemma 2: 2; Gemma 3: 6)."""
    return tuple(i for i in range(layers) if (i + 1) % period)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _opt("opt-125m", 12, 768, 12),
        _opt("opt-1.3b", 24, 2048, 32),
        _opt("opt-2.7b", 32, 2560, 32),
        _opt("opt-6.7b", 32, 4096, 32),
        _opt("opt-13b", 40, 5120, 40),
        _opt("opt-66b", 64, 9216, 72),
        _opt("opt-175b", 96, 12288, 96),
        ModelSpec("llama-13b", "llama", 40, 5120, 40, 40, 13824, 32000, 2048, norm_eps=1e-6),
        # the reference workload's model (benchmarks/real_decode.py; about 1.2 B parameters)
        ModelSpec("llama-1b-ref", "llama", 16, 2048, 32, 8, 8192, 32000, 2048),
        # tiny configurations for CPU tests and smoke runs (random weights only)
        ModelSpec("tiny-opt", "opt", 2, 64, 4, 4, 256, 512, 2048),
        ModelSpec("tiny-llama", "llama", 2, 64, 4, 2, 128, 512, 2048),
        ModelSpec("llama-3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 8192, rope_theta=500000.0),
        # meta-llama/Llama-3.1-8B config.json (its llama3 rope scaling reaches 131,072 tokens)
        ModelSpec("llama-3.1-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 131072, rope_theta=500000.0),
        # Qwen/Qwen3-0.6B and Qwen/Qwen3-8B config.json: head_dim 128, q/k RMSNorm, no window
        ModelSpec(
            "qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 3072, 151936, 40960, norm_eps=1e-6,
            rope_theta=1e6, head_size=128, tied_embeddings=True,
        ),
        ModelSpec(
            "qwen3-8b", "qwen3", 36, 4096, 32, 8, 12288, 151936, 40960, norm_eps=1e-6,
            rope_theta=1e6,  # head_dim 128 = 4,096 / 32
        ),
        # mistralai/Mistral-7B-v0.1 config.json: every layer sees the last 4,096 tokens
        ModelSpec(
            "mistral-7b", "mistral", 32, 4096, 32, 8, 14336, 32000, 32768, window=4096,
            window_layers=tuple(range(32)),
        ),
        # google/gemma-2-9b config.json: even layers local (4,096 tokens), odd layers global
        ModelSpec(
            "gemma-2-9b", "gemma2", 42, 3584, 16, 8, 14336, 256000, 8192, norm_eps=1e-6,
            head_size=256, window=4096, window_layers=_local(42, 2), tied_embeddings=True,
            attn_softcap=50.0, final_softcap=30.0,  # query_pre_attn_scalar 256: head_dim's
        ),
        # google/gemma-3-1b-pt config.json: five local layers (512 tokens) per global one,
        # local rotary base 10,000, global 1,000,000
        ModelSpec(
            "gemma-3-1b", "gemma3", 26, 1152, 4, 1, 6912, 262144, 32768, norm_eps=1e-6,
            rope_theta=1e6, head_size=256, window=512, window_layers=_local(26, 6),
            local_rope_theta=10000.0, tied_embeddings=True,
        ),
        # google/gemma-3-12b-pt config.json, its text_config (the vision tower is not counted):
        # five local layers (1,024 tokens) per global one
        ModelSpec(
            "gemma-3-12b", "gemma3", 48, 3840, 16, 8, 15360, 262208, 131072, norm_eps=1e-6,
            rope_theta=1e6, head_size=256, window=1024, window_layers=_local(48, 6),
            local_rope_theta=10000.0, tied_embeddings=True,
        ),
        # deepseek-ai/DeepSeek-V2-Lite config.json: MLA (latent 512 + rope 64 per token and
        # layer), 64 routed + 2 shared experts of 1,408 after one dense layer
        ModelSpec(
            "deepseek-v2-lite", "deepseek", 27, 2048, 16, 16, 10944, 102400, 163840, norm_eps=1e-6,
            mla=MlaShape(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128),
            moe=MoeShape(experts=64, shared_experts=2, expert_ffn=1408, dense_layers=1, top_k=6),
        ),
    )
}  # fmt: skip


def get_model(name: str) -> ModelSpec:
    """A preset by name, or the architecture of a folder holding a Hugging Face config.json
    (sized from its keys alone: no weights, no network, no remote code)."""
    if Path(name).is_dir():
        return read_model_config(Path(name))
    try:
        return MODELS[name]
    except KeyError:
        raise KvbenchError(
            f"unknown --model {name!r}; choose one of: {', '.join(MODELS)}, or a folder with a config.json"
        ) from None
