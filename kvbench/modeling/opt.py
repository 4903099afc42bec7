"""OPT (the paper's models): learned positions, pre-LayerNorm, ReLU MLP, MHA, biases everywhere.

Parameter names mirror Hugging Face's `OPTForCausalLM` (`model.decoder.layers.0.fc1.weight`),
so a checkpoint loads by name, except that q, k and v are packed into one matrix product
(`qkv_proj`: `q_proj`, `k_proj`, `v_proj` stacked, weights and biases; loaded through
`CausalLM.packed`): one launch instead of three, which an eager prefill pays on the host and a
small model's decode step on the GPU. The LM head is tied to the token embedding. Under tensor
parallelism (`tp`, see `kvbench/parallel/layers.py`) qkv and fc1 keep this rank's heads and
columns, out_proj and fc2 sum across ranks; embeddings, norms and the head are replicated.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

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

POSITION_OFFSET = 2  # OPT's learned positions start at index 2 (a quirk of its training code)


class OPTAttention(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        h = spec.hidden
        self.spec = spec
        self.heads = spec.num_heads // tp.size  # this rank's heads (all of them in one process)
        self.qkv_proj = ColumnParallelLinear(h, (h, h, h), tp, **factory)
        self.out_proj = RowParallelLinear(h, h, tp, **factory)

    def forward(self, x, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        s = self.spec
        shape = (x.shape[0], self.heads, s.head_dim)
        q, k, v = (part.view(shape) for part in self.qkv_proj(x).split(self.qkv_proj.sections, dim=-1))
        # q, k, v: [T, H, D] each (H: this rank's heads; strided views of one [T, 3 H D] product)
        o = attention(q, k, v, k_cache, v_cache, meta, s.head_dim**-0.5)  # [T, H, D]
        return self.out_proj(o.reshape(x.shape[0], -1))  # [T, hidden]


class OPTDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.self_attn = OPTAttention(spec, tp, **factory)
        self.self_attn_layer_norm = nn.LayerNorm(spec.hidden, eps=spec.norm_eps, **factory)
        self.fc1 = ColumnParallelLinear(spec.hidden, (spec.ffn,), tp, **factory)
        self.fc2 = RowParallelLinear(spec.ffn, spec.hidden, tp, **factory)
        self.final_layer_norm = nn.LayerNorm(spec.hidden, eps=spec.norm_eps, **factory)

    def forward(self, h, positions, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        h = h + self.self_attn(self.self_attn_layer_norm(h), k_cache, v_cache, meta)  # [T, hidden]
        return h + self.fc2(F.relu(self.fc1(self.final_layer_norm(h))))  # [T, hidden]


class OPTDecoder(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.embed_tokens = Embedding(spec.vocab, spec.hidden, **factory)
        self.embed_positions = Embedding(spec.max_len + POSITION_OFFSET, spec.hidden, **factory)
        self.layers = nn.ModuleList(OPTDecoderLayer(spec, tp, **factory) for _ in range(spec.num_layers))
        self.final_layer_norm = nn.LayerNorm(spec.hidden, eps=spec.norm_eps, **factory)


class _OPTModel(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.decoder = OPTDecoder(spec, tp, **factory)


class OPTForCausalLM(CausalLM):
    packed: ClassVar = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, spec: ModelSpec, tp: TensorParallel = SINGLE, **factory) -> None:
        super().__init__()
        self.spec = spec
        self.model = _OPTModel(spec, tp, **factory)
        self.lm_head = Linear(spec.hidden, spec.vocab, bias=False, **factory)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.lm_head.weight = self.model.decoder.embed_tokens.weight  # OPT's LM head is the embedding

    def embed(self, input_ids, positions) -> torch.Tensor:
        d = self.model.decoder
        return d.embed_tokens(input_ids) + d.embed_positions(positions + POSITION_OFFSET)  # [T, hidden]

    def decoder_layers(self) -> nn.ModuleList:
        return self.model.decoder.layers

    def final_norm(self) -> nn.Module:
        return self.model.decoder.final_layer_norm
