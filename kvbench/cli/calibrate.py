"""`kvbench calibrate`: the command line of `kvbench.calibrate.fit` and `kvbench.calibrate.check`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand

from kvbench.cli import options as opt
from kvbench.errors import KvbenchError

SHORT_HELP = "Fit the simulator's step-time model to real runs (for simulate --cost-model)."


class _KeepsArgs(TyperCommand):
    """Keeps the raw arguments: `--held-out A B` parses as held-out A and B *fitted* (an option
    takes one value; the rest are positional), which only the raw order can tell."""

    def parse_args(self, ctx, args):
        ctx.meta["raw_args"] = list(args)
        return super().parse_args(ctx, args)


def stray_after_held_out(args: list[str]) -> str | None:
    """The first positional argument after a `--held-out` (which click would fit), if any."""
    seen, index = False, 0
    while index < len(args):
        arg = args[index]
        if arg in ("--held-out", "--out", "--objective", "--knee-gain"):
            seen |= arg == "--held-out"
            index += 2  # the option and its value
            continue
        seen |= arg.startswith("--held-out=")
        if seen and not arg.startswith("-"):
            return arg
        index += 1
    return None


def calibrate(
    ctx: typer.Context,
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Real runs of one model to fit: run folders, or folders holding them.", parser=opt.named_path
        ),
    ],
    out: Annotated[Path, typer.Option(help="Where to write the fitted model (JSON).")] = Path("cost.json"),
    held_out: Annotated[
        list[Path] | None,
        typer.Option(
            help="Real runs not fitted, each simulated with the fit and compared: a run folder or a folder "
            "holding them (repeatable: --held-out A --held-out B; give the runs to fit first).",
            parser=opt.named_path,
        ),
    ] = None,
    objective: Annotated[
        str,
        typer.Option(
            help="What the fit minimises: mean (each step's error relative to its predicted mean: "
            "prices the mean step, what a simulation adds up), relative (error relative to the "
            "measured duration: earlier files' fit, below the median on noisy steps) or absolute "
            "(squared seconds per step). docs/CALIBRATION.md."
        ),
    ] = "mean",
    by_engine: Annotated[
        bool,
        typer.Option(
            "--by-engine/--no-by-engine",
            help="Also fit each engine's runs alone; a simulation of that engine prices with its own "
            "fit (paged attention reads K/V through block tables, a contiguous engine does not), any "
            "other engine with the fit of every run. docs/CALIBRATION.md.",
        ),
    ] = False,
    knee_gain: Annotated[
        float,
        typer.Option(
            help="Keep a decode knee (more per row past a batch size) when its squared error is at most "
            "this share of the linear fit's, 0 to 1: 0.9 (the default) asks it to cut the error by a "
            "tenth, 0.5 (files that record no knee_gain) to halve it "
            "(results/reference/calibration-knee-gain). docs/CALIBRATION.md.",
        ),
    ] = 0.9,
) -> None:
    """Least-squares fit of the cost model's constants to the runs' measured step rows."""
    from kvbench.calibrate.check import dropped_note, find_runs, fit_and_check, format_checks, headline
    from kvbench.calibrate.fit import OBJECTIVES
    from kvbench.results.outputs import prepare_out

    if objective not in OBJECTIVES:
        raise KvbenchError(f"--objective {objective}: not one of {', '.join(OBJECTIVES)}")

    stray = stray_after_held_out(ctx.meta.get("raw_args", []))
    if stray is not None:
        raise KvbenchError(
            f"--held-out: {stray} follows it, and would be fitted; --held-out takes one path: repeat it "
            "(--held-out A --held-out B) or give a folder holding the runs, and put the runs to fit first"
        )
    prepare_out(out, "calibration")  # a user's file there is refused before fitting (kvbench.results.outputs)
    fit = find_runs(runs, steps=True, flag="kvbench calibrate")
    held = find_runs(held_out, steps=False, flag="--held-out") if held_out else []
    done = fit_and_check(fit, held, out, objective=objective, by_engine=by_engine, knee_gain=knee_gain)
    if done.checks:
        typer.echo(format_checks(done.checks))
        typer.echo(f"held out: {headline(done.checks)}")
    if done.dropped:
        typer.echo(dropped_note(done.dropped))
    from kvbench.calibrate.fit import shape_lines

    result = done.calibration
    said = shape_lines(result)  # an engine's fit says only what the fit of every run did not
    for label, fit in ((result.model, result), *((f"  {e}", f) for e, f in result.engines.items())):
        c = fit.cost
        typer.echo(
            f"{label}: fixed {1e3 * c.fixed_s:.3f} ms/step, {1e6 * c.per_token_s:.3f} us/decode row, "
            f"{1e6 * c.per_token(prefill=True):.3f} us/prefill token, "
            f"{1e9 * c.per_kv_token_s:.3f} ns/context token, "
            f"{1e6 * c.per_swap_block_s:.1f} us/swapped block, "
            f"{1e3 * c.per_prefill_s:.3f} ms more per prefill "
            f"({fit.rows} rows; relative error median {100 * fit.median_relative_error:.1f} %, "
            f"p90 {100 * fit.p90_relative_error:.1f} %)"
        )
        for line in shape_lines(fit):
            if fit is result or line not in said:
                typer.echo(f"  {'  ' * (fit is not result)}{line}")
    typer.echo(f"  written: {out}")


def register(app: typer.Typer) -> None:
    app.command("calibrate", short_help=SHORT_HELP, cls=_KeepsArgs)(opt.user_errors(calibrate))
