"""Model presets: real architecture numbers, for sizing the KV arena and the cost model.

Parameter counts are computed from the architecture (not typed in), so a preset is one
line of public config values and the derived numbers can be checked against the model
cards (OPT-13B: 12.85 B parameters, 819,200 KV bytes per token in fp16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvbench.errors import KvbenchError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: Literal["opt", "llama"]
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int  # < num_heads for grouped-query attention (Llama-3)
    ffn: int  # feed-forward width (OPT: 4 x hidden; Llama: SwiGLU intermediate size)
    vocab: int
    max_len: int  # maximum sequence length (prompt + output); OPT's learned positions stop at 2048
    dtype_bytes: int = 2  # fp16/bf16 weights and KV
    norm_eps: float = 1e-5  # LayerNorm (OPT) / RMSNorm (Llama) epsilon
    rope_theta: float = 10000.0  # Llama rotary base

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer: one slot of the KV arena."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def num_params(self) -> int:
        h, kv = self.hidden, self.num_kv_heads * self.head_dim
        if self.family == "opt":  # biases everywhere, two LayerNorms, tied LM head
            attn = h * (h + 2 * kv) + (h + 2 * kv) + h * h + h
            mlp = 2 * h * self.ffn + self.ffn + h
            layer = attn + mlp + 4 * h
            embed = self.vocab * h + (self.max_len + 2) * h  # OPT offsets positions by 2
            return self.num_layers * layer + embed + 2 * h
        attn = h * (h + 2 * kv) + h * h  # Llama: no biases, RMSNorm, untied LM head
        layer = attn + 3 * h * self.ffn + 2 * h
        return self.num_layers * layer + 2 * self.vocab * h + h

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


def _opt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, "opt", layers, hidden, heads, heads, 4 * hidden, 50272, 2048)


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
    )
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KvbenchError(f"unknown --model {name!r}; choose one of: {', '.join(MODELS)}") from None
