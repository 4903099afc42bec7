"""Trace files: kvbench's own versioned format (written and read) and the public traces (read).

`write_trace(trace, path)` writes kvbench's format, choosing the encoding by suffix (`.jsonl`,
`.csv`, `.parquet`), atomically: a temporary file in the same folder is renamed over `path`
only once complete, so an error or a crash never leaves a half-written trace behind.
`read_trace(path)` reads any of those and the public traces of shared/traces/SOURCES.md (Azure,
vidur/etalon, Mooncake), recognising the format from the file's first line (`tracedetect`).

Format `kvbench-trace`, version 1
---------------------------------
Header (what the trace is, apart from its requests):

| key               | type           | meaning                                                    |
|-------------------|----------------|------------------------------------------------------------|
| `format`          | str            | always `"kvbench-trace"`                                   |
| `version`         | int            | `1`; any other version is refused, naming file and version |
| `name`            | str            | the trace's name, for reports                              |
| `source`          | str            | where it came from (preset, file, spec)                    |
| `hash_block_size` | int or null    | tokens per `block_hashes` entry (Mooncake: 512)            |
| `meta`            | object         | free-form provenance, e.g. `{"timestamps": false}`         |

Requests, one per row, in arrival order:

| field             | type        | required | default | meaning                                           |
|-------------------|-------------|----------|---------|---------------------------------------------------|
| `request_id`      | int >= 0    | yes      |         | unique id                                         |
| `arrival_s`       | float >= 0  | yes      |         | seconds from the trace start, never decreasing    |
| `prompt_len`      | int >= 1    | yes      |         | prompt tokens                                     |
| `output_len`      | int >= 1    | yes      |         | tokens to generate (the true output length)       |
| `prompt_ids`      | list of int | no       | none    | real prompt token ids; length == `prompt_len`     |
| `prefix_group`    | str         | no       | none    | requests of a group share a prompt prefix         |
| `prefix_len`      | int >= 0    | no       | 0       | that prefix's tokens (<= `prompt_len`; a group's) |
| `block_hashes`    | list of int | no       | none    | prompt block hashes (needs `hash_block_size`)     |
| `conversation_id` | str         | no       | none    | multi-turn chat: which conversation               |
| `turn`            | int >= 0    | no       | none    | and which turn of it (0-based)                    |
| `n`               | int >= 1    | no       | 1       | parallel samples of the prompt                    |
| `beam_width`      | int >= 1    | no       | 1       | beam search width (1: none)                       |

Encodings:
- JSONL: line 1 is the header object; then one object per request with the four required keys
  and only the optional keys whose value is not the default.
- CSV: line 1 is `# ` + the header as JSON; line 2 the column row: the four required columns,
  then only the optional columns some request uses; then one row per request. List cells are
  space-separated integers (`[]`: an empty list); a blank cell is the default. Text cells are
  quoted as the csv module does; an empty string cannot be written (it would read as none).
  Without the `#` line, a CSV whose columns include the four required ones is read as this
  format too (name: the file's stem); it has no header to give `hash_block_size`, so it cannot
  hold `block_hashes` (refused: hashes of blocks of unknown size would be read as no hits).
- Parquet (needs pyarrow): the CSV's columns, typed (int64, float64, string, list<int64>; null
  for none), and the header JSON in the schema metadata under the key `kvbench-trace`.

Every value is validated on reading (`workloads.columns.to_trace`): errors name the file, the
line (the row, for Parquet) and the column. `arrival_s` is at most 10**9 s (about 31 years),
where float64 seconds still resolve a simulator step (`workloads.columns.MAX_ARRIVAL_S`). Floats
are written as the shortest text that reads back to the same value, so every field round-trips
exactly; integers are read as integers (an id above 2**53 stays itself). Only a blank cell, a
JSON null or a Parquet null means "the default": a `nan` written there is refused, as NaN and
infinity are in every numeric column.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from kvbench.errors import KvbenchError
from kvbench.gc_pause import gc_paused
from kvbench.requests import Trace
from workloads.tracedetect import read_text
from workloads.traceparquet import import_pyarrow, read_parquet, write_parquet
from workloads.tracetext import write_csv, write_jsonl

SUFFIXES = (".jsonl", ".csv", ".parquet")
PARQUET_MAGIC = b"PAR1"


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write `trace` in kvbench's format, encoding chosen by the suffix; returns the path."""
    path = Path(path)
    suffix = path.suffix.lower()
    where = str(path)
    if suffix == ".jsonl":
        _write_atomically(path, lambda out: write_jsonl(trace, out), binary=False)
    elif suffix == ".csv":
        _write_atomically(path, lambda out: write_csv(trace, out), binary=False)
    elif suffix == ".parquet":
        import_pyarrow(where)  # fail before creating anything
        _write_atomically(path, lambda out: write_parquet(trace, out, where), binary=True)
    else:
        raise KvbenchError(f"{where}: unknown trace file suffix {suffix!r} (use {', '.join(SUFFIXES)})")
    return path


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file of any supported format (kvbench JSONL/CSV/Parquet, Azure, vidur, Mooncake)."""
    path = Path(path)
    where = str(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115  (closed below, by itself or by its text wrapper)
    except OSError as error:
        raise KvbenchError(f"{where}: cannot read ({error.strerror})") from None
    with gc_paused():
        if not raw.peek(1):
            raw.close()
            raise KvbenchError(f"{where}: the file is empty")
        if path.suffix.lower() == ".parquet" or raw.peek(4)[:4] == PARQUET_MAGIC:
            with raw:
                return read_parquet(raw, where, path.stem)
        with io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
            try:
                return read_text(text, path, where)
            except UnicodeDecodeError as error:
                raise KvbenchError(f"{where}: not UTF-8 text ({error.reason})") from None


def _write_atomically(path: Path, write: Callable[[IO], None], binary: bool) -> None:
    """Write through a temporary file beside `path`, then rename it over `path` (atomic on POSIX).

    The temporary file lives in the same folder so the rename never crosses file systems; on any
    error it is removed and `path` is left as it was. The new file keeps the mode of the file it
    replaces, or gets 0o644 (mkstemp's 0o600 would hide a shared trace from other users).
    """
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mode = 0o644
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise KvbenchError(f"{path}: cannot write ({error.strerror})") from None
    try:
        with open(fd, "wb") if binary else open(fd, "w", encoding="utf-8", newline="") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        raise KvbenchError(f"{path}: cannot write ({error.strerror or error})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
