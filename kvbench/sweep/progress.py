"""The progress of a sweep or a reproduction on stderr: cells done of planned, failures, elapsed, ETA.

On a terminal it is a rich progress bar redrawn in place. Into a file or a pipe (CI logs) it
prints one plain line per finished cell instead, so the log stays readable. The ETA is the mean
wall time of the cells run by this invocation times the cells left; resumed cells count as
done but not towards that mean.

The total never shrinks: planned cells a bisection turns out not to need count as done
("skipped"), so a run never reads 24/28 and then 24/24; cells planned later add to it.

Rich draws one live display at a time, so progress objects alive at once (a reproduction's
figures and the sweep of the figure being run) share one (`_Display`), a line each; a line
that ends while another goes on is printed above the display, plain, and removed from it.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class _Display:
    """The rich progress display the live progress objects share (`_DISPLAY`)."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bars
        from rich.table import Column

        file, stderr = console.file, _unwrapped(sys.stderr)
        self.bars = Bars(
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=30),
            TextColumn("{task.fields[counts]}", markup=False),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}", markup=False),
            # the cell being run takes what is left of the line and is cut short, never the counts
            TextColumn("{task.fields[current]}", markup=False, table_column=Column(ratio=1, no_wrap=True)),
            console=console,
            expand=True,
            refresh_per_second=4,
            # prints from elsewhere appear above the bars, but stdout only where it is the same
            # terminal: `kvbench reproduce > log` keeps its stdout out of the terminal
            redirect_stdout=file is _unwrapped(sys.stdout) or (file is stderr and sys.stdout.isatty()),
            redirect_stderr=file is stderr,
        )
        self.users = 0
        self.bars.start()


_DISPLAY: _Display | None = None


def _unwrapped(stream: TextIO) -> TextIO:
    """The real stream under rich's stdout/stderr redirection while a display is live."""
    return getattr(stream, "rich_proxied_file", stream)


class Progress:
    """Mutable, one per sweep (or reproduction) invocation.

    `stream`: where it prints (default stderr), as a rich bar where that is a terminal.
    `console`: a rich Console to draw on instead; its `is_terminal` decides (tests give one
    with `force_terminal=True` over a StringIO). `unit` names what is counted, `label` the line.
    """

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        width: int = 24,
        *,
        unit: str = "cells",
        label: str = "sweep",
        console=None,
    ) -> None:
        self.total = total
        self.width = width
        self.unit, self.label = unit, label
        if console is not None:
            self.stream, self.tty = console.file, console.is_terminal
        else:
            self.stream = _unwrapped(stream if stream is not None else sys.stderr)
            self.tty = self.stream.isatty()
        self._console = console
        self.done = self.failed = self.resumed = self.ran = self.skipped = 0
        self.ran_seconds = 0.0
        self.start = time.perf_counter()
        self.current = ""
        self._display: _Display | None = None  # the shared rich display, once shown (tty)
        self._task = None  # this progress's line in it
        self._printed = (0, total)  # done and total in the last line printed (not a tty)

    def plan(self, extra: int) -> None:
        """More cells than first planned, or (`extra` < 0) fewer: bisection decides as it goes.

        Fewer: that many planned cells count as done, skipped; the total stays, so the bar
        only ever moves forward.
        """
        if extra >= 0:
            self.total += extra
        else:
            skipped = max(0, min(-extra, self.total - self.done))
            self.done += skipped
            self.skipped += skipped
        if self.tty:
            self._draw()

    def begin(self, cell_id: str) -> None:
        self.current = cell_id
        if self.tty:
            self._draw()

    def finish(self, ok: bool, wall_s: float | None) -> None:
        """A cell ended: run now (`wall_s`) or found finished by --resume (None)."""
        self.done += 1
        self.failed += not ok
        if wall_s is None:
            self.resumed += 1
        else:
            self.ran += 1
            self.ran_seconds += wall_s
        if self.tty:
            self._draw()
        elif wall_s is not None or not ok:
            self._print()

    def close(self) -> None:
        global _DISPLAY
        if self.tty and self._display is not None:
            display, self._display = self._display, None
            display.users -= 1
            self.current = ""
            if display.users:  # another line goes on: this one is printed above it, for good
                display.bars.remove_task(self._task)
                elapsed = _clock(time.perf_counter() - self.start)
                display.bars.console.print(f"{self.label}: {self.counts()} in {elapsed}", markup=False)
            else:
                self._update(display)
                display.bars.stop()
                _DISPLAY = None
        elif not self.tty and self.done and (self.done, self.total) != self._printed:
            self._print()  # cells were skipped or resumed after the last line

    def counts(self) -> str:
        """`5/8 cells, 1 failed, 2 skipped`: what the plain line and the bar both show."""
        notes = "".join(
            f", {n:,} {what}"
            for n, what in ((self.failed, "failed"), (self.resumed, "resumed"), (self.skipped, "skipped"))
            if n
        )
        return f"{self.done:,}/{self.total:,} {self.unit}{notes}"

    def eta(self) -> str:
        return _clock(self.ran_seconds / self.ran * (self.total - self.done)) if self.ran else "?"

    def line(self) -> str:
        filled = self.width * self.done // self.total if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = _clock(time.perf_counter() - self.start)
        return f"[{bar}] {self.counts()}  {elapsed} elapsed, ETA {self.eta()}  {self.current}"

    def _print(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self._printed = (self.done, self.total)

    def _draw(self) -> None:
        """Show the counts on the shared display, joining it (or starting it) the first time."""
        global _DISPLAY
        if self._display is None:
            if _DISPLAY is None:
                from rich.console import Console

                _DISPLAY = _Display(self._console or Console(file=self.stream))
            self._display = _DISPLAY
            self._display.users += 1
            self._task = self._display.bars.add_task(self.label, total=self.total, **self._fields())
        self._update(self._display)

    def _fields(self) -> dict[str, str]:
        return {"counts": self.counts(), "eta": self.eta(), "current": self.current}

    def _update(self, display: _Display) -> None:
        display.bars.update(self._task, completed=self.done, total=self.total, refresh=True, **self._fields())
