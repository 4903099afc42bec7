"""The `kvbench` command line.

User mistakes surface as `error: <one line naming the parameter>` with exit code 2; a
traceback means a kvbench bug.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated

import typer

from engines import ENGINES
from kvbench.budget import GPUS
from kvbench.cli import calibrate as cli_calibrate
from kvbench.cli import kernels as cli_kernels
from kvbench.cli import options as opt
from kvbench.cli import report as cli_report
from kvbench.cli import reproduce as cli_reproduce
from kvbench.cli import sweep as cli_sweep
from kvbench.cli import trace as cli_trace
from kvbench.config import DEFAULT_GPU, RunConfig, check_real_options, with_expert_dispatch
from kvbench.errors import KvbenchError
from kvbench.flags import RealOptions, first_set
from kvbench.models import MODELS
from kvbench.plugins import EXTERNAL
from kvbench.report.format import aligned, count, percent, show, significant
from workloads.presets import PRESETS
from workloads.spec import WorkloadSpec, dropped_line

app = typer.Typer(
    help="Measure how KV-cache allocation strategies change what one GPU can serve.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)


def _choices(names) -> str:
    return ", ".join(names)


def _job(
    workload: WorkloadSpec,  # the workload flags, see cli_options.with_workload
    real: RealOptions | None,  # None: simulate; else the real-run flags (options.with_real)
    engine: Annotated[
        str, typer.Option(help=f"Engine: {_choices(ENGINES)}; for real runs also {_choices(EXTERNAL)}.")
    ],
    out: Annotated[Path, typer.Option(help="Folder for config.json, steps.csv, requests.csv, summary.json.")],
    model: Annotated[str, typer.Option(help=f"Model preset: {_choices(MODELS)}.")] = "opt-13b",
    kv_cache_gib: Annotated[
        float | None, typer.Option(help="KV budget in GiB (default: derived from --emulate-gpu).")
    ] = None,
    emulate_gpu: Annotated[
        str,
        typer.Option(
            help=f"GPU whose memory sizes the budget and whose roofline sets step times: {_choices(GPUS)}."
        ),
    ] = DEFAULT_GPU,
    gpu_memory_utilization: Annotated[
        float, typer.Option(help="Share of GPU memory a server may use.")
    ] = 0.9,
    block_size: Annotated[
        int,
        typer.Option(
            help="Block-table engines (paged, hybrid, jenga and their variants): slots per block "
            "(power of two)."
        ),
    ] = 16,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="Cap on running requests (default 256; static: memory-bound).")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            help="Continuous engines: prompt tokens per prefill step (default max(max len, 2048)), or every "
            "step's token budget under --chunked-prefill (default 2048)."
        ),
    ] = None,
    chunked_prefill: Annotated[
        bool,
        typer.Option(
            help="Continuous engines: chunked prefill (Sarathi-Serve): each step runs every decode and fills "
            "the rest of --max-num-batched-tokens with prompt chunks (docs/CHUNKED_PREFILL.md)."
        ),
    ] = False,
    contiguous_fit: Annotated[str, typer.Option(help="Contiguous engines: buddy or first-fit.")] = "buddy",
    watermark: Annotated[
        float, typer.Option(help="Block-table and vmm engines: share of memory kept free at admission.")
    ] = 0.01,
    preemption: Annotated[
        str,
        typer.Option(
            help="paged, paged-static, paged-prefix: recompute, or swap blocks to host memory (other "
            "engines recompute)."
        ),
    ] = "recompute",
    swap_space_gib: Annotated[
        float,
        typer.Option(
            help="paged, paged-static, paged-prefix under --preemption swap: host memory for swapped blocks."
        ),
    ] = 4.0,
    vmm_layout: Annotated[
        str,
        typer.Option(
            help="vmm: per-layer (vAttention's: a virtual tensor per layer for K and V) or per-request "
            "(one range holding every layer of a request)."
        ),
    ] = "per-layer",
    vmm_page_kib: Annotated[
        int, typer.Option(help="vmm: physical page in KiB (2048: the driver's page; smaller is simulated).")
    ] = 2048,
    vmm_map: Annotated[
        str,
        typer.Option(
            help="vmm: map pages just before the step needing them (sync), or a segment ahead while steps "
            "run (ahead; simulated, decode steps then pay no maps)."
        ),
    ] = "sync",
    cost_model: Annotated[
        str | None, typer.Option(help="Cost model fitted to real runs (kvbench calibrate's JSON).")
    ] = None,
    cost_fixed_s: Annotated[
        float | None,
        typer.Option(help="Cost model: seconds per step (all weight reads, a MoE model's experts too)."),
    ] = None,
    cost_per_token_s: Annotated[float | None, typer.Option(help="Cost model: seconds per token fed.")] = None,
    cost_per_kv_token_s: Annotated[
        float | None, typer.Option(help="Cost model: seconds per context token attended.")
    ] = None,
    step_by_step: Annotated[
        bool, typer.Option(help="One row per step instead of coalescing identical decode steps.")
    ] = False,
    percentiles: Annotated[
        str, typer.Option(help="Percentiles in (0, 100] of TTFT, TPOT, ITL, E2EL, queueing in summary.json.")
    ] = "50,90,99",
    slo: Annotated[
        str | None,
        typer.Option(help="Goodput: seconds per objective, e.g. ttft=0.5,tpot=0.05,e2el=20 (all must hold)."),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace the kvbench run already in --out.")] = False,
) -> None:
    """Drive a trace through one engine: simulated (cost model) or real (the model on a device)."""
    from kvbench.metrics.summary import parse_percentiles, parse_slo
    from kvbench.results.outputs import prepare_out
    from kvbench.simulate import simulate as run_simulation
    from kvbench.simulate import write_result

    if real is None and engine in EXTERNAL:
        raise KvbenchError(f"--engine {engine}: external engines only run for real (kvbench run)")
    if real is not None and engine not in EXTERNAL:
        _refuse_hf_flags(engine, real)
    opt.refuse_unread_engine_flags(
        (engine,),
        {
            "block_size": block_size, "contiguous_fit": contiguous_fit, "watermark": watermark,
            "preemption": preemption, "swap_space_gib": swap_space_gib,
            "vmm_layout": vmm_layout, "vmm_page_kib": vmm_page_kib, "vmm_map": vmm_map,
        },
    )  # fmt: skip
    if workload.rate is None and workload.arrivals is None and workload.source in PRESETS:
        workload = replace(workload, rate=1.0)  # presets have no timestamps; 1 req/s unless told
    config = RunConfig(
        engine=engine, model=model, workload=workload, kv_cache_gib=kv_cache_gib, emulate_gpu=emulate_gpu,
        gpu_memory_utilization=gpu_memory_utilization, block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, chunked_prefill=chunked_prefill,
        contiguous_fit=contiguous_fit, watermark=watermark,
        preemption=preemption, swap_space_gib=swap_space_gib,
        vmm_layout=vmm_layout, vmm_page_kib=vmm_page_kib, vmm_map=vmm_map, cost_model=cost_model,
        cost_fixed_s=cost_fixed_s, cost_per_token_s=cost_per_token_s, cost_per_kv_token_s=cost_per_kv_token_s,
        percentiles=parse_percentiles(percentiles), slo=parse_slo(slo), **(asdict(real) if real else {}),
    )  # fmt: skip
    config = with_expert_dispatch(config) if real else config
    prepare_out(out, "run", overwrite)  # before the work: a bad --out fails now, not after it
    start = time.perf_counter()
    if real is None:
        result = run_simulation(config, coalesce=not step_by_step)
    else:
        from kvbench.real.run import run_real

        check_real_options(config)  # before the model loads (prepare checks it again)
        result = run_real(config, coalesce=not step_by_step)
    write_result(result, out)
    s = result.summary
    typer.echo(
        f"{engine}: {count(s['completed'])}/{count(s['num_requests'])} requests in "
        f"{significant(s['makespan_s'])} s {s['mode']} ({significant(time.perf_counter() - start)} s wall), "
        f"{significant(s['request_throughput'])} req/s, {significant(s['mean_batched_requests'])} batched, "
        f"normalized latency {significant(s['normalized_latency_s'])} s/token, "
        f"{count(s.get('num_preemptions') or 0)} preemptions\n{_occupancy_lines(s)}\n"
        f"  results: {out}"
    )
    if "goodput" in s:
        goodput, met = significant(s["goodput"]), percent(s["goodput_fraction"])
        typer.echo(f"  goodput: {goodput} req/s ({met}% met {slo})")
    if dropped_line(s):
        typer.echo(f"  {dropped_line(s)}")


def _refuse_hf_flags(engine: str, real: RealOptions) -> None:
    """The --hf-* flags set up transformers' engines only: given to one of kvbench's, they
    would be ignored (an --hf-attn kvbench does not know even unchecked), and the run's
    config.json would record them as if they had shaped it."""
    given = first_set(real, "hf_")
    if given is not None:
        raise KvbenchError(
            f"{given} sets up the external engines ({', '.join(EXTERNAL)}), which --engine {engine} is not: "
            "leave it out"
        )


def _occupancy_lines(summary: dict) -> str:
    """Both weightings of the occupancy, each labelled: over the busy time, and over the time some
    request waited for memory (Figure 2's, which `compare` and the report show)."""

    def line(label: str, key: str, absent: str) -> str:
        shares = summary.get(key) or {}
        text = "  ".join(f"{k} {percent(v)}%" for k, v in shares.items())
        return f"  occupancy, {label}: {text or absent}"

    return "\n".join((
        line("busy-weighted", "occupancy", "not observable"),
        line("saturated-weighted (while requests wait for memory)", "occupancy_saturated", "never saturated"),
    ))  # fmt: skip


app.command(
    "simulate", short_help="Simulate one engine on a trace: real allocator and scheduler, modelled time."
)(opt.user_errors(opt.with_workload(opt.without(_job, real=None))))
app.command("run", short_help="Run one engine on a trace with real decoding, measuring step times.")(
    opt.user_errors(opt.with_workload(opt.with_real(_job)))
)


@app.command(short_help="Every engine side by side, beside the paper's numbers, ending with a report.")
@opt.user_errors
def demo(
    out: Annotated[
        Path, typer.Option(help="Folder for each engine's results, demo.md and the report.")
    ] = Path("runs/demo"),
    mode: Annotated[
        str, typer.Option(help="auto (real decoding on a CUDA GPU, else simulated), simulate or real.")
    ] = "auto",
    num_requests: Annotated[
        int | None, typer.Option(help="Requests in the trace (default: 1000 simulated, 100 real).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the trace.")] = 0,
) -> None:
    """Every engine on the same trace and KV budget; simulated on CPU, real on a GPU; then the report."""
    from kvbench.demo import REAL, run_demo, table_cells
    from kvbench.report.build import write_report

    if mode not in ("auto", "simulate", "real"):
        raise KvbenchError(f"--mode {mode!r}: choose auto, simulate or real")
    real = mode == "real" or (mode == "auto" and opt.has_cuda())
    if real and not opt.has_cuda():  # before --out is made: a refused demo leaves nothing behind
        raise KvbenchError("--mode real: torch sees no CUDA GPU here; --mode simulate runs on the CPU")
    default = 100 if real else 1000
    count = default if num_requests is None else num_requests  # 0 is refused (flag_ranges), not replaced
    if real:
        typer.echo(
            f"Real decoding on the GPU: {count} sharegpt-paper requests at {REAL['rate']:g} req/s, "
            f"{REAL['model']} with {REAL['kv_cache_gib']:g} GiB of KV (16,384 slots, as the paper's "
            "OPT-13B with 12 GiB); about two minutes...\n"
        )
    else:
        typer.echo(
            f"Simulating {count} sharegpt-paper requests at 2 req/s on OPT-13B with 12 GiB of KV cache "
            "(the paper's A100-40GB setting)...\n"
        )
    rows = run_demo(out, num_requests=count, seed=seed, real=real)
    show(aligned(*table_cells(rows)))
    html, _ = write_report([out], out / "report")
    typer.echo(
        "\nkvbench (paper): mean batched requests as in Figure 13; occupancy % as in Figure 2, "
        "time-weighted while requests wait.\n"
        f"Results: {out}/<engine>/ (config.json, steps.csv, requests.csv, summary.json), {out}/demo.md\n"
        f"Report: {html}"
    )


app.add_typer(cli_trace.app, name="trace")


app.command("kernels", short_help=cli_kernels.SHORT_HELP)(cli_kernels.kernels)
app.command("sweep", short_help=cli_sweep.SHORT_HELP)(cli_sweep.command(_job))
cli_report.register(app)
cli_reproduce.register(app)
cli_calibrate.register(app)


# click's own usage errors (an unknown option, `--seed abc`), found by walking up from a class
# typer exports: typer vendors click in some versions and re-exports it in others
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def main() -> None:
    """The `kvbench` script: click's usage errors, too, become one `error:` line and exit code 2."""
    try:
        code = app(standalone_mode=False)
    except _USAGE_ERROR as error:
        typer.echo(f"error: {' '.join(error.format_message().split())}", err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
