"""Gemma 2 and Gemma 3: local (sliding-window) and global layers, four norms a layer, GeGLU.

Against Llama's layer:
- RMSNorm scales by `1 + weight` (computed in fp32, then rounded), and each layer has four: before
  and after attention, before and after the feed-forward part (the "after" ones before the residual add);
- the embedding is multiplied by sqrt(hidden); scores are scaled by query_pre_attn_scalar^-1/2;
- the MLP is GeGLU: down(gelu_tanh(gate) * up);
- Gemma 2: local and global layers alternate, attention scores and the final logits are
  soft-capped (`cap * tanh(x / cap)`);
- Gemma 3: five local layers per global one, local layers rotate at rope_local_base_freq,
  q and k are RMS-normalised per head (Gemma's norm), no soft-capping.
Which layers are local comes from `ModelSpec.window_layers`, the caps and scale from the spec.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from kvbench.modeling.attention import AttentionMetadata
from kvbench.modeling.decoder import Attention, DecoderForCausalLM
from kvbench.models import ModelSpec
from kvbench.parallel.layers import SINGLE, ColumnParallelLinear, RowParallelLinear, TensorParallel


class GemmaRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, **factory) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)  # scaled in fp32, unlike Llama's


class GemmaMLP(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(spec.hidden, (spec.ffn, spec.ffn), tp, bias=False, **factory)
        self.down_proj = RowParallelLinear(spec.ffn, spec.hidden, tp, bias=False, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [T, ffn] each
        return self.down_proj(nn.functional.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, index: int, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        norm = partial(GemmaRMSNorm, eps=spec.norm_eps, **factory)
        qk_norm = norm if spec.family == "gemma3" else None
        self.self_attn = Attention(spec, index, tp, qk_norm=qk_norm, **factory)
        self.mlp = GemmaMLP(spec, tp, **factory)
        self.input_layernorm, self.post_attention_layernorm = norm(spec.hidden), norm(spec.hidden)
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(spec.hidden), norm(spec.hidden)

    def forward(self, h, positions, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        a = self.self_attn(self.input_layernorm(h), positions, k_cache, v_cache, meta)  # [T, hidden]
        h = h + self.post_attention_layernorm(a)
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class GemmaForCausalLM(DecoderForCausalLM):
    """Gemma 2 and Gemma 3 (text): what differs between them is in the spec."""

    embed_scaled = True

    @classmethod
    def decoder_layer(cls, spec, index, tp, **factory) -> nn.Module:
        return GemmaDecoderLayer(spec, index, tp, **factory)

    @classmethod
    def make_norm(cls, spec, **factory) -> nn.Module:
        return GemmaRMSNorm(spec.hidden, spec.norm_eps, **factory)
