"""The paged allocator's prefix cache: full, computed blocks found again by content key.

A block enters the cache once a sequence has computed all of its tokens and it has a key
(`engines.block_keys`: only full prompt blocks do). From then on it is never written again:
every sharer's next write lies past it, so prefix hits need no copy-on-write. The first block
registered under a key wins; a duplicate computed in the same step stays private and is
freed as usual.

When no sequence references a cached block any more it is kept, not freed: it waits in an
LRU list, least recently released first, and a later request with the same prefix takes it
back (a hit). The allocator only evicts from that list when its plain free queue is empty,
so blocks holding reusable K/V outlive free ones. Sequences release their blocks last block
first, so a sequence's tail is evicted before its head, the part other requests are likeliest
to share (vLLM's order).

    free queue   [ 7  9  2 ]           never cached, taken first
    LRU          [ 4  5 | 1 ]          cached, unreferenced: 4 is evicted first
                   ^ released earliest
    referenced   { 0: key a, 3: key b, 6: (no key) }

The cache only keeps the mapping and the LRU order; reference counts stay with the allocator,
which calls `park` when a cached block's count drops to 0 and `revive` when a hit raises it
from 0.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import TypeVar

S = TypeVar("S")  # a sequence (anything with `num_computed`)


class PrefixCache:
    """Content key <-> block for cached blocks, and the LRU of the unreferenced ones."""

    def __init__(self) -> None:
        self._block_of: dict[int, int] = {}  # key -> block
        self._key_of: dict[int, int] = {}  # block -> key
        self._lru: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, oldest first
        self.evictions = 0  # blocks whose cached K/V was dropped to serve an allocation

    @property
    def num_evictable(self) -> int:
        return len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self._key_of)

    def holds(self, block: int) -> bool:
        return block in self._key_of

    def key_of(self, block: int) -> int | None:
        return self._key_of.get(block)

    def match(self, keys: Iterable[int]) -> list[int]:
        """Blocks of the longest run of leading keys that are cached."""
        hits = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def find(self, key: int) -> int | None:
        """The block cached under `key`, if any."""
        return self._block_of.get(key)

    def oldest(self) -> Iterator[int]:
        """Unreferenced cached blocks, least recently released first (the eviction order).

        Why: an allocator whose pages hold blocks of several groups (`engines.hybrid_prefix`)
        cannot always use the oldest block; it picks the oldest one that frees what it needs.
        Do not `drop` while iterating."""
        return iter(self._lru)

    def is_evictable(self, block: int) -> bool:
        return block in self._lru

    def register(self, block: int, key: int) -> bool:
        """Cache a referenced, computed block under `key`; False if the key is already cached."""
        if key in self._block_of:
            return False
        assert block not in self._key_of, f"block {block} is cached twice"
        self._block_of[key] = block
        self._key_of[block] = key
        return True

    def park(self, block: int) -> None:
        """The block's last reference went: keep its K/V, evictable, as the most recent."""
        self._lru[block] = None

    def revive(self, block: int) -> None:
        """A hit on an unreferenced block: it is in use again, out of the LRU."""
        del self._lru[block]

    def evict(self) -> tuple[int, int]:
        """Drop the least recently released block from the cache: `(block, key it held)`."""
        block, _ = self._lru.popitem(last=False)
        key = self._key_of.pop(block)
        del self._block_of[key]
        self.evictions += 1
        return block, key

    def drop(self, block: int) -> int:
        """Evict this unreferenced cached block (not necessarily the oldest): the key it held."""
        del self._lru[block]
        key = self._key_of.pop(block)
        del self._block_of[key]
        self.evictions += 1
        return key

    def restore(self, block: int, key: int) -> None:
        """Undo the latest `evict` (a multi-step segment trimmed): back at the LRU's front."""
        self._block_of[key] = block
        self._key_of[block] = key
        self._lru[block] = None
        self._lru.move_to_end(block, last=False)
        self.evictions -= 1

    def check_integrity(self, refs: list[int]) -> None:
        """Keys and blocks map one to one; the LRU holds exactly the unreferenced cached blocks."""
        assert len(self._block_of) == len(self._key_of), "key and block maps differ in size"
        for key, block in self._block_of.items():
            assert self._key_of.get(block) == key, f"block {block} does not map back to its key"
        unreferenced = {block for block in self._key_of if refs[block] == 0}
        assert set(self._lru) == unreferenced, "the LRU is not the unreferenced cached blocks"


def take_computed(pending: dict[S, int], keys: dict[S, tuple], block_size: int) -> list[tuple[S, int, int]]:
    """The keyed blocks `[start, end)` each pending sequence has computed since the last call,
    `pending` (sequence -> first block not yet registered) moved past them: a sequence whose
    keyed blocks are all computed leaves it. `keys`: each sequence's block keys. What both
    prefix-caching allocators register after a step (one table, or one per KV group)."""
    ranges = []
    for seq, start in list(pending.items()):
        count = len(keys[seq])
        end = min(count, seq.num_computed // block_size)
        if end == count:
            del pending[seq]
        elif end > start:
            pending[seq] = end
        if end > start:
            ranges.append((seq, start, end))
    return ranges
