"""`kvbench trace`: make, inspect, plot and convert workload traces; fetch public ones by name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from kvbench.cli import options as opt
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_distinct
from kvbench.results.outputs import prepare_out
from workloads import registry
from workloads.spec import WorkloadSpec, build_trace

app = typer.Typer(
    help="Make, inspect, plot and convert workload traces; fetch public ones by name.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

Out = Annotated[Path, typer.Option(help="Output file: .jsonl, .csv or .parquet.")]
TraceArg = Annotated[
    str,
    typer.Argument(
        metavar="TRACE",
        help="A registered trace (kvbench trace list), a trace file, a preset or a spec.",
        show_default=False,
    ),
]


@contextmanager
def _as_argument(metavar: str) -> Iterator[None]:
    """Name the positional argument as the user typed it: the workload code says `--trace`."""
    try:
        yield
    except KvbenchError as error:
        raise KvbenchError(str(error).replace("--trace", metavar)) from None


def _load(source: str):
    """A registered trace or a trace file as it is, or a spec built with its default options
    (all arriving at once)."""
    with _as_argument("TRACE"):
        if source in registry.TRACES or Path(source).is_file():
            from workloads.tracefile import read_trace

            trace = read_trace(registry.trace_file(source))
            return replace(trace, name=source) if source in registry.TRACES else trace
        return build_trace(WorkloadSpec(source=source, arrivals="all"))


@app.command(short_help="Build a trace from a preset, spec or file and write it.")
@opt.user_errors
@opt.with_workload(source_argument=True)
def make(workload: WorkloadSpec, out: Out) -> None:
    """Build a trace (lengths, sharing, arrivals) and write it in kvbench's trace format."""
    from workloads.tracefile import write_trace

    prepare_out(out, "trace")
    with _as_argument("SPEC"):
        trace = build_trace(workload)
    write_trace(trace, out)
    typer.echo(f"wrote {len(trace)} requests to {out}")


@app.command(short_help="Counts, rates and length percentiles of a trace.")
@opt.user_errors
def stats(trace: TraceArg) -> None:
    """Print count, duration, rate, interarrival CV, length percentiles and prefix reuse."""
    from workloads.stats import format_stats, trace_stats

    typer.echo(format_stats(trace_stats(_load(trace))))


@app.command(short_help="Length histograms and arrivals over time, as PNG and SVG.")
@opt.user_errors
def plot(
    trace: TraceArg,
    out: Annotated[Path, typer.Option(help="PNG file (an SVG is written beside it).")],
) -> None:
    """Plot input/output length histograms (the paper's Figure 11) and the arrival rate."""
    from kvbench.report.trace_plot import plot_trace
    from kvbench.results.outputs import prepare_plot

    prepare_plot(out)  # a file kvbench did not write is refused before loading (kvbench.results.outputs)
    for path in plot_trace(_load(trace), out):
        typer.echo(f"wrote {path}")


@app.command(short_help="Download public traces by name (the one command that downloads).")
@opt.user_errors
def fetch(
    names: Annotated[
        list[str],
        typer.Argument(metavar="NAME|all", help=f"{', '.join(registry.TRACES)}, or all.", show_default=False),
    ],
) -> None:
    """Download registered traces from their upstream repositories, pinned to a commit.

    Each file streams into the cache (KVBENCH_CACHE_DIR/traces, else the user cache folder) and
    is kept only if its sha256 matches the registry; a verified copy already there, or in
    KVBENCH_TRACE_DIR, is not downloaded again. KVBENCH_TRACE_URL replaces
    https://raw.githubusercontent.com (a mirror). Prints each trace's license and citation:
    cite them when you publish results."""
    if "all" in names and len(names) > 1:
        others = ", ".join(n for n in names if n != "all")
        raise KvbenchError(f"NAME: 'all' names every trace: give it alone, not with {others}")
    check_distinct("NAME", names)  # a name twice would be downloaded twice
    traces = list(registry.TRACES.values()) if names == ["all"] else [registry.lookup(n) for n in names]
    failed = []
    for trace in traces:
        try:
            path = registry.folder_copy(trace)  # offline copies: nothing to download
            verb = f"verified copy in {registry.TRACE_DIR_ENV}"
            if path is None:
                verb = "already cached" if registry.is_cached(trace) else "fetched, sha256 verified"
                path = registry.fetch(trace)
        except KvbenchError as error:
            failed.append(f"{trace.name}: {error}")
            continue
        typer.echo(f"{trace.name}: {verb}: {path}")
        typer.echo(f"  license {trace.license}; cite {trace.citation}")
    if failed:
        raise KvbenchError(
            "; ".join(failed) if len(failed) == 1 else f"{len(failed)} not fetched: " + "; ".join(failed)
        )


@app.command(name="list", short_help="The public traces kvbench knows by name, and where each is.")
@opt.user_errors
def list_traces() -> None:
    """One line per registered trace: name, where its copy is (or that it needs fetching), size,
    license and contents."""
    for trace in registry.TRACES.values():
        try:
            where = str(registry.trace_file(trace.name))
        except KvbenchError:
            where = f"not here: kvbench trace fetch {trace.name}"
        typer.echo(f"{trace.name}: {trace.about}; {trace.size:,} bytes, {trace.license}; {where}")


@app.command(short_help="Convert a trace file to another format.")
@opt.user_errors
def convert(
    source: Annotated[
        str, typer.Argument(metavar="TRACE", help="A registered trace or any trace file kvbench reads.")
    ],
    out: Annotated[Path, typer.Argument(help="Output file: .jsonl, .csv or .parquet.")],
) -> None:
    """Read any supported trace file and write it in kvbench's format (by the output suffix)."""
    from workloads.tracefile import read_trace, write_trace

    prepare_out(out, "trace", flag="OUT")
    if not source.strip():  # Path('') is the current folder
        raise KvbenchError("TRACE: an empty path names no trace")
    path = registry.trace_file(source)
    if path.is_dir():
        raise KvbenchError(f"TRACE {source}: is a folder, not a trace file")
    if not path.is_file():
        raise KvbenchError(f"TRACE {source}: no such file or registered trace")
    trace = read_trace(path)
    write_trace(trace, out)
    typer.echo(f"wrote {len(trace)} requests to {out}")
