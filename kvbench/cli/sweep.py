"""`kvbench sweep`: the command line of `kvbench.sweep.run`.

Its options are the sweep's own (the axes as comma-separated lists, resume and failure
handling, the sustained-rate search), the workload flags less the three that become axes
(`--trace` repeated, `--seeds`, `--rates`), the real-run flags (used with `--real`), and every
option of the single-run job that is not an axis (`--model`, `--emulate-gpu`, `--slo`, ...),
borrowed from its signature so `simulate`, `run` and `sweep` cannot drift apart.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from kvbench.cli import options as opt
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_arrival_span, check_seed_span
from kvbench.flags import RealOptions, first_set
from kvbench.plugins import EXTERNAL
from kvbench.report.format import significant
from kvbench.sweep.grid import DURATION_MIN_REQUESTS, PAPER_ENGINES, REPEAT_SEED_STRIDE
from workloads.spec import WorkloadSpec

SHORT_HELP = "Sweep engines x rates x block sizes x budgets x seeds x traces; find sustained rates."
_AXES = ("engine", "block_size", "kv_cache_gib")  # the job's single values the sweep takes as lists
_JOB_ONLY = ("workload", "real", "out", "overwrite", *_AXES)


def _sweep(
    workload: WorkloadSpec,
    real: RealOptions,
    job_options: dict,  # the single-run options (`command` borrows them from the job)
    out: Annotated[Path, typer.Option(help="Sweep folder: sweep.json, sweep.csv, sustained.csv, cells/.")],
    engines: Annotated[str, typer.Option(help="Comma-separated engines, or all.")] = ",".join(PAPER_ENGINES),
    trace: Annotated[
        list[str] | None, typer.Option(help="Workload spec (as simulate's --trace); repeat for several.")
    ] = None,
    rates: Annotated[
        str | None, typer.Option(help="Comma-separated requests/s (default: the trace's timestamps or 1).")
    ] = None,
    block_sizes: Annotated[str, typer.Option(help="Comma-separated block sizes.")] = "16",
    kv_cache_gib: Annotated[
        str | None, typer.Option(help="Comma-separated KV budgets in GiB (default: from --emulate-gpu).")
    ] = None,
    seeds: Annotated[str, typer.Option(help="Comma-separated workload seeds.")] = "0",
    repeats: Annotated[int, typer.Option(help="Runs per cell, seeds shifted by 1000, for 95 % CIs.")] = 1,
    real_mode: Annotated[
        bool, typer.Option("--real/--simulate", help="Real decoding (kvbench run) or the simulator.")
    ] = False,
    isolate: Annotated[bool, typer.Option(help="Run each cell in its own kvbench process.")] = False,
    cell_timeout: Annotated[float | None, typer.Option(help="--isolate: stop a cell after seconds.")] = None,
    resume: Annotated[bool, typer.Option(help="Skip the cells already finished in --out.")] = False,
    deadline_s: opt.DeadlineOption = None,
    overwrite: Annotated[bool, typer.Option(help="Replace the sweep already in --out.")] = False,
    continue_on_error: Annotated[
        bool, typer.Option(help="Record a failing cell in sweep.csv and go on (default: stop).")
    ] = False,
    latency_threshold: Annotated[
        float | None,
        typer.Option(help="Sustained rate: normalized latency (s/token) to stay under (default: see below)."),
    ] = None,
    threshold_multiple: Annotated[
        float | None,
        typer.Option(
            help="Default threshold, shared by all engines: this many times their lowest unloaded latency "
            "(default 4)."
        ),
    ] = None,
    bisect: Annotated[
        int, typer.Option(help="Bisection rounds per engine between last pass and first fail (a cap).")
    ] = 0,
    bracket: Annotated[
        float | None,
        typer.Option(help="Bisect until (first fail - last pass) / last pass is at most this, e.g. 0.1."),
    ] = None,
    baseline_rate: Annotated[
        float, typer.Option(help="Unloaded baseline: requests/s, evenly spaced, so each runs alone.")
    ] = 0.001,
    baseline_requests: Annotated[int, typer.Option(help="Unloaded baseline: requests it runs.")] = 50,
    duration: Annotated[
        float | None,
        typer.Option(
            help="Each loaded cell's trace lasts this many seconds at its rate (rate x duration requests, "
            "at least 20), not --num-requests: an overload lasts as long at every rate."
        ),
    ] = None,
    executor: Annotated[
        str, typer.Option(help="Where cells run: local (this machine) or ray (a Ray cluster).")
    ] = "local",
    parallel_gpus: Annotated[
        int, typer.Option(help="local: run this many cells at once, each in its own process on its own GPU.")
    ] = 1,
    ray_address: Annotated[
        str | None,
        typer.Option(help="ray: the cluster's HOST:PORT (default: `ray start`'s here, else a local one)."),
    ] = None,
    ray_retries: Annotated[int, typer.Option(help="ray: reruns of a cell whose worker or node died.")] = 3,
) -> None:
    """A grid of simulated (or real) runs, one folder per cell, resumable; sustained rates per engine."""
    from kvbench.config import RunConfig, prepare, with_expert_dispatch
    from kvbench.metrics.summary import parse_percentiles, parse_slo
    from kvbench.sweep.cell import CellRun
    from kvbench.sweep.grid import (
        Axes,
        Baseline,
        grid_cells,
        parse_block_sizes,
        parse_budgets,
        parse_engines,
        parse_rates,
        parse_seeds,
        parse_traces,
    )
    from kvbench.sweep.plan import SustainedOptions, SweepPlan
    from kvbench.sweep.run import run_sweep

    axes = Axes(
        parse_engines(engines, real_mode), parse_traces(trace), parse_rates(rates),
        parse_block_sizes(block_sizes), parse_budgets(kv_cache_gib), parse_seeds(seeds), repeats,
    )  # fmt: skip
    multiple = SustainedOptions().multiple if threshold_multiple is None else threshold_multiple
    _check_counts(repeats, bisect, multiple, latency_threshold, baseline_rate, baseline_requests)
    _check_spans(axes.swept_rates, workload.num_requests, baseline_rate, baseline_requests)
    last_repeat = REPEAT_SEED_STRIDE * (repeats - 1)  # repeat r of seed s draws with seed s + 1000 r
    check_seed_span(max(axes.seeds) + last_repeat, f"--seeds {seeds} and --repeats {repeats}")
    if duration is not None and not axes.swept_rates:
        raise KvbenchError("--duration sets each rate's request count: give --rates")
    if not axes.swept_rates and (bisect or latency_threshold is not None or bracket is not None):
        raise KvbenchError("--bisect, --bracket and --latency-threshold find a sustained rate: give --rates")
    _check_ignored(workload, real, real_mode, axes.engines, duration, latency_threshold, threshold_multiple)
    _check_timeout(cell_timeout, isolate or (executor == "local" and parallel_gpus > 1))
    options = dict(job_options)
    block_size = next((bs for bs in axes.block_sizes if bs != RunConfig.block_size), RunConfig.block_size)
    opt.refuse_unread_engine_flags(
        axes.engines, {**options, "block_size": block_size}, {"block_size": f"--block-sizes {block_sizes}"}
    )
    step_by_step = options.pop("step_by_step")
    percentiles, slo = parse_percentiles(options.pop("percentiles")), parse_slo(options.pop("slo"))
    real_fields = asdict(real) if real_mode else {}
    base = RunConfig(
        axes.engines[0], workload=workload, percentiles=percentiles, slo=slo, **options, **real_fields
    )
    base = with_expert_dispatch(base) if real_mode else base
    baseline = Baseline(baseline_rate, baseline_requests)
    plan = SweepPlan(
        axes, base, CellRun(real_mode, isolate, step_by_step, cell_timeout),
        SustainedOptions(latency_threshold, multiple, bisect, baseline, bracket), continue_on_error,
        duration_s=duration,
    )  # fmt: skip
    if not real_mode and not continue_on_error:
        prepare(plan.config(grid_cells(axes)[0]))  # a mistyped setting fails now, not in the first cell
    if duration is not None:  # every grid rate's count within the trace's rows, before any cell runs
        for cell in grid_cells(axes):
            plan.config(cell)
    start = time.perf_counter()
    where = _executor(executor, parallel_gpus, ray_address, ray_retries, real.device if real_mode else None)
    try:
        result = run_sweep(
            plan, out, resume=resume, overwrite=overwrite, executor=where, deadline=opt.deadline(deadline_s)
        )
    finally:
        where.close()
    typer.echo(
        f"sweep: {len(result.rows)} cells ({result.ran} run, {result.resumed} resumed, "
        f"{result.failed} failed) in {time.perf_counter() - start:.1f} s: {out / 'sweep.csv'}"
    )
    for row in result.sustained:
        rate = f"{row['sustained_rate']:g} req/s" if row["sustained_rate"] is not None else "none"
        threshold = row["latency_threshold_s"]
        limit = f"under {significant(threshold)} s/token" if threshold is not None else "no threshold"
        where = f"{row['engine']} ({row['trace']}, bs {row['block_size']})"
        typer.echo(f"  sustained {where}: {rate}, {limit}{_end_margins(row)}")
    if result.sustained:
        typer.echo(f"  {out / 'sustained.csv'}")


def _end_margins(row: dict) -> str:
    """How far each end of a sustained-rate bracket fell from the bound, for the summary line
    (`; 0.02980 at 5.875 (-9.2 %), 0.04532 at 6.25 (+38.2 %)`; `failed at R` where a cell of the
    first fail R failed, which sustained.csv's `how` says of rates where only some did): an end
    within a few per cent of the bound is a verdict another seed may reverse."""
    threshold = row["latency_threshold_s"]
    if not threshold:
        return ""
    ends = []
    for rate, latency in ((row["last_pass_rate"], row["last_pass_latency_s"]),
                          (row["first_fail_rate"], row["first_fail_latency_s"])):  # fmt: skip
        if rate is None:
            continue
        if latency is None:  # a cell of the rate failed: over any bound (`stats.rate_latency`)
            ends.append(f"failed at {rate:g}")
        else:
            ends.append(f"{significant(latency)} at {rate:g} ({100 * (latency / threshold - 1):+.1f} %)")
    return "; " + ", ".join(ends) if ends else ""


def _executor(name: str, parallel_gpus: int, ray_address: str | None, ray_retries: int, device: str | None):
    """The executor the flags ask for; bad combinations stop here, before anything runs."""
    from kvbench.sweep.executor import LocalExecutor

    if name not in ("local", "ray"):
        raise KvbenchError(f"--executor must be local or ray, got {name!r}")
    if name == "local" and ray_address is not None:
        raise KvbenchError("--ray-address needs --executor ray")
    if name == "ray" and parallel_gpus != 1:
        raise KvbenchError("--parallel-gpus is the local executor's: Ray gives each cell its own GPU itself")
    if parallel_gpus < 1:
        raise KvbenchError(f"--parallel-gpus must be an integer >= 1, got {parallel_gpus}")
    if ray_retries < 0:
        raise KvbenchError(f"--ray-retries must be an integer >= 0, got {ray_retries}")
    pinned = device is not None and device.startswith("cuda:")
    if pinned and (name == "ray" or parallel_gpus > 1):
        raise KvbenchError(f"--device {device}: each cell gets one GPU of its own, give --device cuda")
    if name == "local":
        return LocalExecutor(parallel_gpus)
    from kvbench.sweep.ray_executor import RayExecutor

    return RayExecutor(ray_address, ray_retries)


def _check_ignored(workload, real, real_mode, engines, duration, threshold, multiple) -> None:
    """Refuse a flag that another flag, or the mode, would silently ignore: the cells would
    record something other than what the command line asked for."""
    if duration is not None and workload.num_requests is not None:
        raise KvbenchError(
            f"--num-requests {workload.num_requests} and --duration {duration:g} contradict each other: each "
            f"loaded cell runs rate x duration requests (at least {DURATION_MIN_REQUESTS}); "
            "--baseline-requests sets the unloaded baselines' count; give one of them"
        )
    if threshold is not None and multiple is not None:
        raise KvbenchError(
            f"--latency-threshold {threshold:g} and --threshold-multiple {multiple:g} contradict each other: "
            "a given threshold is used as it is, no multiple of a baseline; give one of them"
        )
    given = first_set(real)
    if not real_mode and given is not None:  # the simulator decodes no token: no device, no sampling
        raise KvbenchError(
            f"{given} is a setting of real runs, which simulated cells would ignore: add --real, or leave "
            "it out"
        )
    given = first_set(real, "hf_")
    if real_mode and given is not None and not set(engines) & set(EXTERNAL):
        raise KvbenchError(
            f"{given} sets up the external engines ({', '.join(EXTERNAL)}), which none of --engines "
            f"{','.join(engines)} is: leave it out"
        )


def _check_timeout(timeout: float | None, isolated: bool) -> None:
    """--cell-timeout stops a cell's own process; a cell run inside the sweep's cannot be stopped."""
    if timeout is not None and not isolated:
        raise KvbenchError(
            f"--cell-timeout {timeout:g} stops a cell's own process: add --isolate (cells run inside the "
            "sweep's process otherwise, where nothing stops them)"
        )


def _check_counts(repeats, bisect, multiple, threshold, baseline_rate, baseline_requests) -> None:
    for flag, ok, value, what in (
        ("--repeats", repeats >= 1, repeats, "an integer >= 1"),
        ("--bisect", bisect >= 0, bisect, "an integer >= 0"),
        ("--threshold-multiple", multiple > 1, multiple, "a finite number > 1"),
        ("--latency-threshold", threshold is None or threshold > 0, threshold, "positive"),
        ("--baseline-rate", baseline_rate > 0, baseline_rate, "positive"),
        ("--baseline-requests", baseline_requests >= 1, baseline_requests, "an integer >= 1"),
    ):
        if not ok:
            raise KvbenchError(f"{flag} must be {what}, got {value}")


def _check_spans(rates, num_requests, baseline_rate, baseline_requests) -> None:
    """Every cell's arrivals within `kvbench.requests.MAX_ARRIVAL_S`, named by the flags that
    set its count and rate (--duration has its own bound)."""
    check_arrival_span(baseline_requests, baseline_rate, "--baseline-requests", "--baseline-rate")
    if num_requests is not None and rates:
        check_arrival_span(num_requests, min(rates), "--num-requests", "--rates")


def command(job):
    """The sweep command, with every option of `job` (simulate/run's) that is not a sweep axis."""
    borrowed = [
        p for p in inspect.signature(job, eval_str=True).parameters.values() if p.name not in _JOB_ONLY
    ]
    own = inspect.signature(_sweep, eval_str=True)
    names = {p.name for p in borrowed}

    @functools.wraps(_sweep)
    def wrapper(**kwargs):
        job_options = {name: kwargs.pop(name) for name in names}
        return _sweep(job_options=job_options, **kwargs)

    params = [p for p in own.parameters.values() if p.name != "job_options"] + borrowed
    wrapper.__signature__ = own.replace(parameters=params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    sweep = opt.with_workload(opt.with_real(wrapper), omit=("source", "seed", "rate"))
    return opt.user_errors(sweep)
