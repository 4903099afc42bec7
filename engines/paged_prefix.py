"""Paged allocation with automatic prefix caching (vLLM's): requests reuse computed prompt blocks.

Every full prompt block has a content key (`engines.block_keys`). Once a sequence has
computed a keyed block, the block is registered in the `PrefixCache`; a later sequence whose
prompt starts with the same keys takes those blocks by reference instead of computing them,
and starts with `num_computed` at the cached tokens. Blocks nobody references any more stay
cached until an allocation finds the free queue empty and evicts the least recently released.

Admission rules (as vLLM's):

- The hit is the longest run of leading cached blocks, but at most the blocks lying entirely
  before the sequence's last token: a step must compute at least one token to sample from,
  so a prompt that hits completely recomputes its last block.
- A hit costs no new block, but a hit on an unreferenced cached block takes that block out
  of the evictable pool, so `can_allocate` counts it against the free blocks like a new one.
- A block is registered after the step that computes it (when `num_computed` covers it), so
  sequences admitted in the same step do not share what none of them has computed yet.

Cached blocks are full and never written again (a sequence only writes at `num_computed` and
beyond, and hits lie before it), so hits need no copy-on-write; the parent class's copy-on-write
count (`_num_shared`) leaves them out and `_dup` counts their extra references instead, so the
fast paths (multi-step segments, the closed-form footprint) stay on under prefix sharing.
Preemption by recompute releases a sequence's blocks into the LRU, so its re-admission usually
hits its own prompt; blocks brought back by swap-in are registered again where their key is
no longer cached.
"""

from __future__ import annotations

from engines.block_keys import block_keys
from engines.paged import PagedAllocator
from engines.prefix_cache import PrefixCache, take_computed
from kvbench.metrics.occupancy import Footprint
from kvbench.sequence import Sequence


class PrefixCachingAllocator(PagedAllocator):
    """`PagedAllocator` whose freed full prompt blocks stay findable by content. See the module."""

    def __init__(
        self, num_slots: int, block_size: int, watermark: float = 0.01, host_blocks: int = 0,
        hash_block_size: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__(num_slots, block_size, watermark, host_blocks)
        self.hash_block_size = hash_block_size  # tokens per `Request.block_hashes` entry
        self.cache = PrefixCache()
        self._keys: dict[Sequence, tuple[int, ...]] = {}  # block keys of resident (or asked-about) sequences
        self._pending: dict[Sequence, int] = {}  # first keyed block of a resident sequence not yet registered
        self._dup = 0  # references to cached blocks beyond the first (each a full, shared block)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self.cache.num_evictable

    def can_allocate(self, seq: Sequence) -> bool:
        self._register_computed()
        hits = self._hits(seq)
        revived = sum([self._refs[block] == 0 for block in hits])
        need = self.blocks_for(seq.num_tokens) - len(hits) + revived
        return self.num_free_blocks - need >= self.watermark_blocks

    def allocate(self, seq: Sequence) -> None:
        assert seq not in self._tables, f"seq {seq.seq_id} is already resident"
        self._register_computed()
        hits = self._hits(seq)
        for block in hits:
            self._ref(block)
        table = hits + [self._take() for _ in range(self.blocks_for(seq.num_tokens) - len(hits))]
        self._tables[seq] = table
        self._target += self._target_of(seq, len(table))
        seq.num_computed = len(hits) * self.block_size
        if not seq.num_preemptions:  # first admission: what the request found cached
            seq.num_cached_tokens = seq.num_computed
        if len(self._keys[seq]) > len(hits):
            self._pending[seq] = len(hits)

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int, int]]:
        self._register_computed()
        copies = super().fork(parent, child)
        self._keys[child] = self._keys[parent]  # the same blocks hold the same content
        return copies

    def free(self, seq: Sequence) -> None:
        self._register_computed()
        super().free(seq)
        self._forget(seq)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        self._register_computed()
        copies = super().swap_out(seq)
        self._forget(seq)
        return copies

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        copies = super().swap_in(seq)
        self._keys[seq] = self._keys_of(seq)
        self._pending[seq] = 0  # computed blocks again: cache those whose key was evicted meanwhile
        return copies

    def footprint(self) -> Footprint:
        fp = super().footprint()
        if self._num_shared or not self._dup:
            return fp  # counted block by block (each once), or nothing counted twice
        twice = self._dup * self.block_size  # full blocks, in every sharer's tokens and target
        return Footprint(fp.tokens - twice, fp.target - twice, fp.asked, fp.granted)

    def sharing_saved(self) -> int:
        if self._num_shared:
            return super().sharing_saved()  # counts every shared block, cached ones included
        return self._dup * self.block_size

    def _hits(self, seq: Sequence) -> list[int]:
        """Cached blocks the sequence would start with: leading, before its last token."""
        keys = self._keys.get(seq)
        if keys is None:
            keys = self._keys[seq] = self._keys_of(seq)
        return self.cache.match(keys[: (seq.num_tokens - 1) // self.block_size])

    def _keys_of(self, seq: Sequence) -> tuple[int, ...]:
        return block_keys(seq.request, self.block_size, self.hash_block_size)

    def _forget(self, seq: Sequence) -> None:
        self._keys.pop(seq, None)
        self._pending.pop(seq, None)

    def _register_computed(self) -> None:
        """Cache the keyed blocks that resident sequences have computed since the last call."""
        for seq, start, end in take_computed(self._pending, self._keys, self.block_size):
            keys, table = self._keys[seq], self._tables[seq]
            for index in range(start, end):
                self._register(table[index], keys[index])

    def _register(self, block: int, key: int) -> None:
        if self.cache.holds(block) or not self.cache.register(block, key):
            return  # already cached (a swapped-in or forked table), or another block won the key
        refs = self._refs[block]
        if refs > 1:  # shared before it was cached (a fork): no longer a copy-on-write candidate
            self._num_shared -= 1
            self._dup += refs - 1

    def _ref(self, block: int) -> None:
        if not self.cache.holds(block):
            super()._ref(block)
            return
        if self._refs[block]:
            self._dup += 1
        else:
            self.cache.revive(block)  # a hit on an unreferenced block
        self._refs[block] += 1

    def _unref(self, block: int) -> None:
        if not self.cache.holds(block):
            super()._unref(block)
            return
        self._refs[block] -= 1
        if self._refs[block]:
            self._dup -= 1
        else:
            self.cache.park(block)

    def _take(self) -> int:
        if self._free:
            return super()._take()
        block, _ = self.cache.evict()
        self._refs[block] = 1
        return block

    def _take_undoable(self) -> tuple[int, int | None]:
        if self._free:
            return super()._take(), None
        block, key = self.cache.evict()
        self._refs[block] = 1
        return block, key

    def _give_back(self, block: int, undo: int | None) -> None:
        if undo is None:
            super()._give_back(block, undo)
            return
        self._refs[block] = 0
        self.cache.restore(block, undo)

    def _check_unreferenced(self, refs: list[int]) -> None:
        """Unreferenced blocks are free or evictable, never both; counters and keys agree."""
        cache, bs = self.cache, self.block_size
        cache.check_integrity(refs)
        free = set(self._free)
        assert len(free) == len(self._free), "a block is free twice"
        assert not any(cache.holds(block) for block in free), "a free block is cached"
        idle = {b for b, r in enumerate(refs) if r == 0}
        assert free | {b for b in idle if cache.is_evictable(b)} == idle, "free and evictable != unreferenced"
        assert self._num_shared == sum(r > 1 and not cache.holds(b) for b, r in enumerate(refs))
        assert self._dup == sum(r - 1 for b, r in enumerate(refs) if r and cache.holds(b)), "_dup wrong"
        assert set(self._pending) <= set(self._tables), "a pending sequence is not resident"
        for seq, table in self._tables.items():
            keys = self._keys[seq]
            for index, block in enumerate(table):
                key = cache.key_of(block)
                if key is not None:  # a cached block holds this sequence's content, computed
                    assert index < len(keys) and keys[index] == key, f"seq {seq.seq_id}: block {block}"
                    assert seq.num_computed >= (index + 1) * bs, f"seq {seq.seq_id}: block {block} uncomputed"
