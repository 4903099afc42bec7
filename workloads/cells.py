"""Cell conversions for the trace readers: a whole column at once, the culprit found on failure.

Each converter hands numpy the entire column (a chunk of up to `textcols.CHUNK` cells), which is
what makes a million-row file fast; only when numpy refuses does it walk the cells one by one to
report the first bad one with its file, line and column. Range and whole-number checks are left
to `to_trace`: here only text that is not a number (or a date, or a list) at all is caught.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from workloads.textcols import fail


def numbers(
    cells: Sequence[str], lines: np.ndarray, where: str, column: str, blank_ok: bool = False
) -> np.ndarray:
    """Text cells (n,) as an (n,) int64 array when all are integers, else float64.

    With `blank_ok`, blank cells become NaN (``Columns``' mark for "take the default"), so a
    cell that says ``nan`` is refused here: it would otherwise pass for a blank. Range and
    whole-number checks are left to ``to_trace``; only unparseable text is caught here.
    """
    try:
        return np.array(cells, dtype=np.int64)
    except (ValueError, OverflowError):
        pass
    text = cells
    if blank_ok:
        cells = [cell if cell.strip() else "nan" for cell in cells]
    try:
        values = np.array(cells, dtype=np.float64)  # (n,)
    except ValueError:
        values = None
    if values is not None:
        if blank_ok and np.isnan(values).any():
            for cell, line in zip(text, lines.tolist(), strict=True):
                if cell.strip() and np.isnan(float(cell)):
                    fail(where, line, column, f"must be a number or blank, got {cell!r}")
        return values
    for cell, line in zip(cells, lines.tolist(), strict=True):
        try:
            np.array([cell], dtype=np.float64)
        except ValueError:
            fail(where, line, column, f"not a number, got {cell!r}" if cell.strip() else "empty cell")
    raise AssertionError("numpy rejected a column whose cells it accepts one by one")


def json_numbers(
    values: list, lines: np.ndarray, where: str, column: str, required: bool = True
) -> np.ndarray:
    """JSON values (n,) as int64 (all ints) or float64; a missing optional value becomes NaN."""
    kinds = set(map(type, values))
    if kinds <= {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass
    allowed = {int, float} if required else {int, float, type(None)}
    if kinds <= allowed:
        array = np.array(values, dtype=np.float64)  # (n,)
        if not required and np.isnan(array).any():  # NaN marks a missing value: a written NaN is not one
            for value, line in zip(values, lines.tolist(), strict=True):
                if value is not None and value != value:
                    fail(where, line, column, f"must be a number or absent, got {value!r}")
        return array
    for value, line in zip(values, lines.tolist(), strict=True):
        if type(value) not in allowed:
            fail(where, line, column, "missing" if value is None else f"must be a number, got {value!r}")
    raise AssertionError("unreachable")


def datetimes_ns(cells: Sequence[str], lines: np.ndarray, where: str, column: str) -> np.ndarray:
    """Wall-clock text cells (n,) such as ``2023-11-16 18:15:46.6805900`` as (n,) int64 nanoseconds.

    numpy parses ISO dates with a space or 'T' and up to nine fractional digits; a timezone
    suffix is converted to UTC (its warning silenced: only differences matter here). numpy also
    takes a bare year, a month or ``now``, so every cell must first have a date and a time
    (`_date_time_shaped`): an epoch number such as 1700000000 would otherwise read as a year.
    """
    shaped = _date_time_shaped(cells)  # (n,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            stamps = np.array(cells, dtype="datetime64[ns]")  # (n,)
        except ValueError:
            stamps = None
        if stamps is None or np.isnat(stamps).any() or not shaped.all():
            for cell, line, ok in zip(cells, lines.tolist(), shaped.tolist(), strict=True):
                if not (ok and _parses(cell)):
                    fail(where, line, column, f"not a date and time, got {cell!r} (expected {DATE_TIME})")
    if stamps is None:
        raise AssertionError("numpy rejected a column whose cells it accepts one by one")
    return stamps.astype(np.int64)


YEARS = (1678, 2261)
"""The years int64 nanoseconds hold (1677-09-21 to 2262-04-11, whole years kept clear of the
ends); numpy wraps a date outside them into a wrong one instead of refusing it."""
DATE_TIME = f"YYYY-MM-DD HH:MM:SS.fraction, years {YEARS[0]} to {YEARS[1]}"
"""The shape of a wall-clock cell (the Azure trace's); seconds and fraction may be left out."""


def _date_time_shaped(cells: Sequence[str]) -> np.ndarray:
    """(n,) bool: which cells start with ``YYYY-MM-DD HH:MM`` ('T' may stand for the space), in `YEARS`.

    Checked on the code points of the whole column at once, which keeps a million cells fast.
    """
    if not len(cells):
        return np.zeros(0, dtype=bool)
    text = np.char.strip(np.asarray(cells, dtype=str))  # (n,)
    if text.dtype.itemsize // 4 < 16:  # every cell shorter than YYYY-MM-DD HH:MM
        return np.zeros(len(text), dtype=bool)
    codes = text.view(np.uint32).reshape(len(text), -1)[:, :16]  # (n, 16) code points, 0 past the end
    digit = (codes >= ord("0")) & (codes <= ord("9"))
    shaped = digit[:, [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15]].all(axis=1)
    shaped &= (codes[:, 4] == ord("-")) & (codes[:, 7] == ord("-")) & (codes[:, 13] == ord(":"))
    shaped &= (codes[:, 10] == ord(" ")) | (codes[:, 10] == ord("T"))
    year = (codes[:, :4].astype(np.int64) - ord("0")) @ np.array([1000, 100, 10, 1])  # (n,)
    return shaped & (year >= YEARS[0]) & (year <= YEARS[1])


def _parses(cell: str) -> bool:
    """Whether numpy reads `cell` as a date and time (the slow, one-cell path, for the culprit)."""
    try:
        return not np.isnat(np.datetime64(cell, "ns"))
    except ValueError:
        return False


def int_lists(
    cells: Sequence[str], lines: np.ndarray, where: str, column: str
) -> list[tuple[int, ...] | None]:
    """List cells: space-separated integers; blank: None (the default); ``[]``: an empty list."""
    out: list[tuple[int, ...] | None] = []
    for cell, line in zip(cells, lines.tolist(), strict=True):
        text = cell.strip()
        if not text:
            out.append(None)
        elif text == "[]":
            out.append(())
        else:
            try:
                out.append(tuple(map(int, text.split())))
            except ValueError:
                fail(where, line, column, f"expected space-separated integers, got {cell!r}")
    return out
