"""The progress of sweeps and reproductions: a rich bar on a terminal, plain lines elsewhere.

The terminal path is drawn by rich on a Console forced to be a terminal over a StringIO, so what
a user's terminal receives is read back exactly; each event redraws the bar (a frame), and rich's
own refresh thread may add copies of a frame, never a frame out of order.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from kvbench.config import RunConfig
from kvbench.sweep import progress as progress_module
from kvbench.sweep.grid import Axes
from kvbench.sweep.plan import SustainedOptions, SweepPlan
from kvbench.sweep.progress import Progress
from kvbench.sweep.run import run_sweep
from workloads.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=160)


def frames(console: Console, label: str = "sweep") -> list[str]:
    """The bar's successive states as the terminal shows them (escape codes removed)."""
    text = ESCAPE.sub("", console.file.getvalue())
    return [f.strip() for f in re.split(r"[\r\n]", text) if f.startswith(label + " ")]


def counts(frame: str, unit: str = "cells") -> tuple[int, int]:
    done, total = re.search(rf" (\d+)/(\d+) {unit}", frame).groups()
    return int(done), int(total)


def forward_only(states: list[tuple[int, int]]) -> bool:
    return all(a[0] <= b[0] and a[1] <= b[1] for a, b in itertools.pairwise(states))


def sweep_plan(engines, rates, kv, **kw) -> SweepPlan:
    axes = Axes(tuple(engines), ("sharegpt-paper",), tuple(rates), (16,), (kv,), (0,), 1)
    base = RunConfig("paged", workload=WorkloadSpec(num_requests=20, max_total_len=1000))
    return SweepPlan(axes, base, **kw)


def test_the_bar_moves_forward_and_its_total_never_shrinks():
    console = terminal()
    progress = Progress(6, console=console)
    for n in range(2):
        progress.begin(f"cell-{n}")
        progress.finish(True, 0.5)
    progress.plan(-3)  # a bisection needs 3 planned cells less: done, skipped
    progress.plan(+2)  # a later round asks for 2 more after all: the total grows
    progress.begin("cell-2")
    progress.finish(True, 0.5)
    progress.plan(-9)  # never past the total
    progress.close()
    states = [counts(f) for f in frames(console)]
    assert states[0] == (0, 6) and states[-1] == (8, 8), states
    assert forward_only(states), states
    assert {(2, 6), (5, 6), (5, 8), (6, 8)} <= set(states), states
    assert frames(console)[-1].split(" 8/8 cells")[1].startswith(", 5 skipped")
    assert "[####" not in console.file.getvalue()  # the rich bar, not the plain lines
    assert progress_module._DISPLAY is None  # the display is given back


def test_a_sweep_whose_bisection_ends_early_keeps_its_total_on_the_bar(tmp_path):
    """Every rate passes, so the 2 planned bisection cells are skipped: 4/4, never 2/2."""
    plan = sweep_plan(("paged",), (1.0, 2.0), 4.0, sustained=SustainedOptions(threshold_s=1e6, bisect=2))
    console = terminal()
    run_sweep(plan, tmp_path / "s", progress=Progress(4, console=console))
    states = [counts(f) for f in frames(console)]
    assert {total for _, total in states} == {4} and forward_only(states), states
    assert states[-1] == (4, 4) and "4/4 cells, 2 skipped" in frames(console)[-1]


def test_a_bisection_to_a_target_bracket_never_runs_past_the_total(tmp_path):
    """A target bracket takes as many rounds as it needs, none counted up front (bisect 0), and
    steps past a placed pair likewise: each round grows the total before its cells run, so the
    bar reads done <= total throughout (it once read 7/6, ETA negative)."""
    sustained = SustainedOptions(threshold_s=0.1, bracket=0.1, extend=4)
    plan = sweep_plan(("orca-max",), (0.5, 16.0), 12.0, sustained=sustained)
    plan = replace(plan, base=replace(plan.base, workload=replace(plan.base.workload, num_requests=150)))
    console = terminal()
    result = run_sweep(plan, tmp_path / "s", progress=Progress(2, console=console))
    states = [counts(f) for f in frames(console)]
    ran = len(result.rows)
    assert ran >= 7 and all(done <= total for done, total in states) and forward_only(states), states
    assert states[-1] == (ran, ran), states


def test_failed_cells_are_counted_on_the_bar(tmp_path):
    # orca-max reserves 2048 slots per request: more than 1 GiB of OPT-13B KV holds (1310 slots)
    plan = sweep_plan(
        ("orca-max", "paged"),
        (1.0, 2.0),
        1.0,
        sustained=SustainedOptions(threshold_s=1.0),
        continue_on_error=True,
    )
    console = terminal()
    result = run_sweep(plan, tmp_path / "s", progress=Progress(4, console=console))
    assert result.failed == 2
    shown = frames(console)
    assert "1/4 cells, 1 failed" in " ".join(shown) and "4/4 cells, 2 failed" in shown[-1], shown
    assert "__rate-" in " ".join(shown)  # the cell being run is named


def test_progress_lines_alive_at_once_share_one_display():
    """A reproduction's figures and the sweep inside one: one line each on one display; the sweep's
    line, once finished, is printed above the display for good and leaves it."""
    console = terminal()
    figures = Progress(1, console=console, unit="figures", label="reproduce")
    figures.begin("fig12")
    cells = Progress(3, console=console)
    for n in range(3):
        cells.begin(f"cell-{n}")
        cells.finish(n != 1, 0.5)
    assert progress_module._DISPLAY is not None and progress_module._DISPLAY.users == 2
    cells.close()
    figures.finish(True, 2.0)
    figures.close()
    text = ESCAPE.sub("", console.file.getvalue())
    assert re.search(r"sweep: 3/3 cells, 1 failed in \d+:\d\d\n", text), text
    assert forward_only([counts(f, "figures") for f in frames(console, "reproduce")])
    assert "1/1 figures" in frames(console, "reproduce")[-1]
    assert progress_module._DISPLAY is None


def test_plain_lines_when_not_a_terminal(tmp_path):
    """Into a file or a pipe: one line per finished cell, no escape codes, no carriage returns."""
    plan = sweep_plan(
        ("orca-max", "paged"),
        (1.0,),
        1.0,
        sustained=SustainedOptions(threshold_s=1.0),
        continue_on_error=True,
    )
    for stream, console in ((io.StringIO(), None), (None, Console(file=io.StringIO()))):
        progress = Progress(2, stream=stream, console=console)
        assert not progress.tty
        run_sweep(plan, tmp_path / f"s{id(progress)}", progress=progress)
        text = (stream or console.file).getvalue()
        assert "\x1b" not in text and "\r" not in text
        lines = text.splitlines()
        assert len(lines) == 2 and lines[0].startswith("[############............] 1/2 cells, 1 failed"), (
            lines
        )
        assert lines[1].startswith("[" + "#" * 24 + "] 2/2 cells, 1 failed") and "ETA 0:00" in lines[1]
        assert "orca-max__" in lines[0] and "paged__" in lines[1]
    assert progress_module._DISPLAY is None  # nothing drawn


def test_resumed_cells_print_no_line_of_their_own_but_the_last_line_counts_them():
    stream = io.StringIO()
    progress = Progress(3, stream=stream)
    progress.begin("a")
    progress.finish(True, None)  # found finished by --resume
    progress.begin("b")
    progress.finish(True, 1.0)
    progress.begin("c")
    progress.finish(True, None)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["2/3", "3/3"], lines
    assert "3/3 cells, 2 resumed" in lines[-1]


SWEEP = ("sweep", "--engines", "paged", "--model", "tiny-opt", "--kv-cache-gib", "0.002",
         "--trace", "uniform:prompt=4..30,output=2..12", "--num-requests", "20", "--rates", "5,50",
         "--bisect", "2", "--latency-threshold", "1000")  # fmt: skip


def test_kvbench_sweep_draws_the_bar_on_a_terminal_and_lines_into_a_pipe(tmp_path):
    """The command as a user runs it: stderr a pseudo-terminal, then a pipe. Every rate passes the
    threshold, so the 2 planned bisection cells are skipped: 4/4 cells either way."""
    master, slave = os.openpty()
    env = {**os.environ, "COLUMNS": "160"}
    command = [sys.executable, "-m", "kvbench", *SWEEP]
    with subprocess.Popen(
        [*command, "--out", str(tmp_path / "tty")], cwd=ROOT, env=env,
        stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
    ) as child:  # fmt: skip
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert child.wait(timeout=300) == 0
    os.close(master)
    screen = Console(file=io.StringIO())
    screen.file.write(b"".join(chunks).decode())
    states = [counts(f) for f in frames(screen)]
    assert states and forward_only(states) and states[-1] == (4, 4), states
    assert "4/4 cells, 2 skipped" in frames(screen)[-1]
    assert "sweep: 2 cells (2 run, 0 resumed, 0 failed)" in screen.file.getvalue()

    piped = subprocess.run(
        [*command, "--out", str(tmp_path / "pipe")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert piped.returncode == 0, piped.stderr
    assert "\x1b" not in piped.stderr and "\r" not in piped.stderr
    assert [line.split()[1] for line in piped.stderr.splitlines()] == ["1/4", "2/4", "4/4"], piped.stderr
