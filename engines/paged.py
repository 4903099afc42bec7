"""Paged allocation (vLLM): fixed-size blocks on demand, block tables, reference counts.

A sequence holds only the blocks its computed tokens need, plus at most one partly filled
last block, so nearly every held slot stores a token. Blocks are shared by reference
count (`fork`); writing into a shared block first copies it (copy-on-write).

Free blocks sit in a FIFO queue: allocation takes from the front, and a freed sequence
returns its blocks to the back, last block first. The order is irrelevant to occupancy
(any free block serves any need, so paging has no external fragmentation), but fixing it
makes block ids exact in tests, and it is the order a prefix cache wants: a sequence's
head blocks, the likeliest to be shared, are the last to be reused. The prefix-caching
subclass (`engines.paged_prefix`) keeps freed blocks that hold reusable K/V in an LRU beside
this queue; everything here that counts free blocks counts those too (`num_free_blocks`).

Arena layout (block_size 4, num_slots 18 -> 4 blocks, 2 tail slots nobody can use)::

    slot  0  1  2  3 | 4  5  6  7 | 8  9 10 11 |12 13 14 15 |16 17
    block     0      |     1      |     2      |     3      | tail
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence as Seq

import numpy as np

from engines.allocator import BlockTable, shared_holders
from kvbench.metrics.occupancy import Footprint, Growth
from kvbench.requests import Request
from kvbench.sequence import Sequence

_NO_COPIES: list[tuple[int, int]] = []  # returned, never mutated: most appends copy nothing


class PagedAllocator:
    """Blocks of `block_size` slots from a FIFO free queue. See `KVAllocator`.

    `watermark` (fraction of blocks, vLLM's default 0.01) is kept free at admission so
    that running sequences can grow a while before someone must be preempted.
    """

    def __init__(
        self, num_slots: int, block_size: int, watermark: float = 0.01, host_blocks: int = 0
    ) -> None:
        self.num_slots = num_slots
        self.block_size = block_size
        self.num_blocks = num_slots // block_size
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.num_host_blocks = host_blocks  # swap space in host memory, in blocks
        self._host_free: deque[int] = deque(range(host_blocks))
        self._swapped: dict[Sequence, list[int]] = {}  # host block tables of swapped-out sequences
        self._free: deque[int] = deque(range(self.num_blocks))
        self._refs = [0] * self.num_blocks
        self._tables: dict[Sequence, list[int]] = {}
        self._num_shared = 0  # blocks with more than one reference
        self._target = 0  # sum over sequences of min(final length, slots in their table)
        # growth_horizon's crossing list, reused by the grow() that follows for the same batch
        self._plan: tuple[Seq[Sequence] | None, list[tuple[int, int]]] = (None, [])
        # last grow's (step, table, target added, what `_give_back` needs to undo the take)
        self._grown: list[tuple[int, list[int], int, int | None]] = []

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now."""
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_ever_hold(self, request: Request) -> bool:
        # a beam group's k beams run together and, at worst, share nothing
        return self.blocks_for(request.kv_len) * request.beam_width <= self.num_blocks - self.watermark_blocks

    def can_allocate(self, seq: Sequence) -> bool:
        need = self.blocks_for(seq.num_tokens)
        return self.num_free_blocks - need >= self.watermark_blocks

    def can_allocate_all(self, seqs: Seq[Sequence]) -> bool:
        need = sum([self.blocks_for(seq.num_tokens) for seq in seqs])
        return self.num_free_blocks - need >= self.watermark_blocks

    def allocate(self, seq: Sequence) -> None:
        assert seq not in self._tables, f"seq {seq.seq_id} is already resident"
        table = [self._take() for _ in range(self.blocks_for(seq.num_tokens))]
        self._tables[seq] = table
        self._target += self._target_of(seq, len(table))

    def can_append(self, seq: Sequence) -> bool:
        table = self._tables[seq]
        need = -(-seq.num_tokens // self.block_size) - len(table)
        if self._num_shared:
            need += len(self._shared_written(seq, table))
        return self.num_free_blocks >= need

    def append(self, seq: Sequence) -> list[tuple[int, int]]:
        table = self._tables[seq]
        copies = self._copy_on_write(seq, table) if self._num_shared else _NO_COPIES
        need = -(-seq.num_tokens // self.block_size)
        if len(table) < need:
            self._target += self._target_of(seq, need) - self._target_of(seq, len(table))
            table.extend(self._take() for _ in range(need - len(table)))
        return copies

    def append_all(self, seqs: Seq[Sequence]) -> list[tuple[int, int]] | None:
        if self._num_shared:
            return None  # copy-on-write is decided sequence by sequence
        bs, tables = self.block_size, self._tables
        needy = [seq for seq in seqs if -(-seq.num_tokens // bs) > len(tables[seq])]
        if sum([-(-seq.num_tokens // bs) - len(tables[seq]) for seq in needy]) > self.num_free_blocks:
            return None
        for seq in needy:
            self.append(seq)
        return []

    def _copy_on_write(self, seq: Sequence, table: list[int]) -> list[tuple[int, int]]:
        copies = []
        for index in self._shared_written(seq, table):
            old, new = table[index], self._take()
            self._unref(old)
            table[index] = new
            copies.append((old, new))
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int, int]]:
        """Let `child` share every block of `parent` (parallel sampling, beam search)."""
        assert child not in self._tables, f"seq {child.seq_id} is already resident"
        table = self._tables[parent]
        for block in table:
            self._ref(block)
        self._tables[child] = list(table)
        self._target += self._target_of(child, len(table))
        return []  # shared, not copied: the first write into a shared block copies it

    def free(self, seq: Sequence) -> None:
        table = self._tables.pop(seq)
        self._target -= self._target_of(seq, len(table))
        for block in reversed(table):
            self._unref(block)

    def can_swap_out(self, seq: Sequence) -> bool:
        """Room in host memory for the sequence's blocks (shared blocks are recomputed instead)."""
        table = self._tables[seq]
        return len(self._host_free) >= len(table) and all(self._refs[b] == 1 for b in table)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move the sequence's blocks to host memory; `(device block, host block)` to copy first."""
        table = self._tables.pop(seq)
        self._target -= self._target_of(seq, len(table))
        host = [self._host_free.popleft() for _ in table]
        self._swapped[seq] = host
        for block in reversed(table):
            self._unref(block)
        return list(zip(table, host, strict=True))

    def can_swap_in(self, seq: Sequence) -> bool:
        """Room on the device for the swapped blocks and the next token, above the watermark."""
        need = max(len(self._swapped[seq]), self.blocks_for(seq.num_tokens))
        return self.num_free_blocks - need >= self.watermark_blocks

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring the sequence back; `(host block, device block)` to copy before it runs."""
        host = self._swapped.pop(seq)
        table = [self._take() for _ in host]
        self._tables[seq] = table
        self._target += self._target_of(seq, len(table))
        self._host_free.extend(host)
        return list(zip(host, table, strict=True))

    def growth_horizon(self, seqs: Seq[Sequence], max_steps: int) -> int:
        if self._num_shared:
            return 1  # copy-on-write is decided step by step
        firsts = self._first_crossings(seqs)
        self._plan = (seqs, firsts)
        # the n-th new block (0-based) is needed at step firsts[n % B] + (n // B) * bs,
        # so the first allocation that would fail is the one numbered len(free)
        rounds, index = divmod(self.num_free_blocks, len(firsts))
        return min(max_steps, firsts[index][0] + rounds * self.block_size)

    def grow(self, seqs: Seq[Sequence], num_steps: int) -> Growth | None:
        planned, firsts = self._plan
        if planned is not seqs:
            firsts = self._first_crossings(seqs)
        self._plan = (None, [])
        self._grown = []
        if firsts[0][0] >= num_steps:
            return None
        asked = np.zeros(num_steps, dtype=np.int64)
        target = np.zeros(num_steps, dtype=np.int64)
        for offset in range(0, num_steps, self.block_size):
            for first, index in firsts:
                step = first + offset
                if step >= num_steps:
                    break
                seq = seqs[index]
                table = self._tables[seq]
                added = min(max(seq.request.kv_len - len(table) * self.block_size, 0), self.block_size)
                block, undo = self._take_undoable()
                table.append(block)
                self._target += added
                self._grown.append((step, table, added, undo))
                asked[step] += self.block_size
                target[step] += added
        return Growth(asked=asked, target=target)

    def trim(self, num_steps: int) -> None:
        # the last grow took its blocks from the front of the queue in step order; handing
        # the late ones back to the front in reverse order restores the queue exactly
        while self._grown and self._grown[-1][0] >= num_steps:
            _, table, added, undo = self._grown.pop()
            self._give_back(table.pop(), undo)
            self._target -= added
        self._grown = []  # the segment's allocations are final

    def footprint(self) -> Footprint:
        if self._num_shared:
            return self._footprint_shared()
        tokens = sum(seq.num_computed for seq in self._tables)
        used = (self.num_blocks - self.num_free_blocks) * self.block_size
        return Footprint(tokens, self._target, used, used)

    def sharing_saved(self) -> int:
        if not self._num_shared:
            return 0
        # the references past each referenced block's first: sum(refs - 1 for refs > 1), in two
        # C-level passes over the list rather than a Python loop per step (a beam-search run
        # called this every step over every block)
        refs = self._refs
        return (sum(refs) - (len(refs) - refs.count(0))) * self.block_size

    def shared_blocks(
        self, seqs: Seq[Sequence], below: int, group: int = 0
    ) -> list[tuple[int, tuple[Sequence, ...]]]:
        """`shared_holders` of `seqs`' tables (`engines.windows.shared_terms`). One table holds
        every KV group's K/V here, so `group` changes nothing."""
        tables = ((seq, self._tables.get(seq, ()), 0) for seq in seqs)
        return shared_holders(tables, self._refs.__getitem__, self.block_size, below)

    def external_frag(self, head: Sequence | None) -> int:
        return self.num_slots - self.num_blocks * self.block_size  # the tail past the last block

    def addressing(self, seq: Sequence) -> BlockTable:
        return BlockTable(tuple(self._tables[seq]), self.block_size)

    def block_lists(self, seqs: Seq[Sequence]) -> list[list[int]]:
        """`addressing`'s blocks of each of `seqs`, as the allocator's own lists: read them at
        once, never change or keep them (the next allocator call may change them).

        Why: a real decode segment reads every row's table (`kvbench.real.block_tables`); a tuple
        and a `BlockTable` per row took about 2 us each, 0.5 ms a segment at 256 rows
        (benchmarks/host_path.py), more than the update of the device table they feed.
        """
        tables = self._tables
        return [tables[seq] for seq in seqs]

    def check_integrity(self) -> None:
        refs = [0] * self.num_blocks
        ahead = Counter(id(grown[1]) for grown in self._grown)  # a segment in flight grew these
        for seq, table in self._tables.items():
            assert len(set(table)) == len(table), f"seq {seq.seq_id} maps a block twice"
            low, high = self.blocks_for(seq.num_computed), self.blocks_for(seq.num_tokens) + ahead[id(table)]
            assert low <= len(table) <= high, f"seq {seq.seq_id} holds {len(table)} blocks"
            for block in table:
                refs[block] += 1
        assert refs == self._refs, "reference counts differ from the block tables"
        self._check_unreferenced(refs)
        want = sum(self._target_of(seq, len(table)) for seq, table in self._tables.items())
        assert self._target == want, "target total out of date"
        held = [b for host in self._swapped.values() for b in host]
        assert sorted(held + list(self._host_free)) == list(range(self.num_host_blocks)), "host blocks lost"
        assert not set(self._swapped) & set(self._tables), "a sequence is both resident and swapped"

    def _check_unreferenced(self, refs: list[int]) -> None:
        """Free blocks are exactly the unreferenced ones; the shared count is up to date."""
        assert len(set(self._free)) == len(self._free), "a block is free twice"
        assert set(self._free) == {b for b, r in enumerate(refs) if r == 0}, "free set wrong"
        assert self._num_shared == sum(r > 1 for r in refs), "shared-block count wrong"
        if self._num_shared:
            assert self._footprint_shared() == self._footprint_by_blocks(), "shared footprint wrong"

    def _footprint_shared(self) -> Footprint:
        """`_footprint_by_blocks` in O(sequences + blocks), not O(table entries).

        Every block but a table's last is full, and wanted whole, in each table holding it. So
        per-sequence sums count each extra reference to a block `block_size` too often, except
        at blocks that are some sharer's last: those are corrected by what each such sharer
        fills (wants) against the most any sharer does, which is what counts once.
        """
        bs, refs = self.block_size, self._refs
        extra = self.sharing_saved()  # slots: extra references x block_size
        tokens = sum([seq.num_computed for seq in self._tables]) - extra
        target = self._target - extra
        lasts: dict[int, list[tuple[int, int]]] = {}  # shared block -> (filled, wanted) where it is last
        for seq, table in self._tables.items():
            if table and refs[table[-1]] > 1:
                start = (len(table) - 1) * bs
                filled = min(max(seq.num_computed - start, 0), bs)
                wanted = max(min(max(seq.request.kv_len - start, 0), bs), filled)
                lasts.setdefault(table[-1], []).append((filled, wanted))
        for block, entries in lasts.items():
            full = refs[block] > len(entries)  # some sharer holds it whole
            fills, wants = zip(*entries, strict=True)
            # taken off above: bs per extra reference; truly counted twice: all but the most
            tokens += (len(entries) - 1) * bs - (sum(fills) - (bs if full else max(fills)))
            target += (len(entries) - 1) * bs - (sum(wants) - (bs if full else max(wants)))
        used = (self.num_blocks - self.num_free_blocks) * bs
        return Footprint(tokens, target, used, used)

    def _footprint_by_blocks(self) -> Footprint:
        """Footprint counting each physical block once (the reference for shared blocks)."""
        fill: dict[int, int] = {}
        target: dict[int, int] = {}
        for seq, table in self._tables.items():
            for index, block in enumerate(table):
                start = index * self.block_size
                filled = min(max(seq.num_computed - start, 0), self.block_size)
                wanted = min(max(seq.request.kv_len - start, 0), self.block_size)
                fill[block] = max(fill.get(block, 0), filled)
                target[block] = max(target.get(block, 0), wanted, filled)
        used = len(fill) * self.block_size
        return Footprint(sum(fill.values()), sum(target.values()), used, used)

    def _first_crossings(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        """Sorted `(step, batch index)` of each sequence's next new block.

        After step 0's append a sequence with c computed tokens holds L blocks; step j
        writes position c + j, which needs block L at step L * bs - c (in 1..bs), and one
        more every `block_size` steps after that. Every sequence has the same stride, so
        round m of new blocks is this list shifted by m * bs: step-by-step appends make
        them in exactly this (step, batch index) order.
        """
        bs = self.block_size
        return sorted(
            (len(self._tables[seq]) * bs - seq.num_computed, index) for index, seq in enumerate(seqs)
        )

    def _target_of(self, seq: Sequence, num_blocks: int) -> int:
        return min(seq.request.kv_len, num_blocks * self.block_size)

    def _shared_written(self, seq: Sequence, table: list[int]) -> list[int]:
        """Indices of shared blocks that the next step writes into (copy them first)."""
        if not self._num_shared:
            return []
        first = seq.num_computed // self.block_size
        last = min(self.blocks_for(seq.num_tokens), len(table))
        return [i for i in range(first, last) if self._refs[table[i]] > 1]

    def _take(self) -> int:
        block = self._free.popleft()
        self._refs[block] = 1
        return block

    def _take_undoable(self) -> tuple[int, int | None]:
        """`_take`, with what `_give_back` needs to put the block back where it was."""
        return self._take(), None

    def _give_back(self, block: int, undo: int | None) -> None:
        """Undo the latest `_take_undoable` (blocks are given back in reverse order)."""
        self._refs[block] = 0
        self._free.appendleft(block)

    def _ref(self, block: int) -> None:
        self._refs[block] += 1
        self._num_shared += self._refs[block] == 2

    def _unref(self, block: int) -> None:
        self._refs[block] -= 1
        self._num_shared -= self._refs[block] == 1
        if self._refs[block] == 0:
            self._free.append(block)
