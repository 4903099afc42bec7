"""`kvbench reproduce`: the command line of `kvbench.reproduce.run`."""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from kvbench.cli import options as opt
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_seed_span

SHORT_HELP = "Run the paper's figures (2, 12-19) and its claims, every number beside the paper's."


def reproduce(
    ctx: typer.Context,
    figures: Annotated[
        list[str] | None,
        typer.Argument(
            help="Figures: fig2, fig13, fig12, fig14, fig15, fig16, fig17, fig18b, fig19, claims "
            "(default: all)."
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder: <figure>/, claims.md, reproduce.md.")] = Path(
        "runs/reproduce"
    ),
    quick: Annotated[
        bool, typer.Option(help="Fewer requests and rates: minutes, simulated on a CPU or real on one GPU.")
    ] = False,
    mode: Annotated[
        str, typer.Option(help="auto (real decoding on a CUDA GPU, else simulated), simulate or real.")
    ] = "auto",
    cost_model: Annotated[
        str | None, typer.Option(help="Simulate with this `kvbench calibrate` file instead of the roofline.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Real runs' model: opt-125m (default with --quick), opt-1.3b (default without) or "
            "opt-13b (the paper's model and its 15,728-slot KV budget)."
        ),
    ] = None,
    place_with: Annotated[
        str | None,
        typer.Option(
            help="Real runs: a `kvbench calibrate` file of the same model; each engine's rates are "
            "placed around the sustained rate the simulator calibrated by it finds."
        ),
    ] = None,
    place_only: Annotated[
        bool,
        typer.Option(
            help="With --place-with: only run the placement simulations of Figure 12's real runs (on a "
            "CPU), so a later real invocation on a GPU finds them finished; no real run."
        ),
    ] = False,
    rejudge: Annotated[
        bool,
        typer.Option(
            help="Judge the figures already in --out again by today's verdict rules, from the rows "
            "they hold (no run), and rewrite their verdicts, reproduce.md and claims.md."
        ),
    ] = False,
    rate_scale: Annotated[
        float | None,
        typer.Option(
            help="The paper's rates times this, instead of the setting's own (real OPT-13B: 3, the "
            "A100's decode step over the H200's; simulated: 1, the paper's). A higher scale loads "
            "an engine the setting's rates leave arrival-limited (OPT-13B's paged in Figures 2 and "
            "13 needs about 6). Figure 12's rates placed by --place-with are found, not scaled."
        ),
    ] = None,
    prefill_graphs: Annotated[
        bool,
        typer.Option(
            "--prefill-graphs/--no-prefill-graphs",
            help="Real runs: replay short prefills as CUDA graphs, as decode steps are, so that a "
            "prefill step costs its device work rather than the host's launches (an eager short "
            "prefill on OPT-13B is host-bound: docs/REPRODUCTION.md). Give the figures an --out of "
            "their own: runs of the other prefill mode are not reused.",
        ),
    ] = False,
    num_requests: Annotated[int | None, typer.Option(hidden=True, help="Requests per run (tests).")] = None,
    deadline_s: opt.DeadlineOption = None,
    seed: Annotated[int, typer.Option(help="Seed of the traces (the first, with --repeats).")] = 0,
    repeats: Annotated[
        int,
        typer.Option(
            help="Run every figure on seeds seed .. seed+N-1 (another trace sample and arrivals each), "
            "into <figure>/seed-<s>/: numbers become means with 95 % confidence intervals."
        ),
    ] = 1,
) -> None:
    """Run, collect and report the paper's figures; kvbench's numbers beside the paper's."""
    from kvbench.reproduce.rows import Options
    from kvbench.reproduce.run import parse_figures, placement_for, run_reproduce, setting_for
    from kvbench.reproduce.run import rejudge as judge_again

    names = parse_figures(figures or [])
    if rejudge:
        _check_rejudge(ctx)
    if mode not in ("auto", "simulate", "real"):
        raise KvbenchError(f"--mode {mode!r}: choose auto, simulate or real")
    if num_requests is not None and num_requests < 1:
        raise KvbenchError(f"--num-requests must be at least 1, got {num_requests}")
    if repeats < 1:
        raise KvbenchError(f"--repeats must be at least 1, got {repeats}")
    check_seed_span(seed + repeats - 1, f"--seed {seed} and --repeats {repeats}")  # seeds seed .. seed+N-1
    real = mode == "real" or (mode == "auto" and cost_model is None and opt.has_cuda())
    setting = setting_for(real, cost_model, quick=quick, model=model)
    if rate_scale is not None:
        setting = replace(setting, rate_scale=rate_scale)
    setting = placement_for(setting, place_with)
    if place_only and setting.placement is None:
        raise KvbenchError("--place-only: give the cost file to place with (--place-with)")
    setting = replace(setting, place_only=place_only)
    if prefill_graphs and not setting.real:
        raise KvbenchError(
            "--prefill-graphs replays real runs' prefills: use it with --mode real (or auto on a GPU)"
        )
    setting = replace(setting, prefill_graphs=prefill_graphs)
    runs_here = not (rejudge or place_only)  # placing real runs simulates them: no GPU needed
    if mode == "real" and runs_here and setting.device.startswith("cuda") and not opt.has_cuda():
        # else the first real run refuses, naming a --device this command has no flag for
        raise KvbenchError("--mode real: no CUDA device is available here (--mode simulate needs none)")
    options = Options(quick, setting, num_requests, seed, repeats, opt.deadline(deadline_s))
    if rejudge:
        judge_again(names, options, out, functools.partial(print, flush=True), named=bool(figures))
        typer.echo(f"judged again: {out / 'reproduce.md'}, {out / 'claims.md'}")
        return
    start = time.perf_counter()
    # print, not typer.echo: under the progress bar (stderr), a terminal's stdout lines go above it
    run_reproduce(names, options, out, echo=functools.partial(print, flush=True))
    reports = f"{out / 'reproduce.md'}, {out / 'claims.md'}"
    wrote = f"{out}/fig12/seed-<s>/<trace>.placement/" if place_only else reports
    typer.echo(f"done in {time.perf_counter() - start:.0f} s: {wrote}")


RUN_ONLY = ("seed", "repeats", "num_requests", "deadline_s", "place_only", "prefill_graphs")
"""Options that shape runs, which `--rejudge` does not make: it judges the rows already in --out."""


def _check_rejudge(ctx: typer.Context) -> None:
    """Refuse a run option given with `--rejudge`, which would ignore it: the seeds and counts
    are those the folder's rows were run with (the reports name its own seeds)."""
    given = [f"--{name.replace('_', '-')}" for name in RUN_ONLY if opt.given(ctx, name)]
    if given:
        raise KvbenchError(
            f"--rejudge judges the rows already in --out, with the seeds they were run on: "
            f"{', '.join(given)} would be ignored; drop {'it' if len(given) == 1 else 'them'}"
        )


def register(app: typer.Typer) -> None:
    app.command("reproduce", short_help=SHORT_HELP)(opt.user_errors(reproduce))
