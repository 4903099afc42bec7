"""Llama (Llama-2/3, Mistral-style): RoPE, RMSNorm, SwiGLU MLP, grouped-query attention, no biases.

Parameter names mirror Hugging Face's `LlamaForCausalLM`, except that projections reading the same
input are packed into one matrix product (`qkv_proj` holds `q_proj`, `k_proj`, `v_proj` stacked;
`gate_up_proj` holds `gate_proj`, `up_proj`): one launch instead of three, which a small
model's decode step notices. Checkpoints load through `CausalLM.packed`. Under tensor
parallelism (`tp`, see `kvbench/parallel/layers.py`) the packed projections keep this rank's
heads (q and KV) and MLP columns, o_proj and down_proj sum across ranks.
"""

from __future__ import annotations

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


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, **factory) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)  # normalised in fp32, as the reference does


class LlamaAttention(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.spec = spec
        self.heads, self.kv_heads = spec.num_heads // tp.size, spec.num_kv_heads // tp.size  # this rank's
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.qkv_proj = ColumnParallelLinear(spec.hidden, (q, kv, kv), tp, bias=False, **factory)
        self.o_proj = RowParallelLinear(q, spec.hidden, tp, bias=False, **factory)

    def forward(self, x, positions, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        s, t = self.spec, x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.sections, dim=-1)  # [T, H*D], [T, Hkv*D] x2 (views)
        q = q.view(t, self.heads, s.head_dim)  # [T, H, D] (H, Hkv: this rank's heads)
        k = k.view(t, self.kv_heads, s.head_dim)  # [T, Hkv, D]
        v = v.view(t, self.kv_heads, s.head_dim)  # [T, Hkv, D]
        q = ops.rotary(q, positions, s.rope_theta, s.rope_scaling)  # [T, H, D] (scaled: `rope.py`)
        k = ops.rotary(k, positions, s.rope_theta, s.rope_scaling)  # [T, Hkv, D]
        o = attention(q, k, v, k_cache, v_cache, meta, s.head_dim**-0.5)  # [T, H, D]
        return self.o_proj(o.reshape(t, -1))


class LlamaMLP(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(spec.hidden, (spec.ffn, spec.ffn), tp, bias=False, **factory)
        self.down_proj = RowParallelLinear(spec.ffn, spec.hidden, tp, bias=False, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [T, ffn] each (strided views; ffn: this rank's)
        return self.down_proj(ops.silu_mul(gate, up))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(spec, tp, **factory)
        self.mlp = LlamaMLP(spec, tp, **factory)
        self.input_layernorm = RMSNorm(spec.hidden, spec.norm_eps, **factory)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.norm_eps, **factory)

    def forward(self, h, positions, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), positions, k_cache, v_cache, meta)  # [T, hidden]
        return h + self.mlp(self.post_attention_layernorm(h))  # [T, hidden]


class _LlamaModel(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.embed_tokens = Embedding(spec.vocab, spec.hidden, **factory)
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, tp, **factory) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden, spec.norm_eps, **factory)


class LlamaForCausalLM(CausalLM):
    packed: ClassVar = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.spec = spec
        self.model = _LlamaModel(spec, tp, **factory)
        self.lm_head = Linear(spec.hidden, spec.vocab, bias=False, **factory)

    def embed(self, input_ids, positions) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)  # [T, hidden]; positions enter through RoPE

    def decoder_layers(self) -> nn.ModuleList:
        return self.model.layers

    def final_norm(self) -> nn.Module:
        return self.model.norm
