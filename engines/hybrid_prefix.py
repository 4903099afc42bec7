"""Prefix caching for the hybrid allocators (`hybrid-prefix`, `jenga-prefix`), as vLLM v1 does it.

Every KV group caches its computed full prompt blocks by content (the chained keys of
`engines.block_keys`, one key space per group), and keeps them when no sequence references them
any more, evictable, least recently released first (`engines.prefix_cache`, as `paged-prefix`).
What a new request can reuse depends on the group:

- a full-attention group needs every block before the hit point: its hit is the longest run of
  leading cached blocks;
- a window group (window W) never reads a block lying wholly before the window of the first token
  it computes: a hit at P tokens needs only the blocks covering positions [P - W + 1, P), the
  ones it would still hold had it computed the prefix itself (`blocks_behind_window`).

The request's hit P is the longest (a multiple of the block size, at most the blocks before the
last prompt token, as `paged-prefix`) that every group serves; a window group takes references
on the blocks of its window only, its entries below it null as if freed by the window. Each
group's reused tokens are recorded per request at first admission (`prefix_hits_by_group`).

    prompt blocks        0    1    2    3    4    5  | 6 (last token)
    full group cached    a    b    c    d    e    -
    window group cached  -    -    x    y    z    w       (W = 2 blocks + 1 token)
    hit P = 5 blocks: full takes a..e; window takes y, z (blocks 3-4), entries 0-2 null

A block is registered once the sequence has computed it, before a window frees it, so a
sequence's blocks stay cached when the window moves on. Cached blocks are full and never
written again, so hits need no copy-on-write; `_dup` counts their references beyond the first
(as `paged-prefix`), which keeps multi-step segments and the closed-form footprint on.
How a parked block is evicted, and counted, is the pool's (`engines.caching_pages`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from engines.block_keys import block_keys
from engines.caching_pages import CachingEqualPages, CachingLcmPages
from engines.hybrid import GroupShape, Table, _GroupedAllocator, blocks_behind_window
from engines.prefix_cache import PrefixCache, take_computed
from kvbench.kvspec.layers import KVGroup
from kvbench.metrics.occupancy import Footprint
from kvbench.sequence import Sequence


def group_names(shapes: Seq[GroupShape]) -> tuple[str, ...]:
    """A name per KV group for reports: `full`, `window-512`; `#g` added where two would clash."""
    names = [f"window-{s.window}" if s.window else "full" for s in shapes]
    return tuple(f"{n}#{g}" if names.count(n) > 1 else n for g, n in enumerate(names))


@dataclass(frozen=True)
class Hit:
    """What a sequence would start with: `blocks` cached blocks of every group's view of it."""

    blocks: int  # the hit P in blocks (P = blocks x block_size tokens)
    tables: tuple[
        tuple[int | None, ...], ...
    ]  # per group: its first `blocks` entries (None: below the window)

    def taken(self) -> list[tuple[int, int]]:
        """(group, block) of every block the hit references."""
        return [(g, b) for g, table in enumerate(self.tables) for b in table if b is not None]


def window_serves(found: Seq[int | None], first: int, blocks: int) -> bool:
    """Whether cached blocks `found` (None: not cached) hold all of [first, blocks)."""
    return all(found[j] is not None for j in range(first, blocks))


class _PrefixGroupedAllocator(_GroupedAllocator):
    """`_GroupedAllocator` whose computed prompt blocks stay findable by content; see the module."""

    def __init__(
        self, num_slots: int, block_size: int, groups: Seq[KVGroup] = (), watermark: float = 0.01,
        hash_block_size: int | None = None, step_tokens: int = 0,
    ) -> None:  # fmt: skip
        super().__init__(num_slots, block_size, groups, watermark, step_tokens)
        self.hash_block_size = hash_block_size
        self.cache = PrefixCache()  # one key space per group: `_key(g, key)`
        self.group_names = group_names(self.shapes)
        self._keys: dict[Sequence, tuple[int, ...]] = {}  # block keys of resident (or asked-about) sequences
        self._pending: dict[Sequence, int] = {}  # first keyed block of a resident sequence not yet registered
        self._dup = [0] * self.num_groups  # per group: references to cached blocks beyond the first
        # request id -> tokens each group reused at the request's first admission
        self.prefix_hits_by_request: dict[int, tuple[int, ...]] = {}

    # --- hits ------------------------------------------------------------------------------------
    def _key(self, group: int, key: int) -> int:
        return hash((group, key))

    def _keys_of(self, seq: Sequence) -> tuple[int, ...]:
        keys = self._keys.get(seq)
        if keys is None:
            keys = self._keys[seq] = block_keys(seq.request, self.block_size, self.hash_block_size)
        return keys

    def _hit(self, seq: Sequence) -> Hit:
        """The longest hit every group serves (module docstring), before the sequence's last token."""
        keys = self._keys_of(seq)[: (seq.num_tokens - 1) // self.block_size]
        limit = len(keys)  # the full groups' shortest leading run bounds the hit
        for g, shape in enumerate(self.shapes):
            if not shape.window:
                limit = len(self.cache.match(self._key(g, k) for k in keys[:limit]))
        found = [[self.cache.find(self._key(g, k)) for k in keys[:limit]] for g in range(self.num_groups)]
        for blocks in range(limit, -1, -1):
            firsts = [blocks_behind_window(s, self.block_size, blocks * self.block_size) for s in self.shapes]
            if all(window_serves(f, first, blocks) for f, first in zip(found, firsts, strict=True)):
                tables = tuple(
                    (None,) * first + tuple(f[first:blocks]) for f, first in zip(found, firsts, strict=True)
                )
                return Hit(blocks, tables)
        raise AssertionError("a hit of 0 blocks is always served")

    # --- admission -------------------------------------------------------------------------------
    def can_allocate(self, seq: Sequence) -> bool:
        return self.can_allocate_all([seq])

    def can_allocate_all(self, seqs: Seq[Sequence]) -> bool:
        self._register_computed()
        self._slide_all()
        # one phase per sequence, in the order `allocate` will take them: its hits' parked blocks
        # (each once: a later sequence finds them referenced), then its new blocks. The members of
        # a group share their prompt, hence their hits: a member's takes never evict a later one's.
        phases, revived = [], set()
        for seq in seqs:
            hit = self._hit(seq)
            parked = [(g, b) for g, b in hit.taken() if b not in self._refs and b not in revived]
            revived.update(b for _, b in parked)
            phases.append((self._new_blocks(seq, hit), parked))
        return self.pool.admits(phases, self.watermark_pages)

    def _fits_each(self, needs: Seq[Seq[int]]) -> bool:
        # where a block comes from depends on what the blocks before it took (`CachingLcmPages`):
        # replayed sequence by sequence, in the order `append` takes them
        return self.pool.admits([(need, ()) for need in needs], 0)

    def allocate(self, seq: Sequence) -> None:
        assert seq not in self._tables, f"seq {seq.seq_id} is already resident"
        self._register_computed()
        hit = self._hit(seq)
        tables: list[Table] = [list(t) for t in hit.tables]
        for _, block in hit.taken():  # hits first: what the admission check counted
            self._ref(block)
        for g, (table, new) in enumerate(zip(tables, self._new_blocks(seq, hit), strict=True)):
            table.extend(self._take(g) for _ in range(new))
        self._tables[seq] = tables
        firsts = [t.count(None) for t in hit.tables]
        self._skipped[seq] = firsts
        if self._memory is not None:
            self._memory[seq] = self._memory_rows(tables)
            self._touch(seq)
        seq.num_computed = hit.blocks * self.block_size
        if not seq.num_preemptions:  # first admission: what the request found cached
            seq.num_cached_tokens = seq.num_computed
            self.prefix_hits_by_request[seq.request.request_id] = tuple(
                (hit.blocks - first) * self.block_size for first in firsts
            )
        if len(self._keys_of(seq)) > hit.blocks:
            self._pending[seq] = hit.blocks

    def _new_blocks(self, seq: Sequence, hit: Hit) -> list[int]:
        """Blocks each group takes past the hit's at admission: up to its `target_blocks`, the
        hit's tokens counting as computed."""
        computed = hit.blocks * self.block_size
        return [self.target_blocks(g, seq.num_tokens, computed) - hit.blocks for g in range(self.num_groups)]

    def prefix_hits_by_group(self, request_ids: Seq[int]) -> dict[str, int]:
        """Tokens each group reused at the first admission of these requests, by group name."""
        totals = [0] * self.num_groups
        for rid in request_ids:
            hits = self.prefix_hits_by_request.get(rid)
            if hits is not None:
                totals = [t + h for t, h in zip(totals, hits, strict=True)]
        return dict(zip(self.group_names, totals, strict=True))

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int, int]]:
        self._register_computed()
        copies = super().fork(parent, child)
        self._keys[child] = self._keys_of(parent)  # the same blocks hold the same content
        return copies

    def free(self, seq: Sequence) -> None:
        self._register_computed()
        super().free(seq)
        self._keys.pop(seq, None)
        self._pending.pop(seq, None)

    def _slide(self, seq: Sequence) -> None:
        self._register_computed()  # before the window frees them: computed blocks stay cached
        super()._slide(seq)

    # --- registration ----------------------------------------------------------------------------
    def _register_computed(self) -> None:
        """Cache the keyed blocks that resident sequences have computed since the last call."""
        for seq, start, end in take_computed(self._pending, self._keys, self.block_size):
            keys = self._keys[seq]
            for g, table in enumerate(self._tables[seq]):
                for index in range(start, end):
                    if table[index] is not None:
                        self._register(g, table[index], keys[index])

    def _register(self, group: int, block: int, key: int) -> None:
        if self.cache.holds(block) or not self.cache.register(block, self._key(group, key)):
            return  # already cached (a forked table), or another block won the key
        refs = self._refs[block]
        if refs > 1:  # shared before it was cached (a fork): no longer a copy-on-write candidate
            self._num_shared -= 1
            self._dup[group] += refs - 1

    # --- blocks ----------------------------------------------------------------------------------
    def _take(self, g: int) -> int:
        for block in self.pool.victims(g, self.cache.oldest()):
            self._evict(block)
        return super()._take(g)

    def _evict(self, block: int) -> None:
        """Drop a parked block's K/V: out of the cache, its memory back to the pool."""
        self.cache.drop(block)
        self.pool.evict(self._group_of.pop(block), block)

    def _ref(self, block: int) -> None:
        if not self.cache.holds(block):
            super()._ref(block)
        elif block in self._refs:
            self._refs[block] += 1
            self._dup[self._group_of[block]] += 1
        else:  # a hit on a parked block
            self.cache.revive(block)
            self.pool.revive(self._group_of[block], block)
            self._refs[block] = 1

    def _unref(self, block: int) -> None:
        if not self.cache.holds(block):
            super()._unref(block)
            return
        self._refs[block] -= 1
        if self._refs[block]:
            self._dup[self._group_of[block]] -= 1
        else:  # parked: stays cached, in its pages, evictable
            del self._refs[block]
            self.cache.park(block)
            self.pool.park(self._group_of[block], block)

    # --- occupancy -------------------------------------------------------------------------------
    def footprint(self) -> Footprint:
        fp = super().footprint()
        if self._num_shared or not any(self._dup):
            return fp  # counted block by block (each once), or nothing counted twice
        # full computed prompt blocks, in every sharer's tokens and target
        twice = sum(d * slots for d, slots in zip(self._dup, self._block_slots, strict=True))
        return Footprint(fp.tokens - twice, fp.target - twice, fp.asked - twice, fp.granted - twice)

    def sharing_saved(self) -> int:
        if self._num_shared:
            return super().sharing_saved()  # every shared block, cached ones included
        return round(sum(d * slots for d, slots in zip(self._dup, self._block_slots, strict=True)))

    def _check_shared(self, refs: dict[int, int]) -> None:
        cache = self.cache
        cache.check_integrity(Counter(refs))
        assert self._num_shared == sum(r > 1 and not cache.holds(b) for b, r in refs.items()), "shared count"
        dup = [0] * self.num_groups
        for block, r in refs.items():
            if cache.holds(block):
                dup[self._group_of[block]] += r - 1
        assert dup == self._dup, "_dup wrong"
        parked = {b: g for b, g in self._group_of.items() if b not in refs}
        assert all(cache.is_evictable(b) for b in parked), "an unreferenced block is not parked"
        assert len(parked) == cache.num_evictable, "a parked block is not held"
        self.pool.check_parked(parked)
        assert set(self._pending) <= set(self._tables), "a pending sequence is not resident"
        for seq, tables in self._tables.items():
            keys = self._keys[seq]
            for g, table in enumerate(tables):
                for index, block in enumerate(table):
                    key = None if block is None else cache.key_of(block)
                    if key is not None:  # a cached block holds this sequence's content, computed
                        assert index < len(keys) and key == self._key(g, keys[index]), f"block {block}"
                        assert seq.num_computed >= (index + 1) * self.block_size, f"block {block} uncomputed"


class HybridPrefixAllocator(_PrefixGroupedAllocator):
    """`hybrid` (vLLM v1's equal-byte pages) with prefix caching per KV group."""

    pool_class = CachingEqualPages


class JengaPrefixAllocator(_PrefixGroupedAllocator):
    """`jenga` (LCM pages of one group each) with prefix caching per KV group."""

    pool_class = CachingLcmPages
