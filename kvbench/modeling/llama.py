"""Llama (Llama-2/3, Mistral-style): RoPE, RMSNorm, SwiGLU MLP, grouped-query attention, no biases.

Parameter names mirror Hugging Face's `LlamaForCausalLM` (`model.layers.0.mlp.gate_proj.weight`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.modeling.attention import AttentionMetadata, attention
from kvbench.modeling.causal_lm import CausalLM
from kvbench.models import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, **factory) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()  # normalise in fp32, as the reference implementation does
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of `x` `[T, heads, D]` at `positions` `[T]` (halves rotated, not pairs)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)  # [D/2]
    angles = positions[:, None].float() * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((angles, angles), dim=-1)[:, None, :]  # [T, 1, D]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaAttention(nn.Module):
    def __init__(self, spec: ModelSpec, **factory) -> None:
        super().__init__()
        self.spec = spec
        kv = spec.num_kv_heads * spec.head_dim
        self.q_proj = nn.Linear(spec.hidden, spec.num_heads * spec.head_dim, bias=False, **factory)
        self.k_proj = nn.Linear(spec.hidden, kv, bias=False, **factory)
        self.v_proj = nn.Linear(spec.hidden, kv, bias=False, **factory)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, spec.hidden, bias=False, **factory)

    def forward(self, x, positions, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        s, t = self.spec, x.shape[0]
        q = self.q_proj(x).view(t, s.num_heads, s.head_dim)  # [T, H, D]
        k = self.k_proj(x).view(t, s.num_kv_heads, s.head_dim)  # [T, Hkv, D]
        v = self.v_proj(x).view(t, s.num_kv_heads, s.head_dim)  # [T, Hkv, D]
        q, k = rotate(q, positions, s.rope_theta), rotate(k, positions, s.rope_theta)
        o = attention(q, k, v, k_cache, v_cache, meta, s.head_dim**-0.5)  # [T, H, D]
        return self.o_proj(o.reshape(t, -1))


class LlamaMLP(nn.Module):
    def __init__(self, spec: ModelSpec, **factory) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden, spec.ffn, bias=False, **factory)
        self.up_proj = nn.Linear(spec.hidden, spec.ffn, bias=False, **factory)
        self.down_proj = nn.Linear(spec.ffn, spec.hidden, bias=False, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, **factory) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(spec, **factory)
        self.mlp = LlamaMLP(spec, **factory)
        self.input_layernorm = RMSNorm(spec.hidden, spec.norm_eps, **factory)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.norm_eps, **factory)

    def forward(self, h, positions, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), positions, k_cache, v_cache, meta)  # [T, hidden]
        return h + self.mlp(self.post_attention_layernorm(h))  # [T, hidden]


class _LlamaModel(nn.Module):
    def __init__(self, spec: ModelSpec, **factory) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden, **factory)
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, **factory) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden, spec.norm_eps, **factory)


class LlamaForCausalLM(CausalLM):
    def __init__(self, spec: ModelSpec, **factory) -> None:
        super().__init__()
        self.spec = spec
        self.model = _LlamaModel(spec, **factory)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False, **factory)

    def embed(self, input_ids, positions) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)  # [T, hidden]; positions enter through RoPE

    def decoder_layers(self) -> nn.ModuleList:
        return self.model.layers

    def final_norm(self) -> nn.Module:
        return self.model.norm
