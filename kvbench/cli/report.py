"""`kvbench report` and `kvbench compare`: pure functions of saved results (kvbench/report/build.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvbench.cli import options as opt

Dirs = Annotated[
    list[Path],
    typer.Argument(
        metavar="DIR",
        help="Run folders (summary.json), sweep folders (sweep.csv) or folders of them.",
        parser=opt.named_path,
    ),
]


@opt.user_errors
def report(
    dirs: Dirs,
    out: Annotated[
        Path | None, typer.Option(help="Folder for report.html, report.md and plots/ (default: DIR/report).")
    ] = None,
) -> None:
    """One self-contained HTML page and a Markdown summary of the results under DIRS."""
    from kvbench.report.build import write_report

    html, md = write_report(dirs, out)
    typer.echo(f"report: {html}\nsummary: {md}\nplots: {html.parent / 'plots'}")


@opt.user_errors
def compare(
    dirs: Dirs,
    markdown: Annotated[bool, typer.Option(help="A Markdown table instead of aligned text.")] = False,
    all_keys: Annotated[
        bool, typer.Option("--all", help="Every number in summary.json, not only the key ones.")
    ] = False,
) -> None:
    """Print the runs under DIRS side by side: one column per run, one row per metric."""
    from kvbench.report.format import show
    from kvbench.report.tables import compare as compare_table

    show(compare_table(dirs, markdown=markdown, everything=all_keys))  # a rich table on a terminal


def register(app: typer.Typer) -> None:
    app.command("report", short_help="Write an HTML report (figures, tables, environment) of saved results.")(
        report
    )
    app.command("compare", short_help="Print saved runs side by side.")(compare)
