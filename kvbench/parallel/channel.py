"""Rank 0 -> every worker: one command at a time, with a few integers and integer tensors.

A message is two broadcasts from rank 0::

    header  int64 [HEADER] on the host (gloo):  command, #ints, #tensors, ints...,
                                                per tensor (dtype code, ndim, 3 dims)
    payload int64 [sum of numels] on the rank's device (NCCL on CUDA, gloo on CPU):
                                                every tensor flattened, in order

The header is on the host so a worker learns what comes next without waiting for its GPU,
and can queue the next forward while the last one still runs; the payload stays on the
device, so a decode step's inputs (already on rank 0's GPU) never visit the host.

A forward's inputs (`encode_forward`) are the token ids, the positions and every field of
`AttentionMetadata` in declaration order, so a field added to it travels without changes here.

Nothing that arrives is executed: a message is integers and integer tensors, and an arena
operation (`encode_mirror`) names one of a fixed set by number, with its block pairs as a
tensor; `decode_mirror` refuses anything else. (Pickle would run whatever a sender wrote.)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum

import torch
import torch.distributed as dist

from kvbench.modeling.attention import BACKENDS, AttentionMetadata

HEADER = 128  # int64s: room for 3 + 30 ints + 12 tensors of up to 3 dims
DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


class Command(IntEnum):
    STOP = 0  # leave the loop
    ARENA = 1  # ints: num_slots; replaces the worker's arena
    FORWARD = 2  # ints and tensors: `encode_forward`
    MIRROR = 3  # ints: block size, host blocks, `Mirror` op; tensor: its block pairs (`encode_mirror`)


class Mirror(IntEnum):
    """The arena operations a worker repeats on its own arena (`ModelRunner` methods)."""

    SWAP = 0  # `_swap`: int64 [N, 3] rows (to_host 0|1, source block, target block), in order
    COPY_BLOCKS = 1  # `_copy_blocks`: int64 [N, 2] rows (source block, target block)


_MIRROR_WIDTH = {Mirror.SWAP: 3, Mirror.COPY_BLOCKS: 2}


@dataclass(frozen=True)
class Message:
    command: Command
    ints: tuple[int, ...]
    tensors: tuple[torch.Tensor, ...]


class Channel:
    """Broadcasts from rank 0; `device`: where payloads live on this rank."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def send(self, command: Command, ints=(), tensors=()) -> None:
        header = [int(command), len(ints), len(tensors), *map(int, ints)]
        for tensor in tensors:
            if tensor.dim() > 3 or tensor.dtype not in DTYPES:
                raise TypeError(f"cannot send a {tensor.dtype} tensor of {tensor.dim()} dims")
            header += [DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape, *[0] * (3 - tensor.dim())]
        if len(header) > HEADER:
            raise ValueError(f"a message of {len(header)} header ints exceeds {HEADER}")
        dist.broadcast(torch.tensor(header + [0] * (HEADER - len(header)), dtype=torch.int64), 0)
        if tensors:
            flat = [t.reshape(-1).to(device=self.device, dtype=torch.int64) for t in tensors]
            dist.broadcast(torch.cat(flat), 0)  # [sum of numels]

    def recv(self) -> Message:
        header = torch.empty(HEADER, dtype=torch.int64)
        dist.broadcast(header, 0)
        values = header.tolist()
        command, num_ints, num_tensors = values[:3]
        ints = tuple(values[3 : 3 + num_ints])
        specs = values[3 + num_ints : 3 + num_ints + 5 * num_tensors]
        shapes = [tuple(specs[5 * i + 2 : 5 * i + 2 + specs[5 * i + 1]]) for i in range(num_tensors)]
        tensors: tuple[torch.Tensor, ...] = ()
        if num_tensors:
            numels = [int(torch.Size(shape).numel()) for shape in shapes]
            payload = torch.empty(sum(numels), dtype=torch.int64, device=self.device)
            dist.broadcast(payload, 0)
            tensors = tuple(
                part.view(shape).to(DTYPES[specs[5 * i]])
                for i, (part, shape) in enumerate(zip(payload.split(numels), shapes, strict=True))
            )
        return Message(Command(command), ints, tensors)


# what each AttentionMetadata field travels as: (kind, value) pairs in the ints
_NONE, _TENSOR, _BOOL, _INT, _BACKEND = range(5)


def encode_forward(
    input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
) -> tuple[list[int], list[torch.Tensor]]:
    """A forward's inputs as ints and tensors (ids `[T]`, positions `[T]`, then meta's tensors)."""
    ints, tensors = [], [input_ids, positions]
    for field in fields(meta):
        value = getattr(meta, field.name)
        if value is None:
            ints += [_NONE, 0]
        elif isinstance(value, torch.Tensor):
            ints += [_TENSOR, 0]
            tensors.append(value)
        elif isinstance(value, bool):
            ints += [_BOOL, int(value)]
        elif isinstance(value, int):
            ints += [_INT, value]
        elif field.name == "backend":
            ints += [_BACKEND, BACKENDS.index(value)]
        else:  # a kvbench bug: a new kind of field needs a kind here
            raise TypeError(f"AttentionMetadata.{field.name}: cannot send {type(value).__name__}")
    return ints, tensors


def decode_forward(message: Message) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """`encode_forward`'s inputs back, on this rank's device."""
    input_ids, positions, *rest = message.tensors
    tensors = iter(rest)
    values = {}
    for index, field in enumerate(fields(AttentionMetadata)):
        kind, value = message.ints[2 * index : 2 * index + 2]
        if kind == _NONE:
            values[field.name] = None
        elif kind == _TENSOR:
            values[field.name] = next(tensors)
        elif kind == _BOOL:
            values[field.name] = bool(value)
        elif kind == _INT:
            values[field.name] = value
        else:
            values[field.name] = BACKENDS[value]
    return input_ids, positions, AttentionMetadata(**values)


def encode_mirror(
    op: Mirror, block_size: int, host_blocks: int, rows: tuple[tuple[int, ...], ...]
) -> tuple[list[int], list[torch.Tensor]]:
    """An arena operation as ints (geometry, op) and one int64 tensor of its rows `[N, width]`."""
    table = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), _MIRROR_WIDTH[op])  # [N, width]
    return [block_size, host_blocks, int(op)], [table]


def decode_mirror(message: Message) -> tuple[Mirror, int, int, tuple[tuple[int, ...], ...]]:
    """`encode_mirror`'s (op, block size, host blocks, rows), or ValueError for anything else."""
    if message.command != Command.MIRROR or len(message.ints) != 3 or len(message.tensors) != 1:
        raise ValueError(
            f"not an arena operation: {len(message.ints)} ints and {len(message.tensors)} tensors"
        )
    block_size, host_blocks, op = message.ints
    if op not in set(Mirror):
        raise ValueError(f"unknown arena operation {op}")
    op = Mirror(op)
    table = message.tensors[0]
    width = _MIRROR_WIDTH[op]
    if table.dtype != torch.int64 or table.dim() != 2 or table.shape[1] != width:
        got = f"{table.dtype} {list(table.shape)}"
        raise ValueError(f"{op.name}: expected int64 rows [N, {width}], got {got}")
    rows = tuple(tuple(row) for row in table.tolist())
    if block_size < 1 or host_blocks < 0 or any(value < 0 for row in rows for value in row):
        raise ValueError(f"{op.name}: a negative block or a block size under 1")
    if op == Mirror.SWAP and any(row[0] not in (0, 1) for row in rows):
        raise ValueError("SWAP: the direction must be 0 (to the device) or 1 (to the host)")
    return op, block_size, host_blocks, rows
