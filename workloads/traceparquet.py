"""kvbench's trace format as Parquet: the CSV's columns, typed, the header in the schema metadata.

pyarrow is optional: it is imported only when a Parquet file is read or written, and its absence
is a one-line error saying how to install it. Parquet has no lines, so errors name the row
(1-based, in file order).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.requests import Trace
from workloads.columns import OPTIONAL_INT, OPTIONAL_LISTS, OPTIONAL_TEXT, Columns
from workloads.textcols import to_checked_trace
from workloads.tracetext import (
    FORMAT,
    OPTIONAL,
    REQUIRED,
    Header,
    check_finite,
    header_json,
    parse_header,
    used_optional,
)

if TYPE_CHECKING:
    import pyarrow

METADATA_KEY = FORMAT.encode()  # b"kvbench-trace"


def import_pyarrow(where: str) -> pyarrow:
    """pyarrow, or the one-line error a user can act on."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise KvbenchError(f"{where}: Parquet needs pyarrow: pip install pyarrow") from None
    return pyarrow


def write_parquet(trace: Trace, out: BinaryIO, where: str) -> None:
    """The required columns and the optional ones some request uses, header in the metadata."""
    pa = import_pyarrow(where)
    reqs = trace.requests
    check_finite(reqs)
    header = header_json(trace)  # also checks that meta is JSON-able
    columns = {
        "request_id": pa.array([r.request_id for r in reqs], pa.int64()),
        "arrival_s": pa.array([r.arrival_s for r in reqs], pa.float64()),
        "prompt_len": pa.array([r.prompt_len for r in reqs], pa.int64()),
        "output_len": pa.array([r.output_len for r in reqs], pa.int64()),
    }
    kinds = {name: pa.int64() for name in OPTIONAL_INT}
    kinds.update({name: pa.string() for name in OPTIONAL_TEXT})
    kinds.update({name: pa.list_(pa.int64()) for name in OPTIONAL_LISTS})
    for name in used_optional(reqs):
        columns[name] = pa.array([getattr(r, name) for r in reqs], kinds[name])
    table = pa.table(columns).replace_schema_metadata({METADATA_KEY: header.encode()})
    pa.parquet.write_table(table, out)


def read_parquet(f: BinaryIO, where: str, stem: str) -> Trace:
    """A kvbench Parquet trace; without the metadata, the four required columns name it `stem`."""
    pa = import_pyarrow(where)
    try:
        table = pa.parquet.read_table(f)
    except (pa.ArrowException, OSError) as error:
        reason = " ".join(str(error).split())  # pyarrow's messages may end in, or hold, line breaks
        raise KvbenchError(f"{where}: not a readable Parquet file ({reason})") from None
    metadata = table.schema.metadata or {}
    if METADATA_KEY in metadata:
        try:
            obj = json.loads(metadata[METADATA_KEY])
        except ValueError:
            obj = None
        header = parse_header(obj, where, None)
        source = header.source
    else:
        header, source = Header(name=stem), where
    names = table.column_names
    known = REQUIRED + OPTIONAL
    for name in names:
        if name not in known:
            raise KvbenchError(f"{where}: column {name}: unknown column (known: {', '.join(known)})")
    for name in REQUIRED:
        if name not in names:
            raise KvbenchError(f"{where}: no column {name!r} ({FORMAT} columns: {', '.join(known)})")
    if table.num_rows == 0:
        raise KvbenchError(f"{where}: the trace has no requests")
    fields = {name: _column(pa, table, name, where) for name in names}
    cols = Columns(**fields, lines=np.arange(1, table.num_rows + 1), extra=dict(header.meta))
    trace = to_checked_trace(cols, header.name, where, hash_block_size=header.hash_block_size, unit="row")
    return replace(trace, source=source)


def _column(pa: pyarrow, table: pyarrow.Table, name: str, where: str) -> np.ndarray | list:
    """One column as `Columns` wants it: numbers as an (N,) array (NaN where null), else a list."""
    column = table.column(name)
    kind = column.type
    if name in OPTIONAL_TEXT:
        ok = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    elif name in OPTIONAL_LISTS:
        ok = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)
    else:
        ok = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    if not ok:
        raise KvbenchError(f"{where}: column {name}: unexpected type {kind}")
    if name in OPTIONAL_TEXT:
        return column.to_pylist()
    if name in OPTIONAL_LISTS:
        return _int_lists(column, name, where)
    if column.null_count and name in REQUIRED:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0]) + 1
        raise KvbenchError(f"{where}: row {row}, column {name}: missing value")
    values = column.to_numpy()  # (N,): int64/float64; NaN where null
    if pa.types.is_floating(kind):  # a stored NaN (not a null) would pass for "the default"
        stored_nan = np.isnan(values) & ~column.is_null().to_numpy(zero_copy_only=False)
        if stored_nan.any():
            row = int(np.flatnonzero(stored_nan)[0]) + 1
            raise KvbenchError(f"{where}: row {row}, column {name}: must be a number, got nan")
    return values.astype(np.float64) if column.null_count else values


def _int_lists(column: pyarrow.ChunkedArray, name: str, where: str) -> list:
    """A list column as tuples (None where the row is null), refusing a null inside a list: JSONL
    and CSV cannot write one, and as a token id or a block hash it has no meaning."""
    rows = column.to_pylist()
    if any(chunk.flatten().null_count for chunk in column.chunks):  # a null element, in C
        row = next(i for i, value in enumerate(rows) if value is not None and None in value)
        raise KvbenchError(
            f"{where}: row {row + 1}, column {name}: must be a list of integers, got {rows[row]!r}"
        )
    return [None if value is None else tuple(value) for value in rows]
