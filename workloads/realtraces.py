"""Loaders for the public LLM-serving traces of shared/traces/SOURCES.md, recognised by their columns.

- Azure LLM inference 2023 (Splitwise) CSV: `TIMESTAMP, ContextTokens, GeneratedTokens`. Real
  arrivals: seconds since the first row, from wall-clock stamps with 100 ns resolution, kept
  as integer nanoseconds until the final subtraction so no precision is lost to float rounding.
- vidur / etalon stats CSV: `num_prefill_tokens, num_decode_tokens` (other columns ignored).
  Lengths only: every arrival is 0 and `meta["timestamps"]` is False, telling callers that they
  must generate arrivals (replaying all-zero times would be an offline burst nobody asked for).
- Mooncake JSONL: `{"timestamp": ms, "input_length", "output_length", "hash_ids"}`. `hash_ids`
  are 512-token prefix-block hashes and become `block_hashes` (`hash_block_size = 512`); their
  count is checked against the prompt length, which catches a trace hashed at another block size.
  Many rows share a millisecond: equal times are legal, decreasing ones are not.

A loader gets the open file positioned after what detection (`tracedetect`) consumed and the line
number reached, so each file is opened and read once. Timestamps are checked as written (finite,
never decreasing, spanning at most `MAX_ARRIVAL_S`) before they are shifted to start at 0, so an
error names the culprit's line and cell; the other range checks are `to_trace`'s, its messages
rewritten to name the file's own columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.requests import Trace, too_late
from workloads.cells import datetimes_ns, json_numbers, numbers
from workloads.columns import MAX_ARRIVAL_S, Columns
from workloads.textcols import (
    csv_chunks,
    fail,
    join_chunks,
    json_chunks,
    to_checked_trace,
    values_of,
)

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
STATS_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK = 512  # tokens per hash_ids entry


def read_azure(f: TextIO, where: str, names: list[str], line: int, name: str) -> Trace:
    """Azure LLM inference rows after the column row `names` (at `line`)."""
    at = [names.index(column) for column in AZURE_COLUMNS]
    parts: dict[str, list] = {"stamp": [], "prompt_len": [], "output_len": [], "lines": []}
    for cells, lines in csv_chunks(f, where, line, names):
        parts["lines"].append(lines)
        stamp = datetimes_ns(cells[at[0]], lines, where, AZURE_COLUMNS[0])
        _check_stamps(stamp, cells[at[0]], lines, parts["stamp"], where, AZURE_COLUMNS[0], per_second=1e9)
        parts["stamp"].append(stamp)
        parts["prompt_len"].append(numbers(cells[at[1]], lines, where, AZURE_COLUMNS[1]))
        parts["output_len"].append(numbers(cells[at[2]], lines, where, AZURE_COLUMNS[2]))
    joined = join_chunks(parts, where)
    stamp = joined.pop("stamp")  # (N,) int64 ns since the epoch
    start = int(stamp.min())
    meta = {"format": "azure-llm-inference", "timestamps": True, "start": str(np.datetime64(start, "ns"))}
    cols = Columns(arrival_s=(stamp - start) / 1e9, **joined, extra=meta)
    renames = dict(zip(("arrival_s", "prompt_len", "output_len"), AZURE_COLUMNS, strict=True))
    return to_checked_trace(cols, name, where, renames=renames)


def read_stats(f: TextIO, where: str, names: list[str], line: int, name: str) -> Trace:
    """vidur/etalon stats rows: lengths only, all arrivals 0, `meta["timestamps"] = False`."""
    at = [names.index(column) for column in STATS_COLUMNS]
    parts: dict[str, list] = {"prompt_len": [], "output_len": [], "lines": []}
    for cells, lines in csv_chunks(f, where, line, names):
        parts["lines"].append(lines)
        parts["prompt_len"].append(numbers(cells[at[0]], lines, where, STATS_COLUMNS[0]))
        parts["output_len"].append(numbers(cells[at[1]], lines, where, STATS_COLUMNS[1]))
    joined = join_chunks(parts, where)
    meta = {"format": "vidur-stats", "timestamps": False}
    cols = Columns(arrival_s=np.zeros(len(joined["lines"])), **joined, extra=meta)
    renames = dict(zip(("prompt_len", "output_len"), STATS_COLUMNS, strict=True))
    return to_checked_trace(cols, name, where, renames=renames)


def read_mooncake(f: TextIO, where: str, line: int, name: str) -> Trace:
    """Mooncake records after line `line`; `hash_ids` (optional per row) become block hashes."""
    parts: dict[str, list] = {
        "stamp": [],
        "prompt_len": [],
        "output_len": [],
        "block_hashes": [],
        "lines": [],
    }
    for records, lines in json_chunks(f, where, line):
        parts["lines"].append(lines)
        written = values_of(records, "timestamp")
        stamp = json_numbers(written, lines, where, "timestamp")
        _check_stamps(stamp, written, lines, parts["stamp"], where, "timestamp", per_second=1e3)
        parts["stamp"].append(stamp)
        for field, key in (("prompt_len", "input_length"), ("output_len", "output_length")):
            parts[field].append(json_numbers(values_of(records, key), lines, where, key))
        parts["block_hashes"].append(_hash_ids(values_of(records, "hash_ids"), lines, where))
    joined = join_chunks(parts, where)
    stamp = joined.pop("stamp")  # (N,) milliseconds
    hashes = joined.pop("block_hashes")
    has_hashes = any(h is not None for h in hashes)
    cols = Columns(
        arrival_s=(stamp - stamp.min()) / 1000.0,
        **joined,
        block_hashes=hashes if has_hashes else None,
        extra={"format": "mooncake", "timestamps": True},
    )
    renames = dict(
        zip(("arrival_s", "prompt_len", "output_len", "block_hashes"), MOONCAKE_FIELDS, strict=True)
    )
    block = MOONCAKE_BLOCK if has_hashes else None
    trace = to_checked_trace(cols, name, where, hash_block_size=block, renames=renames)
    if has_hashes:
        _check_hash_counts(trace, cols.lines, where)
    return trace


def _check_stamps(
    stamp: np.ndarray,
    written: Sequence,
    lines: np.ndarray,
    before: list,
    where: str,
    column: str,
    per_second: float,
) -> None:
    """One chunk's stamps (n,), in the file's unit (`per_second` a second), before they are shifted
    to start at 0: finite, never below the stamp before, and at most `MAX_ARRIVAL_S` after the
    first row's. `before` holds the earlier chunks' stamps. Checked here, not after the shift,
    so an error names the culprit's own line and the value as written (`written`, (n,)).
    """
    previous = before[-1][-1:] if before else stamp[:1]
    first = before[0][0] if before else stamp[0]
    with np.errstate(invalid="ignore"):
        bad = [
            (~np.isfinite(stamp.astype(np.float64)), "must be a finite time"),
            (stamp < np.concatenate([previous, stamp[:-1]]), "arrival times must not decrease"),
            (stamp.astype(np.float64) - float(first) > MAX_ARRIVAL_S * per_second, _LATE),
        ]
    for rows, why in bad:  # in this order: a NaN first row would pass the other two checks
        if rows.any():
            row = int(np.flatnonzero(rows)[0])
            fail(where, int(lines[row]), column, f"{why}, got {written[row]!r}")


_LATE = too_late(" after the first row's")


def _hash_ids(values: list, lines: np.ndarray, where: str) -> list[tuple[int, ...] | None]:
    """Each row's hash_ids as a tuple of ints (None where the row has none)."""
    out: list[tuple[int, ...] | None] = []
    for value, line_no in zip(values, lines.tolist(), strict=True):
        if value is None:
            out.append(None)
        elif type(value) is list and all(type(x) is int for x in value):
            out.append(tuple(value))
        else:
            fail(where, line_no, "hash_ids", f"must be a list of integers, got {str(value)[:60]}")
    return out


def _check_hash_counts(trace: Trace, lines: np.ndarray, where: str) -> None:
    """Every row hashes ceil(input_length / 512) blocks (the last one partial), or has none."""
    for r, line_no in zip(trace.requests, lines.tolist(), strict=True):
        if r.block_hashes is not None and len(r.block_hashes) != -(-r.prompt_len // MOONCAKE_BLOCK):
            raise KvbenchError(
                f"{where}: line {line_no}, column hash_ids: expected ceil({r.prompt_len} / {MOONCAKE_BLOCK})"
                f" = {-(-r.prompt_len // MOONCAKE_BLOCK)} hashes, got {len(r.block_hashes)}"
            )
