"""`kvbench report`: saved results found (`tables.discover`), drawn and written.

Everything shown is read from the result files (principle 4): the report can be rebuilt at any
time, on any machine, from a copy of the folders. The report is one self-contained HTML page
(figures inlined as PNG, the tables, the environment and the exact commands from env.json) and
a Markdown summary; both are written under `--out` with the figures as PNG and SVG in `plots/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from kvbench.report.tables import discover
from kvbench.results.files import write_json, write_run_atomically, write_text
from kvbench.results.outputs import MARKER, prepare_out
from kvbench.results.ownership import files_under


def default_out(paths: Sequence[Path]) -> Path:
    """`report/` under the first path given (a run folder, a demo folder or a sweep)."""
    return Path(paths[0]) / "report"


def write_report(paths: Sequence[Path], out: Path | None = None) -> tuple[Path, Path]:
    """Build the figures, the HTML page and report.md under `out`; returns (html, markdown).

    The report folder appears whole (drawn into a temporary folder, then renamed): a previous
    report there is replaced, anything else at `out` refused before drawing (`kvbench.results.outputs`).
    """
    from kvbench.report.figures import figures_of_runs, figures_of_sweep
    from kvbench.report.html import render_html, render_markdown

    results = discover(paths)  # every file read before drawing anything: a broken one stops us early
    out = prepare_out(out if out is not None else default_out(paths), "report")
    created = datetime.now(UTC).isoformat(timespec="seconds")

    def write(folder: Path) -> None:  # links inside the page are relative: the same after the rename
        plots = folder / "plots"
        plots.mkdir()
        figures = figures_of_runs(results.runs, plots) if results.runs else []
        sweep_figures = [
            figures_of_sweep(sweep, plots, prefix=f"sweep{i}_" if len(results.sweeps) > 1 else "sweep_")
            for i, sweep in enumerate(results.sweeps, 1)
        ]
        write_text(folder / "report.html", render_html(results, figures, sweep_figures, folder, created))
        write_text(folder / "report.md", render_markdown(results, figures, sweep_figures, folder, created))
        # the files listed are the report's own: a figure a later report no longer draws goes with
        # this one, whatever else a user adds here stays (kvbench.results.ownership)
        write_json(folder / MARKER, {"kind": "report", "files": files_under(folder)})

    write_run_atomically(out, write)
    return out / "report.html", out / "report.md"
