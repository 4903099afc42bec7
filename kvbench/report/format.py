"""How kvbench prints numbers and tables on the terminal: one function per kind of quantity.

Every printed table (`simulate`, `run`, `demo`, `compare`) formats its cells here, so one table
never shows `27,290.474` beside `2.738e+04`:

- `count`: things counted (requests, preemptions, tokens): an integer with thousands separators.
- `significant`: rates and times: `SIGNIFICANT` significant digits in fixed-point notation,
  never scientific, so a column of them reads at a glance (`27,290`, `4.858`, `0.01235`).
- `percent`: a share of a whole, as a percentage with one decimal (`12.3`; the header says %).
- `number`: a summary value of unknown kind: counts for integers, significant digits otherwise.

A missing value (None, NaN) prints as `MISSING` in every kind. Tables are drawn by rich on a
terminal (`show`) and as plain aligned text everywhere else (`aligned`), with the same cells,
so logs, pipes and tests read simply.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TextIO

MISSING = "-"
SIGNIFICANT = 4


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def count(value) -> str:
    """A count: `27,290` (a float is rounded to the nearest integer)."""
    if _missing(value):
        return MISSING
    return f"{round(value):,}"


def significant(value, digits: int = SIGNIFICANT) -> str:
    """A rate or a time: `digits` significant digits, fixed-point (`0.0001235`, `27,290`, `2.000`)."""
    if _missing(value):
        return MISSING
    value = float(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    exponent = math.floor(math.log10(abs(value)))
    rounded = round(value, digits - 1 - exponent)
    if rounded and math.floor(math.log10(abs(rounded))) > exponent:  # 9.9996 rounds up to 10.00
        exponent += 1
    return f"{rounded:,.{max(0, digits - 1 - exponent)}f}"


def percent(share) -> str:
    """A share of a whole (0.123) as a percentage with one decimal (`12.3`), never `-0.0`."""
    if _missing(share):
        return MISSING
    value = 100 * float(share)
    return f"{0.0 if abs(value) < 0.05 else value:.1f}"


def number(value) -> str:
    """A value of unknown kind (a summary key): integers as counts, other numbers as `significant`."""
    if _missing(value):
        return MISSING
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
        return count(value)
    return significant(value)


def numeric(text: str) -> bool:
    """Whether a cell holds a number (or `MISSING`): such cells align right."""
    try:
        float(text.replace(",", ""))
    except ValueError:
        return text == MISSING
    return True


class Table(str):
    """A table's plain aligned text, which also keeps its cells (`header`, `rows`).

    It is the string it reads as wherever a string goes (files, tests, pipes); `show` draws the
    same cells as a rich table when it prints to a terminal.
    """

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def __new__(cls, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
        head = tuple(map(str, header))
        body = tuple(tuple(map(str, row)) for row in rows)
        self = super().__new__(cls, _aligned_text(head, body))
        self.header, self.rows = head, body
        return self


def aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """Aligned columns: text left, numbers right, a rule under the header."""
    return Table(header, rows)


def _aligned_text(header: tuple[str, ...], rows: tuple[tuple[str, ...], ...]) -> str:
    table = [header, *rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    out = []
    for n, line in enumerate(table):
        cells = [c.rjust(w) if n and numeric(c) else c.ljust(w) for c, w in zip(line, widths, strict=True)]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def rich_table(table: Table, title: str | None = None):
    """The same cells as a rich Table: numbers right-aligned, nothing reformatted."""
    from rich.table import Table as RichTable
    from rich.text import Text

    drawn = RichTable(title=title, header_style="bold")
    for name in table.header:
        drawn.add_column(name, no_wrap=True)
    for row in table.rows:
        drawn.add_row(*(Text(c, justify="right" if numeric(c) else "left") for c in row))
    return drawn


def terminal(stream: TextIO | None = None):
    """A rich Console on `stream` (default stdout) when it is a terminal, else None.

    The decision is the stream's own `isatty()`, not rich's guess from the environment, so a
    pipe or a log file always gets plain text, whatever FORCE_COLOR says.
    """
    stream = sys.stdout if stream is None else stream
    stream = getattr(stream, "rich_proxied_file", stream)  # under a live progress bar
    if not getattr(stream, "isatty", lambda: False)():  # a test runner's capture may have none
        return None
    from rich.console import Console

    return Console(file=stream)


def show(text: str, console=None, stream: TextIO | None = None) -> None:
    """Print `text`: a `Table` as a rich table on a terminal, anything else (or off a terminal)
    as the plain text it is. `console` (a rich Console) overrides the terminal test (tests)."""
    console = console if console is not None else terminal(stream)
    if console is not None and console.is_terminal and isinstance(text, Table):
        drawn = rich_table(text)
        # wider than the terminal: drawn whole (the terminal wraps its lines), never a cell cut short
        natural = console.measure(drawn, options=console.options.update(max_width=1_000_000)).maximum
        width = console.width
        console.width = max(width, natural)
        try:
            console.print(drawn)
        finally:
            console.width = width
    elif console is not None:
        console.file.write(str(text) + "\n")
        console.file.flush()
    else:
        out = sys.stdout if stream is None else stream
        out.write(str(text) + "\n")
        out.flush()
