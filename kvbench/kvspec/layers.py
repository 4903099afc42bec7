"""What one layer keeps in the KV cache per token, and the groups of layers that share a shape.

A 2023 model stores K and V of every token in every layer, so one number (bytes per token)
sizes its cache. The models served since do not: a sliding-window layer (Mistral, Gemma 2 and 3)
attends to the last W tokens only, so an allocator that knows it may drop the rest; an MLA layer
(DeepSeek-V2/V3, Kimi K2) stores one compressed latent and a small rotary part per token instead
of K and V per head. Each kind is a frozen dataclass with the bytes one token costs in one layer
and the tokens of a length-n sequence the layer still needs.

Layers of one kind and shape form a `KVGroup`, as vLLM v1's KV cache groups and Jenga's
per-layer-type pools do: a hybrid allocator manages one pool (or one block table) per group.
(vLLM further splits a group so that every group has the same number of layers and so the same
page size; that is a page-layout choice of one allocator, left to the engine that makes it.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


def _kv_bytes(kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V of one token in one attention layer."""
    return 2 * kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class FullAttention:
    """K and V per KV head; every token of the sequence stays (OPT, Llama, Qwen, global layers)."""

    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    kind: ClassVar[str] = "full"

    @property
    def bytes_per_token(self) -> int:
        return _kv_bytes(self.kv_heads, self.head_dim, self.dtype_bytes)

    def tokens_held(self, n: int) -> int:
        return n


@dataclass(frozen=True)
class SlidingWindow:
    """K and V per KV head of the last `window` tokens only: a token further back is never read
    again, so an allocator that knows the window frees it."""

    kv_heads: int
    head_dim: int
    window: int
    dtype_bytes: int = 2
    kind: ClassVar[str] = "sliding"

    @property
    def bytes_per_token(self) -> int:
        return _kv_bytes(self.kv_heads, self.head_dim, self.dtype_bytes)

    def tokens_held(self, n: int) -> int:
        return min(n, self.window)


@dataclass(frozen=True)
class LatentAttention:
    """MLA: one latent of `latent` values (kv_lora_rank) plus a rotary key of `rope` values
    (qk_rope_head_dim) per token, shared by all heads; K and V are expanded from it when read."""

    latent: int
    rope: int
    dtype_bytes: int = 2
    kind: ClassVar[str] = "mla"

    @property
    def bytes_per_token(self) -> int:
        return (self.latent + self.rope) * self.dtype_bytes

    def tokens_held(self, n: int) -> int:
        return n


LayerKV = FullAttention | SlidingWindow | LatentAttention


@dataclass(frozen=True)
class KVGroup:
    """Layers of one kind and shape (`layer`), by index: what one hybrid-allocator pool holds."""

    layer: LayerKV
    layer_ids: tuple[int, ...]

    @property
    def kind(self) -> str:
        return self.layer.kind

    @property
    def bytes_per_token(self) -> int:
        """One token in every layer of the group."""
        return len(self.layer_ids) * self.layer.bytes_per_token

    def bytes_held(self, n: int) -> int:
        """What the group keeps of a sequence of n tokens when out-of-window tokens are freed."""
        return self.bytes_per_token * self.layer.tokens_held(n)


def kv_groups(layers: tuple[LayerKV, ...]) -> tuple[KVGroup, ...]:
    """`layers` grouped by equal spec (same kind and shape), in order of each group's first layer."""
    members: dict[LayerKV, list[int]] = {}
    for index, layer in enumerate(layers):
        members.setdefault(layer, []).append(index)
    return tuple(KVGroup(layer, tuple(ids)) for layer, ids in members.items())
