"""The sweep's progress line on stderr: a bar, cells done of planned, failures, elapsed and ETA.

On a terminal it is one line rewritten in place (carriage return, no escape codes); into a
file or a pipe (CI logs) it prints one line per finished cell instead, so the log stays
readable. The ETA is the mean wall time of the cells run by this invocation times the cells
left; resumed cells count as done but not towards that mean.

The total never shrinks: planned cells a bisection turns out not to need count as done
("skipped"), so a run never reads 24/28 and then 24/24.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Mutable, one per sweep invocation."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 24) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self.done = self.failed = self.resumed = self.ran = self.skipped = 0
        self.ran_seconds = 0.0
        self.start = time.perf_counter()
        self.current = ""
        self._shown = 0  # characters of the line on screen (tty)
        self._printed = (0, total)  # done and total in the last line printed (not a tty)

    def plan(self, extra: int) -> None:
        """More cells than first planned, or (`extra` < 0) fewer: bisection decides as it goes.

        Fewer: that many planned cells count as done, skipped; the total stays, so the bar
        only ever moves forward.
        """
        if extra >= 0:
            self.total += extra
            return
        skipped = max(0, min(-extra, self.total - self.done))
        self.done += skipped
        self.skipped += skipped
        if self.tty and skipped:
            self._show(self.line())

    def begin(self, cell_id: str) -> None:
        self.current = cell_id
        if self.tty:
            self._show(self.line())

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
            self._show(self.line())
        elif wall_s is not None or not ok:
            self._print()

    def close(self) -> None:
        if self.tty and self._shown:
            print(file=self.stream, flush=True)
            self._shown = 0
        elif not self.tty and self.done and (self.done, self.total) != self._printed:
            self._print()  # cells were skipped or resumed after the last line

    def line(self) -> str:
        filled = self.width * self.done // self.total if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        eta = "?"
        if self.ran:
            eta = _clock(self.ran_seconds / self.ran * (self.total - self.done))
        notes = "".join(
            f", {n} {what}"
            for n, what in ((self.failed, "failed"), (self.resumed, "resumed"), (self.skipped, "skipped"))
            if n
        )
        counts = f"{self.done}/{self.total} cells{notes}"
        return f"[{bar}] {counts}  {_clock(elapsed)} elapsed, ETA {eta}  {self.current}"

    def _print(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self._printed = (self.done, self.total)

    def _show(self, text: str) -> None:
        text = text[: shutil.get_terminal_size().columns - 1]  # a wrapped line could not be rewritten
        pad = max(self._shown - len(text), 0)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._shown = len(text)
