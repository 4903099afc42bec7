"""What both families share: the forward pass over a packed batch, and the last-token logits.

    input_ids [T] --embed--> h [T, hidden] --layers (attention over the arena)--> h
        --pick each sequence's last new token--> [B, hidden] --norm, lm_head--> logits [B, vocab]

Families (`opt.py`, `llama.py`) provide `embed`, `layers`, `final_norm` and `lm_head`, with
parameter names that mirror Hugging Face's so checkpoints load by name.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from kvbench.modeling.arena import KVArena
from kvbench.modeling.attention import AttentionMetadata
from kvbench.models import ModelSpec


class CausalLM(nn.Module):
    spec: ModelSpec
    # module name -> checkpoint module names stacked (along the output rows) into its weight
    packed: ClassVar[dict[str, tuple[str, ...]]] = {}

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decoder_layers(self) -> nn.ModuleList:
        raise NotImplementedError

    def final_norm(self) -> nn.Module:
        raise NotImplementedError

    def tie_weights(self) -> None:
        """Share tied parameters again (materialising a `meta` model unties them)."""

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, arena: KVArena
    ) -> torch.Tensor:
        """input_ids, positions `[T]` -> float32 logits `[B, vocab]` of each sequence's last token."""
        h = self.hidden_states(input_ids, positions, meta, arena)  # [T, hidden]
        last = meta.cu_seqlens[1:] - 1  # [B] index of each sequence's last new token
        h = self.final_norm()(h[last])  # [B, hidden]
        return self.lm_head(h).float()  # [B, vocab]

    def hidden_states(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, arena: KVArena
    ) -> torch.Tensor:
        """`[T, hidden]` after the last layer, K/V stored: all a tensor-parallel worker computes
        (rank 0 alone adds the head and samples)."""
        h = self.embed(input_ids, positions)  # [T, hidden]
        tables = meta.per_table  # a table per KV group: each layer reads its own (`AttentionMetadata`)
        for index, layer in enumerate(self.decoder_layers()):
            own = tables[arena.table_of[index]] if tables else meta
            h = layer(h, positions, arena.k[index], arena.v[index], own)
        return h
