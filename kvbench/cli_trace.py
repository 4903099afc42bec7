"""`kvbench trace`: make, inspect, plot and convert workload traces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvbench import cli_options as opt
from kvbench.errors import KvbenchError
from workloads.spec import WorkloadSpec, build_trace

app = typer.Typer(
    help="Make, inspect, plot and convert workload traces.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

Out = Annotated[Path, typer.Option(help="Output file: .jsonl, .csv or .parquet.")]


def _load(source: str):
    """A trace file as it is, or a spec built with its default options (all arriving at once)."""
    if Path(source).is_file():
        from workloads.tracefile import read_trace

        return read_trace(Path(source))
    return build_trace(WorkloadSpec(source=source, arrivals="all"))


@app.command(short_help="Build a trace from a preset, spec or file and write it.")
@opt.user_errors
@opt.with_workload(source_argument=True)
def make(workload: WorkloadSpec, out: Out) -> None:
    """Build a trace (lengths, sharing, arrivals) and write it in kvbench's trace format."""
    from workloads.tracefile import write_trace

    trace = build_trace(workload)
    write_trace(trace, out)
    typer.echo(f"wrote {len(trace)} requests to {out}")


@app.command(short_help="Counts, rates and length percentiles of a trace.")
@opt.user_errors
def stats(source: Annotated[str, typer.Argument(help="Trace file, preset or spec.")]) -> None:
    """Print count, duration, rate, interarrival CV, length percentiles and prefix reuse."""
    from workloads.stats import format_stats, trace_stats

    typer.echo(format_stats(trace_stats(_load(source))))


@app.command(short_help="Length histograms and arrivals over time, as PNG and SVG.")
@opt.user_errors
def plot(
    source: Annotated[str, typer.Argument(help="Trace file, preset or spec.")],
    out: Annotated[Path, typer.Option(help="PNG file (an SVG is written beside it).")],
) -> None:
    """Plot input/output length histograms (the paper's Figure 11) and the arrival rate."""
    from workloads.plot import plot_trace

    for path in plot_trace(_load(source), out):
        typer.echo(f"wrote {path}")


@app.command(short_help="Convert a trace file to another format.")
@opt.user_errors
def convert(
    source: Annotated[Path, typer.Argument(help="Any trace file kvbench reads.")],
    out: Annotated[Path, typer.Argument(help="Output file: .jsonl, .csv or .parquet.")],
) -> None:
    """Read any supported trace file and write it in kvbench's format (by the output suffix)."""
    from workloads.tracefile import read_trace, write_trace

    if not source.is_file():
        raise KvbenchError(f"{source}: no such file")
    trace = read_trace(source)
    write_trace(trace, out)
    typer.echo(f"wrote {len(trace)} requests to {out}")
