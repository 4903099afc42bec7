"""A decode segment's block tables: built once, then updated where the allocator changed them.

A paged decode segment starts by putting every row's block table into the decode buffers'
`[N, W]` table. Built from scratch each time (`block_table_array`), that is a pass over every
block of every row and a fresh upload of the whole table, although between two segments of
one batch nearly every table is unchanged or has gained a block or two at its end: on the
reference workload (256 requests at once, H200) host work inside decode segments was half of
paged's end-to-end gap to orca-oracle (results/reference/paged-gap).

`DeviceBlockTables` keeps the device table between segments with a host mirror of it (pinned
on CUDA, so the upload is an asynchronous DMA that needs no staging copy) and, per row, the
block tuple it holds. A segment's update compares each row's new table with what the row
holds, or with what the same sequence's row held last time when the batch shifted (a request
left before it), writes only the entries that differ (appended blocks, a shrunk tail zeroed)
in one numpy assignment, and uploads the rows between the first and the last one that changed
in one copy. Comparisons are of values, so any change the allocator makes (copy-on-write, a
trimmed segment, a window freeing its first blocks, a row reused by another sequence) is
caught: the device table always equals `block_table_array` of the same tables.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import chain

import numpy as np
import torch

from engines.allocator import BlockTable


def block_table_array(tables: Sequence[BlockTable], rows: int, width: int) -> np.ndarray:
    """Block tables as `[rows, width]` int32, padded with block 0: never read, since every read is
    bounded by the row's context length (rows past the tables are padding, context 0)."""
    out = np.zeros((rows, width), dtype=np.int32)
    lengths = np.fromiter((len(table.blocks) for table in tables), dtype=np.int64, count=len(tables))  # [B]
    blocks = np.fromiter(chain.from_iterable(table.blocks for table in tables), np.int32, int(lengths.sum()))
    # a row-major mask takes the concatenated tables in order: one numpy call, not one per row
    out[: len(tables)][np.arange(width) < lengths[:, None]] = blocks
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
        self._owners: dict[Hashable, int] = {}  # key -> row, as of the last update
        self._uploaded = None  # CUDA event after the last upload: the mirror is free to change

    @property
    def width(self) -> int:
        return self.table.shape[1]

    def update(self, tables: Sequence[Sequence[int]], rows: int, keys: Sequence[Hashable]) -> None:
        """Rows `[0, rows)` become `tables` (each row's block ids: a `BlockTable`'s blocks, or an
        allocator's own list, read and never kept) then padding, as `block_table_array` builds
        them. `keys` name each table's owner (a sequence's sampling key): a row whose owner sat
        in another row last time starts from that row's blocks."""
        if self._uploaded is not None:
            self._uploaded.synchronize()  # done already when a segment's results came back
        held, owners = self.held, self._owners
        before = list(held)  # rows as they are now: moved rows read these
        moves: list[tuple[int, int]] = []  # (row, row it starts from)
        writes: list[tuple[int, int, Sequence[int]]] = []  # (row, first column, values)
        for i, (key, blocks) in enumerate(zip(keys, tables, strict=True)):
            base = before[i]
            if blocks == base:  # the same int objects: one identity check per entry
                continue
            j = owners.get(key, i)
            if j != i:  # the batch shifted: start from the owner's row
                moves.append((i, j))
                base = before[j]
                if blocks == base:  # moved, unchanged: `base` is already a copy
                    held[i] = base
                    continue
            n = len(base)
            if len(blocks) >= n and blocks[:n] == base:  # appended blocks only (or none)
                if len(blocks) > n:
                    writes.append((i, n, blocks[n:]))
            else:  # shrunk (a trimmed segment) or changed inside (copy-on-write, a window's freed
                writes.append((i, 0, blocks))  # entries, another owner): the whole row again
                if n > len(blocks):
                    writes.append((i, len(blocks), (0,) * (n - len(blocks))))
            held[i] = blocks[:]  # a copy of a list (the allocator's changes); a tuple is itself
        for i in range(len(tables), rows):  # padding rows hold nothing
            if before[i]:
                writes.append((i, 0, (0,) * len(before[i])))
                held[i] = ()
        self._owners = {key: i for i, key in enumerate(keys)}
        if moves or writes:
            self._write(moves, writes)

    def _write(self, moves: list[tuple[int, int]], writes: list[tuple[int, int, Sequence[int]]]) -> None:
        """Apply row moves then entry writes to the mirror; upload the rows they touched."""
        host = self.host
        touched = [i for i, _ in moves] + [i for i, _, _ in writes]
        if moves:
            dst = np.fromiter((i for i, _ in moves), np.int64, len(moves))  # [m]
            src = np.fromiter((j for _, j in moves), np.int64, len(moves))  # [m]
            host[dst] = host[src]  # fancy indexing reads every source before any row is written
        for i, first, values in writes:  # a few dozen a segment: a slice each beats one scatter
            host[i, first : first + len(values)] = values
        lo, hi = min(touched), max(touched) + 1
        self.table[lo:hi].copy_(self._mirror[lo:hi], non_blocking=True)
        if self.device.type == "cuda":
            self._uploaded = torch.cuda.Event()
            self._uploaded.record()
