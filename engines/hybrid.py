"""Allocators for models whose layers keep different tokens: sliding-window layers beside full ones.

A paged allocator that treats a window layer as full (`paged` on Gemma) keeps every token of
every layer, although a window layer never reads a token more than W - 1 positions back. The
allocators here keep one block table per KV group (`kvbench.kvspec.KVGroup`: layers of one kind
and shape), so a sequence holds blocks in every group, and a window group frees each block that
falls wholly out of the window as the sequence grows (vLLM v1's hybrid KV cache manager; Jenga,
SOSP 2025). Both carve their blocks from ONE pool of equal-byte pages taken from one budget, so a
group that needs more memory for the current mix of requests simply takes more pages; a static
split into per-group pools would have to guess the mix (`kvbench.budget.budget_by_layer_kind`
sizes such a split for one sequence length, which is right only for that length).

- `HybridAllocator` (vLLM v1): a page holds one block of *u* bytes per token, u = the gcd of the
  groups' bytes per token. vLLM splits every group into sub-groups of equal layer count so that
  their pages have equal bytes; a block of group g is then m_g = bytes_per_token(g) / u such pages
  (its m_g sub-groups' blocks, which always grow and shrink together). No page is ever partly
  used, so nothing is lost beyond the budget's tail.
- `JengaAllocator` (Jenga): a page is the least common multiple of the groups' block bytes
  (block_size x bytes per token of the group); a page is split on demand into blocks of one group
  (k_g = page / block bytes of them) and returns to the shared pool when its last block is freed.
  The unused blocks of partly used pages are what this layout wastes; they count as allocator
  overhead (granted, not asked), exactly.

Units. The engine loop, the metrics and reports measure the arena in slots: one slot is one
token in every layer (`ModelSpec.kv_bytes_per_token`, B bytes), the unit the budget is sized in
for every engine. A block of group g is block_size x b_g / B slots, a fraction: footprints are
exact rationals carried as floats, and the categories still sum to the arena.

Which tokens a step reads. A step computes positions [num_computed, num_tokens); the query at
position p of a window-W layer reads keys p - W + 1 .. p, so the first key any step reads from
now on is num_computed - W + 1. A window group frees the blocks lying wholly below it (their
table entries become None, vLLM's null block), and does so as soon as the allocator is next
asked about the sequence (`can_append`, `append`) or about admitting anyone (`can_allocate`:
every resident sequence), never for a token a step still reads. Freeing before the admission
check keeps multi-step segments exact: memory never grows inside a segment, and what the last
step freed is seen by the check that decides the next one.

Peaks. Prefill (and recompute after preemption) writes every prompt token's K/V in one step, so
a window group holds blocks for all of them until the next step frees the old ones. A sequence
preempted late is recomputed with up to kv_len - 1 tokens, so `can_ever_hold` asks for kv_len
tokens in every group: the only peak a request alone is guaranteed to pass through again. Under
chunked prefill (`step_tokens`: no step writes more) a window group takes its blocks chunk by
chunk instead (`target_blocks`), and its peak is about W + step_tokens tokens (`peak_blocks`).

Real decoding. A real run keeps the pool as ONE buffer of `num_pages x page_bytes` bytes (the
budget less its tail; `kvbench.real.grouped_arena`), and every layer reads and writes its K/V
through its own table (`memory_layout`, `memory_tables`): vLLM's layout has a table per
sub-group (a block's p-th page holds the p-th slice of its group's layers), Jenga's a table per
group (a page's i-th block of group g is group-local block page x k_g + i). Both tables address
`slot = block x block_size + offset` with their own bytes per slot, so the paged kernels read
them unchanged; freed window entries are -1 and never read (a window layer starts at its
window's block). `addressing` is the simulator's view: the first group's table, freed as -1.

Prefix caching (`hybrid-prefix`, `jenga-prefix`) is `engines.hybrid_prefix`: every group caches
its computed prompt blocks by content, a window group needing only the blocks of its window.

Not here: swapping to host memory (`can_swap_out` is False: victims are recomputed), real
decoding of a vLLM layout whose layer straddles pages (groups whose layers differ in bytes so
that a group's pages do not split into whole layers: `EqualPages.layout` refuses it) and under
tensor parallelism.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from engines.allocator import BlockTable, shared_holders
from kvbench.errors import KvbenchError
from kvbench.kvspec.layers import KVGroup
from kvbench.metrics.occupancy import Footprint, Growth
from kvbench.requests import Request
from kvbench.sequence import Sequence

Table = list[int | None]  # block ids; None: freed, out of the window (vLLM's null block)
_STAMPS = itertools.count(1)  # versions of memory tables (`memory_versions`), unique in the process


@dataclass(frozen=True)
class TableLayout:
    """One block table a real model reads, and where its layers' K/V lie in the pool's bytes.

    Why: a real run keeps every group's blocks in ONE buffer of the pool's bytes, so a layer reads
    and writes through its own table (`memory_tables`), as `slot = block x block_size + offset`,
    where slot s lies `s x token_bytes` bytes into the buffer. Each of `layers` is (layer index,
    byte offset of its K inside a token's `token_bytes`); its V follows its K.
    """

    group: int
    token_bytes: int  # bytes from one slot to the next
    num_blocks: int  # blocks of block_size slots this table's ids address
    layers: tuple[tuple[int, int], ...]  # (layer index, byte offset of its K in a slot)


@dataclass(frozen=True)
class GroupShape:
    """What the allocator needs of one KV group: bytes of one token in all its layers, its window."""

    bytes_per_token: int
    window: int = 0  # 0: the group keeps every token


def group_shapes(groups: Seq[KVGroup]) -> tuple[GroupShape, ...]:
    """The shapes of a model's KV groups; no groups (a model not given) is one full group, under
    which both allocators are `paged` with a different free order."""
    shapes = tuple(GroupShape(g.bytes_per_token, getattr(g.layer, "window", 0)) for g in groups)
    return shapes or (GroupShape(1),)


def blocks_behind_window(shape: GroupShape, block_size: int, num_computed: int) -> int:
    """Blocks of a window group lying wholly before the first token any later step reads
    (num_computed - W + 1): what freeing may give back; 0 for a full group."""
    if not shape.window:
        return 0
    return max(num_computed - shape.window + 1, 0) // block_size


class _Pool:
    """Pages of one budget; blocks of a group taken from them. Subclasses set the layout."""

    num_pages: int
    page_bytes: int

    def __init__(self, shapes: tuple[GroupShape, ...], block_size: int, budget_bytes: int) -> None:
        self.shapes = shapes
        self.block_size = block_size
        self.num_pages = budget_bytes // self.page_bytes
        self.free: deque[int] = deque(range(self.num_pages))

    def block_bytes(self, group: int) -> int:
        return self.block_size * self.shapes[group].bytes_per_token

    def pages_for(self, need: Seq[int]) -> int:
        """Free pages `need[g]` more blocks of each group g would take."""
        raise NotImplementedError

    def take(self, group: int) -> int: ...

    def release(self, group: int, block: int) -> None: ...

    def spare_bytes(self) -> int:
        """Bytes in pages handed out that no block holds (partly used pages)."""
        return 0

    def fits(self, need: Seq[int], reserve: int) -> bool:
        """Whether `need[g]` more blocks of each group g fit, `reserve` pages left over."""
        return self.pages_for(need) <= len(self.free) - reserve

    def check(self, live: dict[int, int]) -> None:
        """Assert the pool agrees with `live` (block id -> its group)."""
        raise NotImplementedError

    def layout(self, groups: Seq[KVGroup]) -> tuple[TableLayout, ...]:
        """The tables a real model reads (see `TableLayout`), in the order of `memory_ids`."""
        raise NotImplementedError

    def memory_ids(self, group: int, block: int) -> tuple[int, ...]:
        """Block `block` of `group` as an id in each of its group's tables (`layout`)."""
        raise NotImplementedError

    def tables_of(self, group: int) -> int:
        """How many tables (`layout`) group `group` has."""
        return 1

    def byte_ranges(self, group: int, block: int) -> list[tuple[int, int]]:
        """(first byte, bytes) of the memory holding `block` of `group`: all its layers' K/V."""
        raise NotImplementedError


class EqualPages(_Pool):
    """vLLM's layout: every page is u x block_size bytes; a block of group g is m_g pages."""

    def __init__(self, shapes: tuple[GroupShape, ...], block_size: int, budget_bytes: int) -> None:
        self.unit = math.gcd(*(s.bytes_per_token for s in shapes))
        self.multiple = tuple(s.bytes_per_token // self.unit for s in shapes)
        self.page_bytes = self.unit * block_size
        super().__init__(shapes, block_size, budget_bytes)
        self._pages: dict[int, list[int]] = {}  # block id (its first page) -> its pages

    def pages_for(self, need: Seq[int]) -> int:
        return sum(m * n for m, n in zip(self.multiple, need, strict=True))

    def take(self, group: int) -> int:
        pages = [self.free.popleft() for _ in range(self.multiple[group])]
        self._pages[pages[0]] = pages
        return pages[0]

    def release(self, group: int, block: int) -> None:
        self.free.extend(self._pages.pop(block))

    def check(self, live: dict[int, int]) -> None:
        assert set(live) == set(self._pages), "blocks and pages differ"
        held = [p for block, group in live.items() for p in self._pages[block]]
        assert all(len(self._pages[b]) == self.multiple[g] for b, g in live.items()), "block size wrong"
        assert sorted(held + list(self.free)) == list(range(self.num_pages)), "pages lost or doubled"

    def layout(self, groups: Seq[KVGroup]) -> tuple[TableLayout, ...]:
        """A table per sub-group: page p of a block holds the p-th of its group's m_g equal slices
        of layers, for its block_size tokens (token-major: a token's u bytes, layer by layer, K
        then V), so a sub-group's table lists each block's p-th page, a slot being u bytes."""
        tables = []
        for g, (group, m) in enumerate(zip(groups, self.multiple, strict=True)):
            layers, per_layer = group.layer_ids, group.layer.bytes_per_token
            if len(layers) % m or len(layers) // m * per_layer != self.unit:
                raise KvbenchError(
                    f"--engine hybrid: KV group {g} ({len(layers)} layers of {per_layer} B a token) does "
                    f"not split into {m} pages of {self.unit} B a token (a layer would straddle pages); "
                    "decode it with --engine jenga"
                )
            k = len(layers) // m
            for p in range(m):
                own = tuple((i, j * per_layer) for j, i in enumerate(layers[p * k : (p + 1) * k]))
                tables.append(TableLayout(g, self.unit, self.num_pages, own))
        return tuple(tables)

    def memory_ids(self, group: int, block: int) -> tuple[int, ...]:
        return tuple(self._pages[block])

    def tables_of(self, group: int) -> int:
        return self.multiple[group]

    def byte_ranges(self, group: int, block: int) -> list[tuple[int, int]]:
        return [(page * self.page_bytes, self.page_bytes) for page in self._pages[block]]


class LcmPages(_Pool):
    """Jenga's layout: a page of lcm(block bytes) split on demand into k_g blocks of one group.

    A block's id is page x K + index, K the most blocks any page holds. A group takes a block from
    its partly used page with the lowest id first (packing pages, so freed ones empty sooner), and
    a page whose last block is freed goes back to the shared queue.
    """

    def __init__(self, shapes: tuple[GroupShape, ...], block_size: int, budget_bytes: int) -> None:
        self.page_bytes = math.lcm(*(block_size * s.bytes_per_token for s in shapes))
        super().__init__(shapes, block_size, budget_bytes)
        self.per_page = tuple(self.page_bytes // self.block_bytes(g) for g in range(len(shapes)))
        self.stride = max(self.per_page)
        self._spare: list[dict[int, list[int]]] = [{} for _ in shapes]  # group -> page -> free indices
        self._spare_count = [0] * len(shapes)
        self._owner: dict[int, int] = {}  # page in use -> its group

    def pages_for(self, need: Seq[int]) -> int:
        rows = zip(need, self._spare_count, self.per_page, strict=True)
        return sum(-(-max(n - spare, 0) // k) for n, spare, k in rows)

    def take(self, group: int) -> int:
        spare = self._spare[group]
        if not spare:
            page = self.free.popleft()
            self._owner[page] = group
            spare[page] = list(range(self.per_page[group]))
            self._spare_count[group] += self.per_page[group]
        page = min(spare)
        indices = spare[page]
        index = indices.pop(0)
        if not indices:
            del spare[page]
        self._spare_count[group] -= 1
        return page * self.stride + index

    def release(self, group: int, block: int) -> None:
        page, index = divmod(block, self.stride)
        spare = self._spare[group]
        spare.setdefault(page, []).append(index)
        spare[page].sort()
        self._spare_count[group] += 1
        if len(spare[page]) == self.per_page[group]:  # the page is empty: back to the shared pool
            del spare[page]
            del self._owner[page]
            self._spare_count[group] -= self.per_page[group]
            self.free.append(page)

    def spare_bytes(self) -> int:
        return sum(n * self.block_bytes(g) for g, n in enumerate(self._spare_count))

    def check(self, live: dict[int, int]) -> None:
        used: dict[int, set[int]] = {}
        for block, group in live.items():
            page, index = divmod(block, self.stride)
            assert self._owner.get(page) == group, f"block {block} in a page of another group"
            used.setdefault(page, set()).add(index)
        assert set(used) == set(self._owner), "a page in use holds no block, or a block no page"
        for page, group in self._owner.items():
            spare = set(self._spare[group].get(page, []))
            assert not spare & used[page], f"page {page}: an index both free and held"
            assert spare | used[page] == set(range(self.per_page[group])), f"page {page}: blocks lost"
        for g in range(len(self.shapes)):
            assert self._spare_count[g] == sum(len(v) for v in self._spare[g].values()), "spare count"
        assert sorted(list(self._owner) + list(self.free)) == list(range(self.num_pages)), "pages lost"

    def layout(self, groups: Seq[KVGroup]) -> tuple[TableLayout, ...]:
        """A table per group: block i of page p is group-local block p x k_g + i, its memory
        `block bytes` long at that multiple of them (token-major: a token's b_g bytes, layer by
        layer, K then V), so a slot of group g is b_g bytes."""
        tables = []
        for g, group in enumerate(groups):
            per_layer = group.layer.bytes_per_token
            layers = tuple((i, j * per_layer) for j, i in enumerate(group.layer_ids))
            tables.append(TableLayout(g, group.bytes_per_token, self.num_pages * self.per_page[g], layers))
        return tuple(tables)

    def memory_ids(self, group: int, block: int) -> tuple[int, ...]:
        page, index = divmod(block, self.stride)
        return (page * self.per_page[group] + index,)

    def byte_ranges(self, group: int, block: int) -> list[tuple[int, int]]:
        page, index = divmod(block, self.stride)
        size = self.block_bytes(group)
        return [(page * self.page_bytes + index * size, size)]


class _GroupedAllocator:
    """Block tables per KV group over one page pool; see the module docstring. `KVAllocator`."""

    pool_class: type[_Pool]

    def __init__(
        self, num_slots: int, block_size: int, groups: Seq[KVGroup] = (), watermark: float = 0.01,
        step_tokens: int = 0,
    ) -> None:  # fmt: skip
        self.num_slots = num_slots
        self.block_size = block_size
        self.step_tokens = step_tokens  # chunked prefill's step budget: see `target_blocks`; 0: none
        self.groups = tuple(groups)
        self.shapes = group_shapes(groups)
        self.slot_bytes = sum(s.bytes_per_token for s in self.shapes)  # B: one token in every layer
        self.pool = self.pool_class(self.shapes, block_size, num_slots * self.slot_bytes)
        self.watermark_pages = int(watermark * self.pool.num_pages)
        # a block of group g in slots: block_size x b_g / B
        self._block_slots = tuple(block_size * s.bytes_per_token / self.slot_bytes for s in self.shapes)
        self._tables: dict[Sequence, list[Table]] = {}
        self._skipped: dict[Sequence, list[int]] = {}  # leading None entries per group
        self._refs: dict[int, int] = {}
        self._group_of: dict[int, int] = {}
        self._num_shared = 0
        # real runs: each sequence's `memory_tables`, kept as the tables change once first asked
        # for (a decode segment then reads them, as paged's `block_lists`, instead of rebuilding
        # them: 47 ms a segment for 256 sequences of 2,048 tokens of Gemma 3 1B); None: not yet
        self._memory: dict[Sequence, list[list[int]]] | None = None
        # each sequence's `memory_tables` version: a stamp renewed by every change to any of its
        # rows (`memory_versions`), drawn from one count for the process, so no two sequences of
        # any allocator ever share one
        self._versions: dict[Sequence, int] = {}

    # --- sizes ---------------------------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return len(self.shapes)

    @property
    def num_free_pages(self) -> int:
        return len(self.pool.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def target_blocks(self, g: int, num_tokens: int, num_computed: int) -> int:
        """How many blocks group g's table spans for the next step of a sequence of `num_tokens`
        tokens, `num_computed` of them computed (freed entries included).

        A full group spans every token. So does a window group, unless a step writes at most
        `step_tokens` tokens (chunked prefill): it then spans only what the next step can write,
        up to position num_computed + step_tokens, taking the rest chunk by chunk as the window
        frees what lies behind, as vLLM v1 allocates each step's new tokens. A long prompt's window
        groups then never hold more than about W + step_tokens of its tokens, where a prompt
        admitted whole would hold all of them until its last chunk.
        """
        if self.step_tokens and self.shapes[g].window:
            num_tokens = min(num_tokens, num_computed + self.step_tokens)
        return self.blocks_for(num_tokens)

    def _targets(self, seq: Sequence) -> list[int]:
        """`target_blocks` of every group (an append's hot path: one division without chunking)."""
        if not self.step_tokens:
            return [self.blocks_for(seq.num_tokens)] * self.num_groups
        return [self.target_blocks(g, seq.num_tokens, seq.num_computed) for g in range(self.num_groups)]

    def held_blocks(self, seq: Sequence) -> list[int]:
        """Blocks `seq` holds in each group (freed ones not counted)."""
        return [len(t) - s for t, s in zip(self._tables[seq], self._skipped[seq], strict=True)]

    def _fits(self, need: Seq[int], reserve: int) -> bool:
        return self.pool.fits(need, reserve)

    # --- admission -----------------------------------------------------------------------------
    def can_ever_hold(self, request: Request) -> bool:
        need = [self.peak_blocks(g, request.kv_len) * request.beam_width for g in range(self.num_groups)]
        return self.pool.pages_for(need) <= self.pool.num_pages - self.watermark_pages

    def peak_blocks(self, g: int, kv_len: int) -> int:
        """The most blocks group g ever holds of one sequence of `kv_len` tokens: all of them, but
        for a window group taking its blocks chunk by chunk (`target_blocks`), the blocks from the
        window's first position p - W + 1 to p + step_tokens, at most this many for any p."""
        window = self.shapes[g].window
        if not (self.step_tokens and window):
            return self.blocks_for(kv_len)
        return min(self.blocks_for(kv_len), self.blocks_for(window - 1 + self.step_tokens) + 1)

    def can_allocate(self, seq: Sequence) -> bool:
        self._slide_all()
        return self._fits(self._targets(seq), self.watermark_pages)

    def can_allocate_all(self, seqs: Seq[Sequence]) -> bool:
        self._slide_all()
        need = [sum(column) for column in zip(*(self._targets(seq) for seq in seqs), strict=True)]
        return self._fits(need or [0] * self.num_groups, self.watermark_pages)

    def allocate(self, seq: Sequence) -> None:
        assert seq not in self._tables, f"seq {seq.seq_id} is already resident"
        self._tables[seq] = [[self._take(g) for _ in range(n)] for g, n in enumerate(self._targets(seq))]
        self._skipped[seq] = [0] * self.num_groups
        if self._memory is not None:
            self._memory[seq] = self._memory_rows(self._tables[seq])
            self._touch(seq)

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int, int]]:
        """Share every block `parent` holds (copy on the first write), as `paged` does."""
        assert child not in self._tables, f"seq {child.seq_id} is already resident"
        tables = self._tables[parent]
        for table in tables:
            for block in table:
                if block is not None:
                    self._ref(block)
        self._tables[child] = [list(t) for t in tables]
        if self._memory is not None:
            self._memory[child] = [list(row) for row in self._memory[parent]]
            self._touch(child)
        self._skipped[child] = list(self._skipped[parent])
        return []

    # --- growth --------------------------------------------------------------------------------
    def _slide_all(self) -> None:
        """`_slide` every resident sequence: before an admission check, so that blocks the last
        step left out of the window count as free (as they would after the next `append`)."""
        if any(s.window for s in self.shapes):
            for seq in self._tables:
                self._slide(seq)

    def _slide(self, seq: Sequence) -> None:
        """Free the window groups' blocks that no step reads again (below num_computed - W + 1)."""
        tables, skipped = self._tables[seq], self._skipped[seq]
        for g, shape in enumerate(self.shapes):
            if shape.window:
                first = blocks_behind_window(shape, self.block_size, seq.num_computed)
                table = tables[g]
                for index in range(skipped[g], min(first, len(table))):
                    block = table[index]
                    assert block is not None
                    table[index] = None
                    self._unref(block)
                    if self._memory is not None:
                        for row in self._group_rows(seq, g):
                            row[index] = -1
                        self._touch(seq)
                skipped[g] = max(skipped[g], min(first, len(table)))

    def _written_shared(self, seq: Sequence, g: int) -> list[int]:
        """Indices of group g's shared blocks the next step writes into (copied first)."""
        table = self._tables[seq][g]
        last = min(self.blocks_for(seq.num_tokens), len(table))
        first = seq.num_computed // self.block_size
        return [i for i in range(first, last) if table[i] is not None and self._refs[table[i]] > 1]

    def _append_need(self, seq: Sequence) -> list[int]:
        need = [max(want - len(t), 0) for want, t in zip(self._targets(seq), self._tables[seq], strict=True)]
        if self._num_shared:
            need = [n + len(self._written_shared(seq, g)) for g, n in enumerate(need)]
        return need

    def can_append(self, seq: Sequence) -> bool:
        self._slide(seq)
        return self._fits(self._append_need(seq), 0)

    def append(self, seq: Sequence) -> list[tuple[int, int]]:
        self._slide(seq)
        copies = []
        for g, (want, table) in enumerate(zip(self._targets(seq), self._tables[seq], strict=True)):
            if self._num_shared:
                for index in self._written_shared(seq, g):
                    old, new = table[index], self._take(g)
                    assert old is not None
                    self._unref(old)
                    table[index] = new
                    copies.append((old, new))
                    if self._memory is not None:
                        ids = self.pool.memory_ids(g, new)
                        for row, i in zip(self._group_rows(seq, g), ids, strict=True):
                            row[index] = i
                        self._touch(seq)
            new_blocks = [self._take(g) for _ in range(want - len(table))]
            table.extend(new_blocks)
            if self._memory is not None and new_blocks:
                ids = [self.pool.memory_ids(g, b) for b in new_blocks]
                for p, row in enumerate(self._group_rows(seq, g)):
                    row.extend(i[p] for i in ids)
                self._touch(seq)
        return copies

    def append_all(self, seqs: Seq[Sequence]) -> list[tuple[int, int]] | None:
        if self._num_shared:
            return None  # copy-on-write is decided sequence by sequence
        for seq in seqs:
            self._slide(seq)
        if not self._fits_each([self._append_need(seq) for seq in seqs]):
            return None
        for seq in seqs:
            self.append(seq)
        return []

    def _fits_each(self, needs: Seq[Seq[int]]) -> bool:
        """Room for `needs[i][g]` blocks of group g for sequence i, taken in that order."""
        return self._fits([sum(column) for column in zip(*needs, strict=True)] or [0] * self.num_groups, 0)

    def free(self, seq: Sequence) -> None:
        tables = self._tables.pop(seq)
        del self._skipped[seq]
        if self._memory is not None:
            del self._memory[seq]
            del self._versions[seq]
        for table in tables:
            for block in reversed(table):
                if block is not None:
                    self._unref(block)

    def can_swap_out(self, seq: Sequence) -> bool:
        return False  # victims are recomputed (module docstring)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        raise NotImplementedError("hybrid allocators do not swap")

    def can_swap_in(self, seq: Sequence) -> bool:
        return False

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        raise NotImplementedError("hybrid allocators do not swap")

    def growth_horizon(self, seqs: Seq[Sequence], max_steps: int) -> int:
        """Steps until some sequence needs a new block or frees one out of a window.

        After step 0's `append` a sequence with c computed tokens and L blocks a group needs a new
        block at step L x bs - c, and window group g (s blocks freed) frees one at step
        (s + 1) x bs + W - 1 - c. The segment stops before either: within it nothing changes.
        """
        if self._num_shared:
            return 1  # copy-on-write is decided step by step
        horizon = max_steps
        bs = self.block_size
        for seq in seqs:
            c = seq.num_computed
            tables, skipped = self._tables[seq], self._skipped[seq]
            horizon = min(horizon, min(len(t) for t in tables) * bs - c)
            for g, shape in enumerate(self.shapes):
                if shape.window:
                    horizon = min(horizon, (skipped[g] + 1) * bs + shape.window - 1 - c)
        return max(horizon, 1)

    def grow(self, seqs: Seq[Sequence], num_steps: int) -> Growth | None:
        return None  # a segment never crosses a block boundary (`growth_horizon`)

    def trim(self, num_steps: int) -> None:
        pass

    # --- occupancy -----------------------------------------------------------------------------
    def footprint(self) -> Footprint:
        tokens = target = asked = 0.0
        if self._num_shared:
            return self._footprint_by_blocks()
        bs = self.block_size
        for seq, tables in self._tables.items():
            for g, table in enumerate(tables):
                start, end = self._skipped[seq][g] * bs, len(table) * bs
                filled = max(min(seq.num_computed, end) - start, 0)
                wanted = max(min(seq.request.kv_len, end) - start, filled)
                scale = self._block_slots[g] / bs
                tokens += filled * scale
                target += wanted * scale
                asked += (end - start) * scale
        return Footprint(tokens, target, asked, asked + self._spare_slots())

    def _footprint_by_blocks(self) -> Footprint:
        """Each physical block counted once, at the most any sharer fills and wants of it."""
        fill: dict[int, int] = {}
        want: dict[int, int] = {}
        bs = self.block_size
        for seq, tables in self._tables.items():
            for table in tables:
                for index, block in enumerate(table):
                    if block is None:
                        continue
                    start = index * bs
                    filled = min(max(seq.num_computed - start, 0), bs)
                    wanted = min(max(seq.request.kv_len - start, 0), bs)
                    fill[block] = max(fill.get(block, 0), filled)
                    want[block] = max(want.get(block, 0), wanted, filled)
        scale = [self._block_slots[g] / bs for g in range(self.num_groups)]
        tokens = sum(n * scale[self._group_of[b]] for b, n in fill.items())
        target = sum(n * scale[self._group_of[b]] for b, n in want.items())
        asked = sum(self._block_slots[self._group_of[b]] for b in fill)
        return Footprint(tokens, target, asked, asked + self._spare_slots())

    def _spare_slots(self) -> float:
        return self.pool.spare_bytes() / self.slot_bytes

    def sharing_saved(self) -> int:
        if not self._num_shared:
            return 0
        saved = sum((r - 1) * self._block_slots[self._group_of[b]] for b, r in self._refs.items() if r > 1)
        return round(saved)

    def external_frag(self, head: Sequence | None) -> float:
        """The budget's tail past the last whole page: no block can use it."""
        return self.num_slots - self.pool.num_pages * self.pool.page_bytes / self.slot_bytes

    def shared_blocks(
        self, seqs: Seq[Sequence], below: int, group: int
    ) -> list[tuple[int, tuple[Sequence, ...]]]:
        """`shared_holders` of `seqs`' tables of group `group` (`engines.windows.shared_terms`),
        read past the entries its window freed (they lead the table)."""
        resident = (seq for seq in seqs if seq in self._tables)
        tables = ((seq, self._tables[seq][group], self._skipped[seq][group]) for seq in resident)
        return shared_holders(tables, lambda block: self._refs.get(block, 0), self.block_size, below)

    def window_held_from(self, seq: Sequence, group: int) -> int:
        """First position group `group` still holds of `seq` (blocks before it freed): `engines.windows`."""
        return self._skipped[seq][group] * self.block_size

    def outside_window_slots(self) -> float:
        """Slots window groups hold in blocks lying wholly before the first token a step reads.

        Zero right after every resident sequence's `append` (they are freed then); a block that
        still holds one token of the window stays whole, so up to block_size - 1 older tokens per
        sequence and group are held, and counted as tokens, as paging counts any partial block.
        """
        total = 0.0
        for seq in self._tables:
            for g, shape in enumerate(self.shapes):
                behind = blocks_behind_window(shape, self.block_size, seq.num_computed)
                total += max(behind - self._skipped[seq][g], 0) * self._block_slots[g]
        return total

    def addressing(self, seq: Sequence) -> BlockTable:
        table = self._tables[seq][0]
        return BlockTable(tuple(-1 if b is None else b for b in table), self.block_size)

    # --- real decoding: a table per group (sub-group), over one buffer of the pool's bytes ------
    def memory_layout(self) -> tuple[TableLayout, ...]:
        """The tables a real model reads and where each layer lies (`TableLayout`); the buffer
        is `pool.num_pages x pool.page_bytes` bytes, the budget less its tail."""
        return self.pool.layout(self.groups)

    def memory_tables(self, seq: Sequence) -> list[list[int]]:
        """`seq`'s block ids in each table of `memory_layout`; -1 where a window group freed the
        block (never read: a window layer's reads start at its window's block). The allocator's
        own lists, kept up to date from the first call on: read them, never change or keep them."""
        if self._memory is None:
            self._memory = {s: self._memory_rows(tables) for s, tables in self._tables.items()}
            for s in self._memory:
                self._touch(s)
        return self._memory[seq]

    def memory_versions(self, seqs: Seq[Sequence]) -> list[int]:
        """Each sequence's version of its `memory_tables` rows: equal to what it was last asked
        only if none of its rows changed since. Why: a decode step's table upload
        (`kvbench.real.block_tables.DeviceBlockTables`) would otherwise compare every row of
        every table with what it holds, each step, and Gemma 3 12B under vLLM's layout has six
        tables: 0.27-0.29 ms of host work a decode step compared, 0.22-0.23 ms by version (the
        median step of three runs), for 22 rows of 2,000 to 25,000 tokens on a 2-core CPU
        (`benchmarks/grouped_tables.py`)."""
        return [self._versions[seq] for seq in seqs]

    def _touch(self, seq: Sequence) -> None:
        self._versions[seq] = next(_STAMPS)

    def _memory_rows(self, tables: list[Table]) -> list[list[int]]:
        """`memory_tables` built from a sequence's group tables."""
        out = []
        for g, table in enumerate(tables):
            ids = [None if b is None else self.pool.memory_ids(g, b) for b in table]
            out.extend([-1 if i is None else i[p] for i in ids] for p in range(self.pool.tables_of(g)))
        return out

    def _group_rows(self, seq: Sequence, g: int) -> list[list[int]]:
        """The rows of `memory_tables(seq)` that group g's table maps to."""
        first = sum(self.pool.tables_of(h) for h in range(g))
        return self._memory[seq][first : first + self.pool.tables_of(g)]

    def block_bytes(self, block: int) -> list[tuple[int, int]]:
        """(first byte, bytes) of the memory a held block occupies (a copy-on-write copies them)."""
        return self.pool.byte_ranges(self._group_of[block], block)

    def check_integrity(self) -> None:
        refs: dict[int, int] = {}
        for seq, tables in self._tables.items():
            full = {len(t) for t, s in zip(tables, self.shapes, strict=True) if not s.window}
            assert len(full) <= 1, f"seq {seq.seq_id}: full groups' tables differ in length"
            low = self.blocks_for(seq.num_computed)
            for g, (table, skipped) in enumerate(zip(tables, self._skipped[seq], strict=True)):
                shape = self.shapes[g]
                high = self.target_blocks(g, seq.num_tokens, seq.num_computed)
                assert low <= len(table) <= max(high, low), f"seq {seq.seq_id}: {len(table)} blocks in {g}"
                assert all(b is None for b in table[:skipped]), "a freed entry holds a block"
                assert all(b is not None for b in table[skipped:]), "a block freed inside the window"
                if shape.window:  # nothing freed that a step still reads
                    assert skipped * self.block_size <= max(seq.num_computed - shape.window + 1, 0)
                else:
                    assert skipped == 0, "a full group freed a block"
                for block in table[skipped:]:
                    assert self._group_of[block] == g, f"block {block} in another group's table"
                    refs[block] = refs.get(block, 0) + 1
        assert refs == self._refs, "reference counts differ from the block tables"
        if self._memory is not None:
            assert self._memory.keys() == self._tables.keys(), "memory tables of other sequences"
            assert self._versions.keys() == self._tables.keys(), "memory versions of other sequences"
            for seq, tables in self._tables.items():
                assert self._memory[seq] == self._memory_rows(tables), f"seq {seq.seq_id}: stale memory"
        self._check_shared(refs)
        self.pool.check(self._group_of)

    def _check_shared(self, refs: dict[int, int]) -> None:
        """The copy-on-write count agrees with `refs` (block -> references from the tables)."""
        assert self._num_shared == sum(r > 1 for r in refs.values()), "shared-block count wrong"

    # --- blocks --------------------------------------------------------------------------------
    def _take(self, g: int) -> int:
        block = self.pool.take(g)
        self._refs[block] = 1
        self._group_of[block] = g
        return block

    def _ref(self, block: int) -> None:
        self._refs[block] += 1
        self._num_shared += self._refs[block] == 2

    def _unref(self, block: int) -> None:
        self._refs[block] -= 1
        self._num_shared -= self._refs[block] == 1
        if self._refs[block] == 0:
            del self._refs[block]
            self.pool.release(self._group_of.pop(block), block)


class HybridAllocator(_GroupedAllocator):
    """vLLM v1's hybrid KV cache manager: per-group tables over equal-byte pages (`EqualPages`)."""

    pool_class = EqualPages


class JengaAllocator(_GroupedAllocator):
    """Jenga: per-group tables over LCM-sized pages split into one group's blocks (`LcmPages`)."""

    pool_class = LcmPages
