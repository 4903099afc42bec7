"""Which trace format a text file holds, from its first line, and the loader that reads the rest.

Detection reads only the first non-blank line (plus the column row after a kvbench CSV comment
header) and the loader continues from there, so a file is opened and read once. When no format
matches exactly, the closest one (most of its columns present, allowing for case, punctuation and
near-misses) is named with its first missing column, which turns a typo into a one-line fix;
when none is close, the message lists every known format and the columns found.
"""

from __future__ import annotations

import csv
import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import NoReturn, TextIO

from kvbench.errors import KvbenchError
from kvbench.requests import Trace
from workloads.realtraces import (
    AZURE_COLUMNS,
    MOONCAKE_FIELDS,
    STATS_COLUMNS,
    read_azure,
    read_mooncake,
    read_stats,
)
from workloads.textcols import DuplicateKey, fail, unique_keys
from workloads.tracetext import FORMAT, OPTIONAL, REQUIRED, Header, parse_header, read_csv, read_jsonl

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


@dataclass(frozen=True)
class KnownFormat:
    """A format as detection sees it: the columns that identify it and those it may have."""

    label: str
    required: tuple[str, ...]
    listed: tuple[str, ...]  # every column it may have, for scoring near-misses and for messages


KVBENCH_CSV = KnownFormat(f"{FORMAT} CSV", REQUIRED, REQUIRED + OPTIONAL)
AZURE = KnownFormat("Azure trace", AZURE_COLUMNS, AZURE_COLUMNS)
STATS = KnownFormat("vidur/etalon stats", STATS_COLUMNS, (*STATS_COLUMNS, "num_total_tokens", "pd_ratio"))
KVBENCH_JSONL = KnownFormat(f"{FORMAT} JSONL", REQUIRED, REQUIRED + OPTIONAL)
MOONCAKE = KnownFormat("Mooncake trace", MOONCAKE_FIELDS[:3], MOONCAKE_FIELDS)
CSV_FORMATS = (KVBENCH_CSV, AZURE, STATS)
JSON_FORMATS = (KVBENCH_JSONL, MOONCAKE)


def read_text(f: TextIO, path: Path, where: str) -> Trace:
    """Detect the format of the text file `f` (opened from `path`) and read it to a Trace."""
    line_no, first = _next_nonblank(f, 0)
    if first is None:
        raise KvbenchError(f"{where}: the file is empty")
    text = first.strip()
    if text.startswith("{") or (path.suffix.lower() in JSON_SUFFIXES and not text.startswith("#")):
        return _read_json(f, where, first, line_no, path.stem)
    if text.startswith("#"):
        header = parse_header(_json(text[1:], where, line_no), where, line_no)
        row_no, row = _next_nonblank(f, line_no)
        if row is None:
            raise KvbenchError(f"{where}: line {line_no + 1}: no column row after the {FORMAT} header")
        return read_csv(f, where, _cells(row), row_no, header)
    names = _cells(first)
    fmt = _match(names, CSV_FORMATS, where, line_no)
    if fmt is KVBENCH_CSV:
        return read_csv(f, where, names, line_no, Header(name=path.stem, source=where))
    if fmt is AZURE:
        return read_azure(f, where, names, line_no, path.stem)
    return read_stats(f, where, names, line_no, path.stem)


def _read_json(f: TextIO, where: str, first: str, line_no: int, stem: str) -> Trace:
    """A JSON-lines file: a kvbench header line, or a first record whose fields name the format."""
    obj = _json(first, where, line_no)
    if not isinstance(obj, dict):
        fail(where, line_no, None, f"expected a JSON object, got {first.strip()[:40]!r}")
    if "format" in obj:
        if obj["format"] != FORMAT:
            _unknown(where, line_no, list(obj))
        return read_jsonl(f, where, line_no, parse_header(obj, where, line_no))
    fmt = _match(list(obj), JSON_FORMATS, where, line_no, noun="field")
    rest = chain([first], f)  # the first line is a record: read it again with the rest
    if fmt is KVBENCH_JSONL:
        return read_jsonl(rest, where, line_no - 1, Header(name=stem, source=where))
    return read_mooncake(rest, where, line_no - 1, stem)


def _next_nonblank(f: TextIO, line_no: int) -> tuple[int, str | None]:
    """(its line number, the next non-blank line), or (last line number, None) at the end."""
    for line in iter(f.readline, ""):
        line_no += 1
        if line.strip():
            return line_no, line
    return line_no, None


def _json(text: str, where: str, line_no: int) -> object:
    try:
        return json.loads(text.rstrip("\r\n"), object_pairs_hook=unique_keys)
    except json.JSONDecodeError as error:
        fail(where, line_no, str(error.colno), f"invalid JSON ({error.msg})")
    except DuplicateKey as error:
        fail(where, line_no, error.key, "given twice in one object")


def _cells(line: str) -> list[str]:
    """A column row's names, as the csv module splits it, surrounding spaces removed."""
    return [name.strip() for name in next(csv.reader([line.strip()]))]


def _match(
    found: Sequence[str], formats: Sequence[KnownFormat], where: str, line_no: int, noun: str = "column"
) -> KnownFormat:
    """The format whose required columns are all in `found`; else an error about the closest one."""
    for fmt in formats:
        if set(fmt.required) <= set(found):
            return fmt
    scores = [sum(_score(column, found) for column in fmt.listed) for fmt in formats]
    best = max(range(len(formats)), key=scores.__getitem__)
    if scores[best] == 0:
        _unknown(where, line_no, found)
    fmt = formats[best]
    missing = next(column for column in fmt.required if column not in found)
    near = _near(missing, found)
    hint = f", found {near!r}" if near else ""
    raise KvbenchError(
        f"{where}: line {line_no}: no {noun} {missing!r}{hint} ({fmt.label} {noun}s: {', '.join(fmt.listed)})"
    )


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _near(column: str, found: Sequence[str]) -> str | None:
    """The found name that is `column` up to case and punctuation, or a near-miss of it."""
    by_norm = {_norm(name): name for name in found}
    close = difflib.get_close_matches(_norm(column), list(by_norm), n=1, cutoff=0.75)
    return by_norm[close[0]] if close else None


def _score(column: str, found: Sequence[str]) -> int:
    """2 for an exact match, 1 for a near one: how strongly `found` suggests this column."""
    if column in found:
        return 2
    return 1 if _near(column, found) else 0


def _unknown(where: str, line_no: int, found: Sequence[str]) -> NoReturn:
    known = "; ".join(f"{fmt.label}: {', '.join(fmt.required)}" for fmt in CSV_FORMATS + JSON_FORMATS)
    raise KvbenchError(
        f"{where}: line {line_no}: unknown trace format, found columns {', '.join(found) or '(none)'}"
        f" (known formats: {known}; {FORMAT} Parquet)"
    )
