"""The KV memory of a real `hybrid` or `jenga` run: one buffer of the pool's bytes, a view per layer.

The allocators of `engines.hybrid` carve every KV group's blocks out of ONE pool of pages
taken from one budget (vLLM v1: equal pages, a block of group g being m_g of them; Jenga: pages
of the groups' LCM split into one group's blocks). So the real run allocates exactly that pool:
one device buffer of `pool.num_pages x pool.page_bytes` bytes (the budget less the tail no page
can use; in the run's dtype, scaled as `KVArena` scales the spec's 2-byte sizing), and gives each
layer a K view and a V view `[slots, Hkv, D]` over it whose slot stride is its table's bytes a
token (`engines.hybrid.TableLayout`): a layer reads and writes through its own group's table,
`slot = block x block_size + offset`, as the kernels address any paged arena. Two groups'
blocks never share a byte because the pool never hands the same page (or page slice) to two
blocks; `tests/test_hybrid_real.py` checks it from the allocator's own bookkeeping.

A table entry of a block a window group freed is -1: the window kernels start reading at the
block holding the window's first position, which is never freed, so it is never dereferenced.
"""

from __future__ import annotations

import torch

from engines.hybrid import TableLayout
from kvbench.errors import KvbenchError
from kvbench.models import ModelSpec


class GroupedKVArena:
    """`k[layer]`, `v[layer]` `[slots of its table, Hkv, D]` views of one buffer; `table_of[layer]`
    says which of the allocator's `memory_tables` the layer reads."""

    def __init__(
        self, spec: ModelSpec, layout: tuple[TableLayout, ...], block_size: int, pool_bytes: int,
        num_slots: int, dtype: torch.dtype, device: torch.device,
    ) -> None:  # fmt: skip
        if spec.mla is not None:
            raise KvbenchError(f"--model {spec.name}: KV groups of latent (MLA) layers are not decoded")
        unit = spec.dtype_bytes  # the spec sizes K/V in these bytes; the buffer holds elements of `dtype`
        heads, dim = spec.num_kv_heads, spec.head_dim
        self.layout = layout
        self.num_slots = num_slots  # the budget in slots, as `KVArena` reports it
        self.buffer = torch.zeros(pool_bytes // unit, dtype=dtype, device=device)  # [elements]
        k: list[torch.Tensor | None] = [None] * spec.num_layers
        v: list[torch.Tensor | None] = [None] * spec.num_layers
        table_of = [-1] * spec.num_layers
        for index, table in enumerate(layout):
            slots, stride = table.num_blocks * block_size, table.token_bytes // unit
            assert slots * table.token_bytes <= pool_bytes, "a table addresses past the pool"
            for layer, offset in table.layers:
                first = offset // unit
                k[layer] = self.buffer.as_strided((slots, heads, dim), (stride, dim, 1), first)
                v[layer] = self.buffer.as_strided((slots, heads, dim), (stride, dim, 1), first + heads * dim)
                table_of[layer] = index
        assert all(t >= 0 for t in table_of), "a layer in no table"
        self.k: list[torch.Tensor] = k  # type: ignore[assignment]
        self.v: list[torch.Tensor] = v  # type: ignore[assignment]
        self.table_of = tuple(table_of)
        self._unit = unit

    @classmethod
    def for_allocator(
        cls, spec: ModelSpec, allocator, dtype: torch.dtype, device: torch.device
    ) -> GroupedKVArena:
        """The buffer of `allocator`'s pool (a `HybridAllocator` or `JengaAllocator`)."""
        pool = allocator.pool
        return cls(
            spec, allocator.memory_layout(), allocator.block_size, pool.num_pages * pool.page_bytes,
            allocator.num_slots, dtype, device,
        )  # fmt: skip

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    @property
    def num_tables(self) -> int:
        return len(self.layout)

    def fill(self, value: float) -> None:
        """Poison every byte (tests: a read of memory nothing wrote shows)."""
        self.buffer.fill_(value)

    def copy_bytes(self, source: list[tuple[int, int]], target: list[tuple[int, int]]) -> None:
        """Copy the spec-sized byte ranges `source` onto `target` (a copy-on-write block's memory)."""
        u = self._unit
        for (src, n), (dst, m) in zip(source, target, strict=True):
            assert n == m, "a block copied onto one of another size"
            self.buffer[dst // u : (dst + n) // u] = self.buffer[src // u : (src + n) // u]
