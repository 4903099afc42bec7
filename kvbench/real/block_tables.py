"""A decode segment's block tables: built once, then updated where the allocator changed them.

A paged decode segment starts by putting every row's block table into the decode buffers'
`[N, W]` table. Built from scratch each time (`block_table_array`), that is a pass over every
block of every row and a fresh upload of the whole table, although between two segments of
one batch nearly every table is unchanged or has gained a block or two at its end: on the
reference workload (256 requests at once, H200) host work inside decode segments was half of
paged's end-to-end gap to orca-oracle (results/reference/paged-gap).

`DeviceBlockTables` keeps the device table between segments with a host mirror of it (pinned
on CUDA, so the upload is an asynchronous DMA that needs no staging copy) and, per row, the
blocks it holds. A segment's update compares each row's new table with what the row holds, or,
when the batch shifted (a request left before it), with what the same sequence's row held last
time, whose mirror row it copies; it writes only the entries that differ (appended blocks, a
whole row where one changed inside or shrank, zeros over a shrunk tail or a row now padding) and
uploads the rows between the first and the last one it touched in one copy. The comparisons run
in C (`map`, `compress`) and are of values, so any change the allocator makes (copy-on-write, a
trimmed segment, a window freeing its first blocks, a row reused by another sequence) is caught:
the device table always equals `block_table_array` of the same tables
(tests/test_block_table_upload.py); benchmarks/host_path.py times both.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import compress
from operator import ne

import numpy as np
import torch

from engines.allocator import BlockTable


def block_table_array(tables: Sequence[BlockTable], rows: int, width: int) -> np.ndarray:
    """Block tables as `[rows, width]` int32, padded with block 0: never read, since every read is
    bounded by the row's context length (rows past the tables are padding, context 0)."""
    out = np.zeros((rows, width), dtype=np.int32)
    # numpy converts each row's ids in C: 0.86 ms for 34 rows of 1,000-1,300 blocks on a 2-core
    # CPU, against 1.53 ms for one pass of Python over every id of the concatenated rows
    for row, table in zip(out, tables, strict=False):  # rows past the tables stay padding
        row[: len(table.blocks)] = table.blocks
    return out


class DeviceBlockTables:
    """`[rows, width]` int32 block tables on `device` (`table`), updated in place per segment.

    Invariant after every `update`, in stream order: `table` equals the host mirror, whose row
    `i` holds `held[i]` then zeros.
    """

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.device = device
        self.table = torch.zeros((rows, width), dtype=torch.int32, device=device)  # [N, W] the graphs read
        pin = device.type == "cuda"
        self._mirror = torch.zeros((rows, width), dtype=torch.int32, pin_memory=pin)  # [N, W] host copy
        self.host = self._mirror.numpy()  # the same memory, written with numpy
        self.held: list[Sequence[int]] = [()] * rows  # each row's blocks, as last written
        self._keys: list[Hashable] = []  # each row's owner, as of the last update
        self._versions: list[object] = [None] * rows  # each row's version, as of the last update
        # recorded after each upload: once it has passed, the mirror may change (the segment's
        # results coming back waited for it already, so waiting on it costs nothing)
        self._uploaded = torch.cuda.Event() if device.type == "cuda" else None

    def update(
        self, tables: Sequence[Sequence[int]], rows: int, keys: Sequence[Hashable],
        versions: Sequence[object] | None = None,
    ) -> None:  # fmt: skip
        """Rows `[0, rows)` become `tables` (each row's block ids: a `BlockTable`'s blocks, or an
        allocator's own list, read and never kept) then padding, as `block_table_array` builds
        them. `keys` name each table's owner (a sequence's sampling key): a row whose owner sat
        in another row last time starts from that row's blocks. `versions` (optional) name each
        table's content: a table whose version is the one its owner's row held last time has not
        changed (the allocator's promise, `HybridAllocator.memory_versions`) and is not compared."""
        if self._uploaded is not None:
            self._uploaded.synchronize()
        count, before = len(tables), self.held
        # map/compress run their loops in C: a segment's 256 rows cost a few us, not one Python
        # iteration each (only the rows that changed get one)
        keys = list(keys)
        if keys == self._keys:  # the same batch in the same rows (a segment cut by an arrival)
            src, refs = range(count), before[:count]
        else:
            owners = dict(zip(self._keys, range(len(self._keys)), strict=True))
            src = list(map(owners.get, keys, range(count)))  # [B] each owner's last row (new: its own)
            refs = list(map(before.__getitem__, src))  # what each row holds once moved rows are copied
        held = refs + before[count:]
        writes: list[tuple[int, int, Sequence[int]]] = []  # (row, first column, values)
        if versions is None:
            changed = compress(range(count), map(ne, tables, refs))  # equal lists compare by identity
            self._versions = [None] * len(self._versions)
        else:  # a version seen in the owner's last row: nothing to compare
            versions = list(versions)
            last = list(map(self._versions.__getitem__, src))  # [B] what each row's source held
            candidates = compress(range(count), map(ne, versions, last))
            changed = [i for i in candidates if tables[i] != refs[i]]
            self._versions = versions + [None] * (len(self._versions) - count)
        for i in changed:
            blocks, base = tables[i], refs[i]
            n = len(base)
            if len(blocks) >= n and blocks[:n] == base:  # appended blocks only
                writes.append((i, n, blocks[n:]))
            else:  # shrunk (a trimmed segment) or changed inside (copy-on-write, a window's freed
                writes.append((i, 0, blocks))  # entries, another owner): the whole row again
                if n > len(blocks):
                    writes.append((i, len(blocks), (0,) * (n - len(blocks))))
            held[i] = blocks[:]  # a copy of a list (the allocator changes it); a tuple is itself
        for i in range(count, rows):  # padding rows hold nothing
            if held[i]:
                writes.append((i, 0, (0,) * len(held[i])))
                held[i] = ()
        self.held = held
        self._keys = keys
        origin = np.fromiter(src, np.int64, count)  # [B]
        moved = np.flatnonzero(origin != np.arange(count))  # rows whose owner sat in another row
        if len(moved) or writes:
            self._write(moved, origin[moved], writes)

    def _write(self, dst: np.ndarray, src: np.ndarray, writes: list[tuple[int, int, Sequence[int]]]) -> None:
        """Copy rows `src` `[m]` to rows `dst` `[m]`, then apply the entry writes, in the mirror;
        upload the rows they touched."""
        host = self.host
        host[dst] = host[src]  # fancy indexing reads every source before any row is written
        for i, first, values in writes:  # a few dozen a segment: a slice each beats one scatter
            host[i, first : first + len(values)] = values
        rows = [i for i, _, _ in writes] + ([int(dst[0]), int(dst[-1])] if len(dst) else [])
        self._upload(min(rows), max(rows) + 1)

    def _upload(self, lo: int, hi: int) -> None:
        """Copy the mirror's rows `[lo, hi)` to the device table (asynchronous on CUDA)."""
        self.table[lo:hi].copy_(self._mirror[lo:hi], non_blocking=True)
        if self._uploaded is not None:
            self._uploaded.record()
