"""The KV arena on the device: allocated once, carved up by the engine's allocator.

Layout, per layer: `k[layer]` and `v[layer]` are `[num_slots, kv_heads, head_dim]`; a token's
slot holds its K and V in every layer, so one slot costs `ModelSpec.kv_bytes_per_token`::

    k: [num_layers, num_slots, kv_heads, head_dim]      slot s = one token's keys
    v: [num_layers, num_slots, kv_heads, head_dim]

Paged engines see the slots as blocks (`slot = block * block_size + offset`), contiguous
engines as extents (`slot = start + position`); the memory is the same. Under tensor
parallelism each rank's arena has the same slots and its own KV heads (`Hkv / N`), so a slot
is still one token of the whole model.

MLA (DeepSeek) keeps no K and V per head: a token's slot in each layer holds its normalised
latent and rotated rope key, `kv_lora_rank + qk_rope_head_dim` values that every head reads
(`kvbench/modeling/mla.py`). Those live in `k` as one vector, `[L, S, 1, latent + rope]`, and
`v` is empty (`[L, S, 1, 0]`): the values are the latent itself, read from `k`. One tensor
rather than two keeps every user of `arena.k[:, slots]`/`arena.v[:, slots]` (copies, swaps,
poisoning) unchanged, and a slot costs what the spec's `LatentAttention` says.
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
        v_shape = shape
        if spec.mla is not None:  # the latent and rope key, shared by all heads (and by all ranks)
            shape = (spec.num_layers, num_slots, 1, spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim)
            v_shape = (spec.num_layers, num_slots, 1, 0)
        self.num_slots = num_slots
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, S, Hkv, D]
        self.v = torch.zeros(v_shape, dtype=dtype, device=device)  # [L, S, Hkv, D]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def fill(self, value: float) -> None:
        """Poison every slot (tests check that nothing writes outside a request's slots)."""
        self.k.fill_(value)
        self.v.fill_(value)
