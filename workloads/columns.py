"""Columnar traces: what every loader produces, validated in one vectorised pass.

A loader (the kvbench format, Azure, vidur, Mooncake, text datasets, generators) fills a
`Columns` with numpy arrays and, for the few list-valued fields, Python lists; `to_trace`
checks every value and builds the immutable `Trace`. Checking columns instead of rows keeps a
million-row file fast, and a failed check is located afterwards, so the error still names the
file, the line and the column.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from itertools import chain

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.requests import MAX_ARRIVAL_S, Request, Trace, too_late

OPTIONAL_INT = ("prefix_len", "turn", "n", "beam_width")
OPTIONAL_TEXT = ("prefix_group", "conversation_id")
OPTIONAL_LISTS = ("prompt_ids", "block_hashes")
INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
EXACT_FLOAT = 2.0**53  # above it, float64 skips integers


@dataclass
class Columns:
    """One array per field, all of length N; `lines[i]` is row i's line in its file (1-based).

    Mutable only while a loader fills it; `to_trace` freezes the result.
    """

    arrival_s: np.ndarray  # (N,) float64 seconds
    prompt_len: np.ndarray  # (N,) int64
    output_len: np.ndarray  # (N,) int64
    request_id: np.ndarray | None = None  # (N,) int64; None: 0..N-1 in file order
    lines: np.ndarray | None = None  # (N,) int64 line numbers for error messages
    prefix_len: np.ndarray | None = None
    turn: np.ndarray | None = None
    n: np.ndarray | None = None
    beam_width: np.ndarray | None = None
    prefix_group: list[str | None] | None = None
    conversation_id: list[str | None] | None = None
    prompt_ids: list[tuple[int, ...] | None] | None = None
    block_hashes: list[tuple[int, ...] | None] | None = None
    extra: dict = field(default_factory=dict)  # loader notes for `Trace.meta`

    def __len__(self) -> int:
        return len(self.arrival_s)

    def take(self, index: np.ndarray) -> Columns:
        """The rows at `index` (a sorted selection or a permutation), every field alike."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                out[f.name] = value[index]
            elif isinstance(value, list):
                out[f.name] = [value[i] for i in index.tolist()]
            else:
                out[f.name] = value
        return Columns(**out)


@dataclass(frozen=True)
class Where:
    """How errors name a source: its path, its unit of position, its own column names."""

    source: str  # a file path or a spec
    unit: str = "line"  # "row" for files without lines (Parquet)
    column_names: Mapping[str, str] = field(default_factory=dict)  # field -> column as in the file

    def column(self, name: str) -> str:
        return self.column_names.get(name, name)


def _fail(where: Where, cols: Columns, bad: np.ndarray, column: str, why: str, values: np.ndarray) -> None:
    """Raise for the first True of `bad` (N,), naming file, line (or row) and column."""
    row = int(np.flatnonzero(bad)[0])
    line = int(cols.lines[row]) if cols.lines is not None else row + 1
    value = values[row].item() if isinstance(values[row], np.generic) else values[row]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:  # not 1e308's 309 digits
        value = int(value)
    raise KvbenchError(
        f"{where.source}: {where.unit} {line}, column {where.column(column)}: {why}, got {value!r}"
    )


def to_trace(cols: Columns, name: str, where: str | Where, *, hash_block_size: int | None = None) -> Trace:
    """Validate every column and build the `Trace` (rows must already be in arrival order).

    `where` names the source in errors (a file path or spec, or a `Where` with the file's own
    column names). Decreasing arrival times are errors: a trace's order is its arrival order,
    and replaying a shuffled file would silently reorder requests; equal times are fine.
    """
    where = where if isinstance(where, Where) else Where(where)
    count = len(cols)
    if count == 0:
        raise KvbenchError(f"{where.source}: the trace has no requests")
    arrival = np.asarray(cols.arrival_s, dtype=np.float64)
    _fail_if(~np.isfinite(arrival) | (arrival < 0), where, cols, "arrival_s", "must be a time >= 0", arrival)
    _fail_if(arrival > MAX_ARRIVAL_S, where, cols, "arrival_s", too_late(), arrival)
    if count > 1:
        back = np.concatenate([[False], np.diff(arrival) < 0])
        _fail_if(back, where, cols, "arrival_s", "arrival times must not decrease", arrival)
    prompt = _ints(cols.prompt_len, where, cols, "prompt_len", minimum=1)
    output = _ints(cols.output_len, where, cols, "output_len", minimum=1)
    ids = (
        np.arange(count) if cols.request_id is None else _ints(cols.request_id, where, cols, "request_id", 0)
    )
    order = np.argsort(ids, kind="stable")  # sorting beats hashing (np.unique) on 1M ids
    repeats = np.diff(ids[order]) == 0
    if repeats.any():
        dup = np.zeros(count, dtype=bool)
        dup[order[1:][repeats]] = True
        _fail(where, cols, dup, "request_id", "request ids must be unique", ids)
    ints = {
        "prefix_len": _optional(cols.prefix_len, where, cols, "prefix_len", 0, count, 0),
        "turn": _optional(cols.turn, where, cols, "turn", 0, count, -1),
        "n": _optional(cols.n, where, cols, "n", 1, count, 1),
        "beam_width": _optional(cols.beam_width, where, cols, "beam_width", 1, count, 1),
    }
    _fail_if(
        ints["prefix_len"] > prompt,
        where,
        cols,
        "prefix_len",
        "must not exceed prompt_len",
        ints["prefix_len"],
    )
    texts = {k: getattr(cols, k) or [None] * count for k in OPTIONAL_TEXT}
    lists = {k: getattr(cols, k) or [None] * count for k in OPTIONAL_LISTS}
    ungrouped = np.fromiter((g is None for g in texts["prefix_group"]), dtype=bool, count=count)  # [N]
    _fail_if(  # a prefix is shared with the requests of its group: with none, nothing reads it
        (ints["prefix_len"] > 0) & ungrouped,
        where,
        cols,
        "prefix_len",
        "needs the prefix_group whose requests share the prefix",
        ints["prefix_len"],
    )
    if cols.prompt_ids is not None:
        _check_prompt_ids(cols.prompt_ids, prompt, where, cols)
    if cols.block_hashes is not None and hash_block_size is None:
        _check_hashes_have_a_size(cols.block_hashes, where, cols)
    requests = tuple(
        Request(
            request_id=rid, arrival_s=t, prompt_len=p, output_len=o, prompt_ids=pids,
            prefix_group=group, prefix_len=plen, block_hashes=hashes, conversation_id=conv,
            turn=None if turn < 0 else turn, n=n, beam_width=beam,
        )
        for rid, t, p, o, pids, group, plen, hashes, conv, turn, n, beam in zip(
            ids.tolist(), arrival.tolist(), prompt.tolist(), output.tolist(), lists["prompt_ids"],
            texts["prefix_group"], ints["prefix_len"].tolist(), lists["block_hashes"],
            texts["conversation_id"], ints["turn"].tolist(), ints["n"].tolist(),
            ints["beam_width"].tolist(), strict=True,
        )
    )  # fmt: skip
    return Trace(name, requests, source=where.source, hash_block_size=hash_block_size, meta=dict(cols.extra))


def _check_prompt_ids(prompt_ids: list, prompt: np.ndarray, where: Where, cols: Columns) -> None:
    """Each row's token ids: as many as `prompt_len`, each a non-negative 64-bit integer (no
    tokenizer makes a negative id; whether a model can embed the others is `check_vocabulary`'s,
    once the model is known)."""
    lengths = np.array([-1 if ids is None else len(ids) for ids in prompt_ids], dtype=np.int64)  # (N,)
    _fail_if(
        (lengths >= 0) & (lengths != prompt),
        where,
        cols,
        "prompt_ids",
        "length must equal prompt_len",
        lengths,
    )
    try:
        flat, ends = flat_ids(prompt_ids)  # (T,), (N,)
    except OverflowError:  # rare: find the row, one at a time
        worst = [next((i for i in ids or () if not INT64_MIN <= i <= INT64_MAX), None) for ids in prompt_ids]
        bad = np.array([w is not None for w in worst], dtype=bool)  # (N,)
        why = "token ids must be 64-bit integers"
        _fail_if(bad, where, cols, "prompt_ids", why, np.array(worst, dtype=object))
        return
    negative = np.flatnonzero(flat < 0)
    if negative.size:
        rows = np.searchsorted(ends, negative, side="right")  # the row of each negative id
        bad = np.zeros(len(prompt_ids), dtype=bool)  # (N,)
        bad[rows] = True
        first = np.zeros(len(prompt_ids), dtype=np.int64)
        first[rows[::-1]] = flat[negative[::-1]]  # each row's first negative id
        _fail_if(bad, where, cols, "prompt_ids", "token ids must be >= 0", first)


def _check_hashes_have_a_size(block_hashes: list, where: Where, cols: Columns) -> None:
    """Refuse block hashes without the header's `hash_block_size`: the prefix cache keys blocks
    by hash only at a known number of tokens per hash, so it would silently ignore them."""
    hashed = np.array([hashes is not None for hashes in block_hashes], dtype=bool)  # (N,)
    why = "needs the header's hash_block_size (tokens per hash), which is missing"
    values = np.fromiter(block_hashes, dtype=object, count=len(block_hashes))  # (N,) tuples kept whole
    _fail_if(hashed, where, cols, "block_hashes", why, values)


def flat_ids(prompt_ids: list) -> tuple[np.ndarray, np.ndarray]:
    """Every row's ids in one int64 array (T,), and each row's end in it (N,): one C-speed pass
    over a million rows, where a min and max per row would be two Python calls each."""
    ends = np.cumsum([0 if ids is None else len(ids) for ids in prompt_ids], dtype=np.int64)  # (N,)
    total = int(ends[-1]) if len(ends) else 0
    flat = np.fromiter(chain.from_iterable(ids for ids in prompt_ids if ids), dtype=np.int64, count=total)
    return flat, ends


def check_vocabulary(trace: Trace, vocab: int, model: str) -> None:
    """Refuse prompt token ids that `model` (with `vocab` ids) cannot embed, before a real run.

    A trace tokenized for another model would otherwise fail deep in the first prefill with an
    index error. Requests are named by `request_id`, the row's own id in the trace file (files
    without an id column number their rows 0, 1, ... in file order).
    """
    flat, ends = flat_ids([r.prompt_ids for r in trace.requests])  # (T,), (N,)
    bad = np.flatnonzero((flat < 0) | (flat >= vocab))
    if bad.size:
        first = int(bad[0])
        request = trace.requests[int(np.searchsorted(ends, first, side="right"))]
        raise KvbenchError(
            f"{trace.source or trace.name}: request_id {request.request_id}, column prompt_ids: token "
            f"id {int(flat[first])} is outside --model {model}'s vocabulary of {vocab} ids (0..{vocab - 1})"
        )


def _fail_if(bad: np.ndarray, where: Where, cols: Columns, column: str, why: str, values: np.ndarray) -> None:
    if bad.any():
        _fail(where, cols, bad, column, why, values)


def _ints(values: np.ndarray, where: Where, cols: Columns, column: str, minimum: int) -> np.ndarray:
    """`values` as int64, refusing fractions, NaN and values below `minimum`.

    Integers stay integers (a round trip through float64 would change ids above 2**53); a
    column that holds floats must keep below 2**53, where a float still names one integer.
    """
    values = np.asarray(values)
    if values.dtype.kind == "i":
        _fail_if(values < minimum, where, cols, column, f"must be >= {minimum}", values)
        return values.astype(np.int64)
    as_float = values.astype(np.float64)
    _fail_if(~np.isfinite(as_float), where, cols, column, "must be a number", as_float)
    _fail_if(as_float != np.floor(as_float), where, cols, column, "must be a whole number", as_float)
    _fail_if(as_float < minimum, where, cols, column, f"must be >= {minimum}", as_float)
    _fail_if(
        as_float > EXACT_FLOAT,
        where,
        cols,
        column,
        "must be at most 2**53 unless written as an integer",
        as_float,
    )
    return as_float.astype(np.int64)


def _optional(
    values: np.ndarray | None,
    where: Where,
    cols: Columns,
    column: str,
    minimum: int,
    count: int,
    default: int,
) -> np.ndarray:
    """An optional integer column; missing values (None or NaN: a blank CSV cell) take `default`."""
    if values is None:
        return np.full(count, default, dtype=np.int64)
    as_float = np.asarray(values, dtype=np.float64)
    blank = np.isnan(as_float)
    if not blank.any():
        return _ints(values, where, cols, column, minimum)
    present = _ints(np.where(blank, minimum, as_float), where, cols, column, minimum)
    return np.where(blank, default, present)


def columns_of(trace: Trace) -> Columns:
    """A trace back in columns (to transform it: window, re-time, add sharing)."""
    reqs = trace.requests
    count = len(reqs)

    def ints(name: str, default: int) -> np.ndarray | None:
        values = [getattr(r, name) for r in reqs]
        if all(v == default for v in values):
            return None
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

    def objects(name: str) -> list | None:
        values = [getattr(r, name) for r in reqs]
        return None if all(v is None for v in values) else values

    return Columns(
        arrival_s=np.fromiter((r.arrival_s for r in reqs), dtype=np.float64, count=count),
        prompt_len=np.fromiter((r.prompt_len for r in reqs), dtype=np.int64, count=count),
        output_len=np.fromiter((r.output_len for r in reqs), dtype=np.int64, count=count),
        request_id=np.fromiter((r.request_id for r in reqs), dtype=np.int64, count=count),
        prefix_len=ints("prefix_len", 0),
        turn=ints("turn", None),
        n=ints("n", 1),
        beam_width=ints("beam_width", 1),
        prefix_group=objects("prefix_group"),
        conversation_id=objects("conversation_id"),
        prompt_ids=objects("prompt_ids"),
        block_hashes=objects("block_hashes"),
        extra=dict(trace.meta),
    )
