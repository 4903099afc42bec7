"""Chunked CSV and JSON-lines readers that yield columns and keep every row's true line number.

All trace loaders (the kvbench format and the public traces) read text through these helpers, so
a million-row file is parsed at C speed (``str.split``, one ``json.loads`` per chunk, numpy casts
of whole columns) while a bad cell is still reported with its file, line and column: a column is
converted in one call, and only when that fails is it walked cell by cell to find the culprit.
Chunks bound the Python strings alive at once to ``CHUNK`` rows, which keeps a 1M-row load well
under 1 GiB.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, islice, repeat
from typing import NoReturn, TextIO

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.gc_pause import gc_paused
from kvbench.requests import Trace
from workloads.columns import Columns, Where, to_trace

CHUNK = 1 << 16
"""Rows parsed per step: large enough to amortise per-call overhead, small enough for memory."""


def fail(where: str, line: int, column: str | None, why: str) -> NoReturn:
    """Raise the one-line error every loader uses: file, line, column, what is wrong."""
    place = f"line {line}" if column is None else f"line {line}, column {column}"
    raise KvbenchError(f"{where}: {place}: {why}")


def to_checked_trace(
    cols: Columns,
    name: str,
    where: str,
    *,
    hash_block_size: int | None = None,
    renames: Mapping[str, str] | None = None,
    unit: str = "line",
) -> Trace:
    """`to_trace` with the collector paused and errors in the file's own terms.

    A foreign format passes `renames` (field -> the column as spelled in the file, e.g.
    prompt_len -> ContextTokens) and a file without lines (Parquet) passes `unit="row"`.
    """
    with gc_paused():
        return to_trace(cols, name, Where(where, unit, dict(renames or {})), hash_block_size=hash_block_size)


def join_chunks(parts: dict[str, list], where: str) -> dict[str, np.ndarray | list]:
    """Per-chunk pieces joined per field: arrays concatenated, lists chained; empty fields dropped."""
    if not parts["lines"]:
        raise KvbenchError(f"{where}: the trace has no requests")
    joined: dict[str, np.ndarray | list] = {}
    for name, chunks in parts.items():
        if chunks and isinstance(chunks[0], np.ndarray):
            joined[name] = np.concatenate(chunks)
        elif chunks:
            joined[name] = list(chain.from_iterable(chunks))
    return joined


def csv_chunks(
    f: TextIO, where: str, last_line: int, names: Sequence[str]
) -> Iterator[tuple[list[Sequence[str]], np.ndarray]]:
    """The rows of `f` after line `last_line`, CHUNK at a time: (cells per column, (rows,) lines).

    Blank lines are skipped; a row with the wrong number of cells is an error. Until the first
    double quote, rows are split with ``str.split`` (one row per line); from there on the csv
    module takes over, since a quoted cell may hold commas and line breaks.
    """
    width = len(names)
    while True:
        raw = list(islice(f, CHUNK))
        if not raw:
            return
        text = "".join(raw)
        if '"' in text:
            yield from _quoted_chunks(chain(raw, f), where, last_line, names)
            return
        rows = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")[: len(raw)]
        lines = np.arange(last_line + 1, last_line + 1 + len(raw))  # (rows,)
        last_line += len(raw)
        commas = np.fromiter(map(str.count, rows, repeat(",")), dtype=np.int64, count=len(rows))
        odd = np.flatnonzero(commas != width - 1)
        if odd.size:
            for i in odd.tolist():
                if rows[i].strip():
                    _wrong_width(where, int(lines[i]), names, int(commas[i]) + 1)
            keep = commas == width - 1
            rows = [row for row, ok in zip(rows, keep.tolist(), strict=True) if ok]
            lines = lines[keep]
        if rows:
            flat = ",".join(rows).split(",")  # (rows * width,) row-major
            yield [flat[j::width] for j in range(width)], lines


def _quoted_chunks(
    source: Iterable[str], where: str, last_line: int, names: Sequence[str]
) -> Iterator[tuple[list[Sequence[str]], np.ndarray]]:
    """`csv_chunks` for text with quoted cells: a row may span several physical lines."""
    reader = csv.reader(source, strict=True)  # strict: an unclosed quote is an error, not a cell
    while True:
        before = reader.line_num
        try:
            rows = list(islice(reader, CHUNK))
        except csv.Error as error:
            fail(where, last_line + reader.line_num, None, f"bad CSV quoting ({error})")
        if not rows:
            return
        if reader.line_num - before == len(rows):
            spans = np.ones(len(rows), dtype=np.int64)
        else:  # some cell holds line breaks: count them to recover where each row starts
            spans = np.array([1 + sum(map(_breaks, row)) for row in rows], dtype=np.int64)
        lines = last_line + before + 1 + np.concatenate([[0], np.cumsum(spans)[:-1]])  # (rows,)
        widths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        odd = np.flatnonzero(widths != len(names))
        if odd.size:
            for i in odd.tolist():
                if widths[i] and any(cell.strip() for cell in rows[i]):
                    _wrong_width(where, int(lines[i]), names, int(widths[i]))
            keep = widths == len(names)
            rows = [row for row, ok in zip(rows, keep.tolist(), strict=True) if ok]
            lines = lines[keep]
        if rows:
            yield list(zip(*rows, strict=True)), lines


def _breaks(cell: str) -> int:
    """Line breaks inside a quoted cell, counted as the text reader splits lines."""
    return cell.count("\n") + cell.count("\r") - cell.count("\r\n")


def _wrong_width(where: str, line: int, names: Sequence[str], got: int) -> NoReturn:
    fail(where, line, None, f"expected {len(names)} cells ({', '.join(names)}), got {got}")


class DuplicateKey(ValueError):
    """A JSON object with a key given twice; `key` is the key."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """`json.loads`'s object_pairs_hook: the object, refusing a key given twice. json keeps the
    last value silently, so a row holding two `prompt_len`s would run one the file also
    contradicts; which one was meant only the user can say."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        raise DuplicateKey(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return record


def json_chunks(f: TextIO, where: str, last_line: int) -> Iterator[tuple[list[dict], np.ndarray]]:
    """The JSON objects of `f`, one per line after `last_line`, CHUNK at a time, with their lines.

    Each chunk is parsed by one ``json.loads`` of the lines joined into an array; if that fails
    or does not give one object per line (a bad line, a blank line, a key given twice), the
    chunk is parsed again line by line, which skips blank lines and names the first bad one.
    """
    while True:
        raw = list(islice(f, CHUNK))
        if not raw:
            return
        lines = np.arange(last_line + 1, last_line + 1 + len(raw))  # (rows,)
        last_line += len(raw)
        try:
            records = json.loads("[" + ",".join(raw) + "]", object_pairs_hook=unique_keys)
        except (json.JSONDecodeError, DuplicateKey):
            records = None
        if records is None or len(records) != len(raw) or set(map(type, records)) != {dict}:
            records, lines = _json_line_by_line(raw, lines, where)
        if records:
            yield records, lines


def values_of(records: list[dict], key: str) -> list:
    """Every record's value of `key` (None where absent), without a Python-level loop."""
    return list(map(dict.get, records, repeat(key)))


def _json_line_by_line(raw: list[str], lines: np.ndarray, where: str) -> tuple[list[dict], np.ndarray]:
    records, kept = [], []
    for text, line in zip(raw, lines.tolist(), strict=True):
        if not text.strip():
            continue
        try:  # stripped: errors point into the text, not at its newline
            record = json.loads(text.rstrip("\r\n"), object_pairs_hook=unique_keys)
        except json.JSONDecodeError as e:
            fail(where, line, str(e.colno), f"invalid JSON ({e.msg})")
        except DuplicateKey as e:
            fail(where, line, e.key, "given twice in one object")
        if not isinstance(record, dict):
            fail(where, line, None, f"expected a JSON object, got {text.strip()[:40]!r}")
        records.append(record)
        kept.append(line)
    return records, np.array(kept, dtype=np.int64)
