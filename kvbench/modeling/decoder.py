"""What the Llama-shaped families after Llama share: per-layer attention and the model skeleton.

Qwen2/Qwen3, Mistral and Gemma 2/3 are Llama's pre-norm decoder with a few switches, each a
config value rather than a new code path:

    q/k/v biases (Qwen2)            q/k RMSNorm per head (Qwen3, Gemma 3)
    a sliding window per layer      a rotary base per layer (Gemma 3's local layers)
    query_pre_attn_scalar (Gemma)   attention and final-logit soft-capping (Gemma 2)
    embedding x sqrt(hidden) (Gemma)

Which layers slide, and their window, come from `ModelSpec.window_layers` (the per-layer KV
spec of `kvbench/kvspec/`), so the model and the KV sizing read one description. Parameter
names mirror Hugging Face's, with Llama's packing (`qkv_proj`, `gate_up_proj`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from kvbench.modeling import ops
from kvbench.modeling.attention import AttentionMetadata, attention
from kvbench.modeling.causal_lm import CausalLM
from kvbench.models import ModelSpec
from kvbench.parallel.layers import (
    SINGLE,
    ColumnParallelLinear,
    Embedding,
    Linear,
    RowParallelLinear,
    TensorParallel,
)


def layer_window(spec: ModelSpec, index: int) -> int:
    """The window of layer `index` (0: it attends to every position)."""
    return spec.window if index in spec.window_layers else 0


def layer_theta(spec: ModelSpec, index: int) -> float:
    """The rotary base of layer `index`: Gemma 3's local layers have their own."""
    if spec.local_rope_theta is not None and index in spec.window_layers:
        return spec.local_rope_theta
    return spec.rope_theta


class Attention(nn.Module):
    """Grouped-query attention of layer `index`: packed q/k/v (biased or not), an optional
    per-head q/k norm (`qk_norm(head_dim)` builds it), RoPE, the layer's window and soft cap."""

    def __init__(
        self, spec: ModelSpec, index: int, tp: TensorParallel = SINGLE, *, bias: bool = False,
        qk_norm: Callable[[int], nn.Module] | None = None, **factory,
    ) -> None:  # fmt: skip
        super().__init__()
        self.spec = spec
        self.heads, self.kv_heads = spec.num_heads // tp.size, spec.num_kv_heads // tp.size  # this rank's
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.qkv_proj = ColumnParallelLinear(spec.hidden, (q, kv, kv), tp, bias=bias, **factory)
        self.o_proj = RowParallelLinear(q, spec.hidden, tp, bias=False, **factory)
        if qk_norm is not None:
            self.q_norm, self.k_norm = qk_norm(spec.head_dim), qk_norm(spec.head_dim)
        self.qk_norm = qk_norm is not None
        self.window, self.theta = layer_window(spec, index), layer_theta(spec, index)
        self.scale = (spec.query_scale or spec.head_dim) ** -0.5

    def forward(self, x, positions, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        s, t = self.spec, x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.sections, dim=-1)  # [T, H*D], [T, Hkv*D] x2
        q = q.reshape(t, self.heads, s.head_dim)  # [T, H, D]
        k = k.reshape(t, self.kv_heads, s.head_dim)  # [T, Hkv, D]
        v = v.reshape(t, self.kv_heads, s.head_dim)  # [T, Hkv, D]
        if self.qk_norm:  # normalised per head, before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q = ops.rotary(q, positions, self.theta, s.rope_scaling)  # [T, H, D] (scaled: `rope.py`)
        k = ops.rotary(k, positions, self.theta, s.rope_scaling)  # [T, Hkv, D]
        o = attention(
            q, k, v, k_cache, v_cache, meta, self.scale, window=self.window, softcap=s.attn_softcap
        )  # [T, H, D]
        return self.o_proj(o.reshape(t, -1))


class _Model(nn.Module):
    def __init__(self, spec: ModelSpec, layers: list[nn.Module], norm: nn.Module, **factory) -> None:
        super().__init__()
        self.embed_tokens = Embedding(spec.vocab, spec.hidden, **factory)
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class DecoderForCausalLM(CausalLM):
    """A family: `decoder_layer` builds layer `index`, `make_norm` a norm over the hidden size."""

    packed: ClassVar = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    embed_scaled: ClassVar[bool] = False  # Gemma: embeddings x sqrt(hidden)

    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.spec = spec
        layers = [self.decoder_layer(spec, index, tp, **factory) for index in range(spec.num_layers)]
        self.model = _Model(spec, layers, self.make_norm(spec, **factory), **factory)
        self.lm_head = Linear(spec.hidden, spec.vocab, bias=False, **factory)
        self.tie_weights()

    @classmethod
    def decoder_layer(cls, spec: ModelSpec, index: int, tp: TensorParallel, **factory) -> nn.Module:
        raise NotImplementedError

    @classmethod
    def make_norm(cls, spec: ModelSpec, **factory) -> nn.Module:
        raise NotImplementedError

    def tie_weights(self) -> None:
        if self.spec.tied_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed(self, input_ids, positions) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)  # [T, hidden]; positions enter through RoPE
        if self.embed_scaled:  # the factor rounded to the weights' dtype first, as transformers does
            h = h * float(torch.tensor(self.spec.hidden**0.5, dtype=h.dtype))
        return h

    def decoder_layers(self) -> nn.ModuleList:
        return self.model.layers

    def final_norm(self) -> nn.Module:
        return self.model.norm

    def forward(self, input_ids, positions, meta: AttentionMetadata, arena) -> torch.Tensor:
        logits = super().forward(input_ids, positions, meta, arena)  # [B, vocab] float32
        cap = self.spec.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits
