"""kvbench's trace format in its two text encodings, JSON lines and CSV (schema: tracefile.py).

Writers format rows with plain string operations (a million rows in a few seconds); readers go
through `textcols`, which parses whole chunks at once and still names the line of a bad cell.
Range checks (lengths >= 1, sorted arrivals, unique ids) are `to_trace`'s, not repeated here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import NoReturn, TextIO

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.requests import Request, Trace
from workloads.cells import int_lists, json_numbers, numbers
from workloads.columns import OPTIONAL_INT, OPTIONAL_LISTS, OPTIONAL_TEXT, Columns
from workloads.textcols import (
    csv_chunks,
    fail,
    join_chunks,
    json_chunks,
    to_checked_trace,
    values_of,
)

FORMAT = "kvbench-trace"
VERSION = 1
REQUIRED = ("request_id", "arrival_s", "prompt_len", "output_len")
DEFAULTS = {
    "prompt_ids": None,
    "prefix_group": None,
    "prefix_len": 0,
    "block_hashes": None,
    "conversation_id": None,
    "turn": None,
    "n": 1,
    "beam_width": 1,
}
OPTIONAL = tuple(DEFAULTS)  # in the order columns are written
HEADER_KEYS = ("format", "version", "name", "source", "hash_block_size", "meta")


@dataclass(frozen=True)
class Header:
    """The first line of a kvbench trace file: what the trace is, apart from its requests."""

    name: str
    source: str = ""
    hash_block_size: int | None = None
    meta: dict = field(default_factory=dict)


def header_json(trace: Trace) -> str:
    """The header object as one line of JSON."""
    header = {
        "format": FORMAT,
        "version": VERSION,
        "name": trace.name,
        "source": trace.source,
        "hash_block_size": trace.hash_block_size,
        "meta": trace.meta,
    }
    try:
        return json.dumps(header)
    except (TypeError, ValueError) as error:
        raise KvbenchError(f"trace {trace.name!r}: meta is not JSON-able ({error})") from None


def parse_header(obj: object, where: str, line: int | None) -> Header:
    """Check a header object; the version first, since another version may have other keys.
    `line`: the header's line; None for a Parquet file's, which has no lines: its schema metadata
    holds the header, and its errors name that."""
    place = f"line {line}, column" if line is not None else f"schema metadata {FORMAT!r}, key"

    def bad(key: str, why: str) -> NoReturn:
        raise KvbenchError(f"{where}: {place} {key}: {why}")

    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        bad("format", f"not a {FORMAT} header")
    if obj.get("version") != VERSION or type(obj.get("version")) is not int:
        bad("version", f"unsupported {FORMAT} version {obj.get('version')!r} (kvbench reads 1)")
    unknown = sorted(set(obj) - set(HEADER_KEYS))
    if unknown:
        bad(unknown[0], f"unknown header key (known: {', '.join(HEADER_KEYS)})")
    name, source = obj.get("name", ""), obj.get("source", "")
    block, meta = obj.get("hash_block_size"), obj.get("meta", {})
    for key, value, ok in (
        ("name", name, isinstance(name, str)),
        ("source", source, isinstance(source, str)),
        ("hash_block_size", block, block is None or (type(block) is int and block >= 1)),
        ("meta", meta, isinstance(meta, dict)),
    ):
        if not ok:
            bad(key, f"bad header value {value!r}")
    return Header(name, source, block, meta)


def used_optional(requests: Sequence[Request]) -> tuple[str, ...]:
    """The optional fields that some request sets to a value other than the default."""
    return tuple(name for name in OPTIONAL if set(map(attrgetter(name), requests)) != {DEFAULTS[name]})


def check_finite(requests: Sequence[Request]) -> None:
    """Refuse NaN or infinite arrivals before writing: JSON has no spelling for them."""
    arrival = np.fromiter(map(attrgetter("arrival_s"), requests), np.float64, len(requests))  # (N,)
    bad = np.flatnonzero(~np.isfinite(arrival))
    if bad.size:
        r = requests[int(bad[0])]
        raise KvbenchError(f"request {r.request_id}: arrival_s must be finite, got {r.arrival_s!r}")


def _arrival(r: Request) -> str:
    """The arrival time as the shortest text that reads back to the same float (valid JSON)."""
    return repr(float(r.arrival_s))


def write_jsonl(trace: Trace, out: TextIO) -> None:
    """Header line, then one object per request with only its non-default optional fields."""
    check_finite(trace.requests)
    out.write(header_json(trace) + "\n")
    optional = used_optional(trace.requests)
    for r in trace.requests:
        row = (
            f'{{"request_id": {r.request_id}, "arrival_s": {_arrival(r)}, '
            f'"prompt_len": {r.prompt_len}, "output_len": {r.output_len}'
        )
        for name in optional:
            value = getattr(r, name)
            if value != DEFAULTS[name]:
                row += f', "{name}": {json.dumps(value)}'
        out.write(row + "}\n")


def write_csv(trace: Trace, out: TextIO) -> None:
    """`# ` + header, the column row (required + used optional columns), one row per request."""
    check_finite(trace.requests)
    out.write("# " + header_json(trace) + "\n")
    optional = used_optional(trace.requests)
    out.write(",".join(REQUIRED + optional) + "\n")
    for r in trace.requests:
        head = f"{r.request_id},{_arrival(r)},{r.prompt_len},{r.output_len}"
        out.write(",".join([head] + [_csv_cell(r, name) for name in optional]) + "\n")


def _csv_cell(r: Request, name: str) -> str:
    """One optional cell: blank for the default, lists space-separated, text quoted when needed."""
    value = getattr(r, name)
    if value == DEFAULTS[name]:
        return ""
    if name in OPTIONAL_LISTS:
        return " ".join(map(str, value)) if value else "[]"
    if name in OPTIONAL_TEXT:
        if value == "":
            raise KvbenchError(
                f"request {r.request_id}: an empty {name} cannot be written to CSV (a blank cell means "
                "none); write .jsonl or .parquet"
            )
        if any(c in value for c in ',"\r\n') or value != value.strip():
            return '"' + value.replace('"', '""') + '"'
        return value
    return str(value)


def read_csv(f: TextIO, where: str, names: list[str], line: int, header: Header) -> Trace:
    """The rows after the column row `names` (at `line`) of a kvbench CSV."""
    _check_names(names, where, line)
    parts: dict[str, list] = {name: [] for name in [*names, "lines"]}
    for cells, lines in csv_chunks(f, where, line, names):
        parts["lines"].append(lines)
        for name, column in zip(names, cells, strict=True):
            if name in REQUIRED:
                parts[name].append(numbers(column, lines, where, name))
            elif name in OPTIONAL_INT:
                parts[name].append(numbers(column, lines, where, name, blank_ok=True))
            elif name in OPTIONAL_TEXT:
                parts[name].append([cell or None for cell in column])
            else:
                parts[name].append(int_lists(column, lines, where, name))
    return _build(parts, where, header)


def read_jsonl(f: TextIO, where: str, line: int, header: Header) -> Trace:
    """The request objects after line `line` of a kvbench JSONL file."""
    known = frozenset(REQUIRED + OPTIONAL)
    parts: dict[str, list] = {name: [] for name in [*REQUIRED, *OPTIONAL, "lines"]}
    for records, lines in json_chunks(f, where, line):
        parts["lines"].append(lines)
        keys = set().union(*records)
        if not keys <= known:
            row = next(i for i, r in enumerate(records) if not r.keys() <= known)
            extra = sorted(set(records[row]) - known)[0]
            fail(where, int(lines[row]), extra, f"unknown field (known: {', '.join(REQUIRED + OPTIONAL)})")
        for name in REQUIRED + OPTIONAL:
            if name not in keys and name not in REQUIRED:
                parts[name].append(None)  # absent from this chunk: filled in below if used elsewhere
                continue
            values = values_of(records, name)
            if name in REQUIRED or name in OPTIONAL_INT:
                parts[name].append(json_numbers(values, lines, where, name, required=name in REQUIRED))
            else:
                parts[name].append(_json_objects(values, lines, where, name))
    for name in OPTIONAL:
        pieces = parts[name]
        if all(piece is None for piece in pieces):
            pieces.clear()
        for i, lines in enumerate(parts["lines"] if pieces else ()):
            if pieces[i] is None:
                pieces[i] = np.full(len(lines), np.nan) if name in OPTIONAL_INT else [None] * len(lines)
    return _build(parts, where, header)


def _json_objects(values: list, lines: np.ndarray, where: str, name: str) -> list:
    """Text fields stay str (or None); list fields become tuples of ints (or None)."""
    is_list = name in OPTIONAL_LISTS
    for i, value in enumerate(values):
        if value is None:
            continue
        if is_list:
            if type(value) is not list or not all(type(x) is int for x in value):
                fail(where, int(lines[i]), name, f"must be a list of integers, got {value!r}")
            values[i] = tuple(value)
        elif type(value) is not str:
            fail(where, int(lines[i]), name, f"must be a string, got {value!r}")
    return values


def _check_names(names: list[str], where: str, line: int) -> None:
    known = REQUIRED + OPTIONAL
    for i, name in enumerate(names):
        if name not in known:
            fail(where, line, name or f"#{i + 1}", f"unknown column (known: {', '.join(known)})")
        if name in names[:i]:
            fail(where, line, name, "column appears twice")
    for name in REQUIRED:
        if name not in names:
            fail(where, line, name, f"missing column ({FORMAT} columns: {', '.join(known)})")


def _build(parts: dict[str, list], where: str, header: Header) -> Trace:
    """Join the chunks into `Columns` and validate them into the trace the header describes."""
    cols = Columns(**join_chunks(parts, where), extra=dict(header.meta))
    trace = to_checked_trace(cols, header.name, where, hash_block_size=header.hash_block_size)
    return replace(trace, source=header.source)
