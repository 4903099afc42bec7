"""The KV arena on the device: allocated once, carved up by the engine's allocator.

Layout, per layer: `k[layer]` and `v[layer]` are `[num_slots, kv_heads, head_dim]`; a token's
slot holds its K and V in every layer, so one slot costs `ModelSpec.kv_bytes_per_token`::

    k: [num_layers, num_slots, kv_heads, head_dim]      slot s = one token's keys
    v: [num_layers, num_slots, kv_heads, head_dim]

Paged engines see the slots as blocks (`slot = block * block_size + offset`), contiguous
engines as extents (`slot = start + position`); the memory is the same. Under tensor
parallelism each rank's arena has the same slots and its own KV heads (`Hkv / N`), so a slot
is still one token of the whole model.
"""

from __future__ import annotations

import torch

from kvbench.models import ModelSpec


class KVArena:
    def __init__(
        self, spec: ModelSpec, num_slots: int, dtype: torch.dtype, device: torch.device, *, tp_size: int = 1
    ) -> None:
        # tensor parallelism: each of `tp_size` ranks holds its heads' K/V of every slot
        shape = (spec.num_layers, num_slots, spec.num_kv_heads // tp_size, spec.head_dim)
        self.num_slots = num_slots
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, S, Hkv, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, S, Hkv, D]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def fill(self, value: float) -> None:
        """Poison every slot (tests check that nothing writes outside a request's slots)."""
        self.k.fill_(value)
        self.v.fill_(value)
