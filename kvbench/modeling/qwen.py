"""Qwen2/2.5, Qwen3 and Mistral: Llama's layer with one switch each.

- Qwen2: q, k and v projections carry biases (o_proj does not).
- Qwen3: no biases; q and k are RMS-normalised per head before RoPE, and head_dim is its own
  config value (Qwen3-0.6B: 16 heads of 128 on a hidden size of 1,024).
- Mistral: every layer attends to the last `sliding_window` positions.
Windows follow `ModelSpec.window_layers` for all three (Qwen2/3 with use_sliding_window too).
"""

from __future__ import annotations

from functools import partial

from torch import nn

from kvbench.modeling.decoder import Attention, DecoderForCausalLM
from kvbench.modeling.llama import LlamaDecoderLayer, LlamaMLP, RMSNorm
from kvbench.models import ModelSpec
from kvbench.parallel.layers import SINGLE, TensorParallel


class _Layer(LlamaDecoderLayer):
    """Llama's pre-norm layer (its forward) around the switchable attention."""

    def __init__(
        self, spec: ModelSpec, index: int, tp: TensorParallel = SINGLE, *, bias: bool = False,
        qk_norm: bool = False, **factory,
    ) -> None:  # fmt: skip
        nn.Module.__init__(self)  # Llama's own attention is not built
        norm = partial(RMSNorm, eps=spec.norm_eps, **factory) if qk_norm else None
        self.self_attn = Attention(spec, index, tp, bias=bias, qk_norm=norm, **factory)
        self.mlp = LlamaMLP(spec, tp, **factory)
        self.input_layernorm = RMSNorm(spec.hidden, spec.norm_eps, **factory)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.norm_eps, **factory)


class _LlamaShaped(DecoderForCausalLM):
    bias: bool = False
    qk_norm: bool = False

    @classmethod
    def decoder_layer(cls, spec, index, tp, **factory) -> nn.Module:
        return _Layer(spec, index, tp, bias=cls.bias, qk_norm=cls.qk_norm, **factory)

    @classmethod
    def make_norm(cls, spec, **factory) -> nn.Module:
        return RMSNorm(spec.hidden, spec.norm_eps, **factory)


class Qwen2ForCausalLM(_LlamaShaped):
    bias = True


class Qwen3ForCausalLM(_LlamaShaped):
    qk_norm = True


class MistralForCausalLM(_LlamaShaped):
    pass
