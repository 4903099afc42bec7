"""Where a real run's time goes: prefill and decode steps, and the host functions behind them.

Runs one engine with real decoding twice: first on another seed's trace (it compiles the Triton
kernels and captures the CUDA graphs, without showing cuBLAS this trace's prefill shapes;
`--warm-up-requests` shortens it), then on the trace unprofiled (its step times by kind and by
rows per decode step are the honest ones), then again under a profiler, which slows host-bound
code (compare profiles with each other only; `--profiler none` skips it).

The unprofiled run also splits each prefill step's wall time on the host (`host_table`): the
time until the model's forward pass returned (every kernel launched: on a host-bound step,
most of the step) against the rest (sampling, and the wait for the device), beside the `host`
collector's columns (`kvbench.real.host`: the thread's CPU time, its context switches, the
machine's runnable threads and busy and stolen CPU, the CPUs the thread ended its steps on and
their clock), for the fastest and slowest quarters of the steps apart. A slow quarter whose
launches took longer on as much CPU time ran on a slower or shared CPU (other CPUs, a lower
clock); one with preemptions or steal lost its CPU; one whose launches kept their time waited
on the device. The profilers then say where the time went:

- `--profiler cprofile` (default): the Python functions that took the most time of their own
  (a GPU wait shows up as the call that synchronises: `tolist`, `item`, `synchronize`) and
  the most time with callees;
- `--profiler torch`: torch operators by host time and by device time (`torch.profiler`),
  which names the ATen op or CUDA API call behind a host cost. `--profile-steps K` profiles
  only K steps of one kind (`--profile-kind`: mixed, the default, under chunked prefill;
  prefill; decode, where each is one call of the runner: a segment of one or more decode steps),
  after the first `--skip-steps` of that kind: the profiler records every
  kernel it sees, and over a whole long-context run that took longer than a device call allows;
  and one kind's steps alone say where that kind's time goes (a short prefill beside a decode
  step). `--profile-mixed-steps` and `--skip-mixed-steps` are the same flags' earlier names.

    python benchmarks/step_profile.py [--model opt-125m] [--kv-cache-gib GIB] [--engine paged]
        [--trace sharegpt-paper] [--num-requests 100] [--rate 160] [--beam-width K] [--n N]
        [--device cuda] [--profiler cprofile|torch|none] [--top 30] [--warm-up-requests N]
        [--profile-steps K] [--profile-kind mixed|prefill|decode] [--skip-steps S]
        [--chunked-prefill] [--prefill-graphs] [--emulate-gpu GPU] [--window-duration S] [--max-total-len N]

A trace with timestamps (Mooncake's) replays them when `--rate` is 0; `--num-requests 0` takes
every request of the trace (or of the window); `--window-duration` keeps its first S seconds,
and the warm-up then plays the window after it. `--emulate-gpu` without `--kv-cache-gib` sizes
the budget as a real run does (the GPU's memory less the measured weights and activations).
Under `--chunked-prefill` the mixed steps get their own row.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import time
from dataclasses import replace
from itertools import pairwise

import numpy as np

from kvbench.config import RunConfig
from kvbench.modeling.causal_lm import CausalLM
from kvbench.real.model_runner import ModelRunner
from kvbench.real.run import run_real
from kvbench.reproduce.run import GPU_SETTINGS
from workloads.spec import WorkloadSpec


def step_table(run) -> list[str]:
    """Mean wall time per step and tokens per step, by kind."""
    lines = []
    for kind in ("prefill", "mixed", "decode"):
        rows = [row for row in run.steps if row.kind == kind]
        steps = sum(row.num_steps for row in rows)
        if not steps:
            continue
        seconds = sum(row.duration_s for row in rows)
        tokens = sum(row.num_tokens for row in rows)
        lines.append(
            f"{kind:8s} {steps:6d} steps  {1e3 * seconds / steps:7.3f} ms/step  "
            f"{tokens / steps:7.1f} tokens/step  {seconds:6.2f} s"
        )
    return lines


def rows_table(run, edges=(0, 32, 64, 128, 192, 256, 384, 512)) -> list[str]:
    """Decode steps by rows per step: mean wall time, and context tokens attended per row."""
    lines = []
    for lo, hi in pairwise(edges):
        rows = [row for row in run.steps if row.kind == "decode" and lo < row.batch_size <= hi]
        steps = sum(row.num_steps for row in rows)
        if steps:
            seconds = sum(row.duration_s for row in rows)
            context = sum(row.context_tokens for row in rows) / sum(
                row.batch_size * row.num_steps for row in rows
            )
            per_step = 1e3 * seconds / steps
            label = f"decode rows {lo + 1:3d}-{hi:3d}:"
            lines.append(f"{label} {steps:6d} steps  {per_step:7.3f} ms/step  {context:7.1f} context/row")
    return lines


# the `host` collector's columns (kvbench.real.host)
HOST_COLUMNS = (
    "host_cpu_s", "host_preemptions", "host_waits", "host_runnable", "host_busy_pct", "host_steal_pct",
    "host_cpu_id", "host_cpu_mhz",
)  # fmt: skip


def timed_run(config):
    """`run_real(config)`, with each runner call's host timeline: `[start, forward returned,
    end]` (`time.perf_counter`; NaN where no eager forward pass ran, as in a replayed decode
    graph), one per step row, in order. The wrappers cost a few us a call."""
    calls: list[list[float]] = []
    run, forward = ModelRunner.run, CausalLM.forward

    def timed(self, batch, *args):
        calls.append([time.perf_counter(), math.nan, math.nan])
        try:
            return run(self, batch, *args)
        finally:
            calls[-1][2] = time.perf_counter()

    def launched(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if calls and math.isnan(calls[-1][2]):  # inside a call, not a warm-up or a capture
            calls[-1][1] = time.perf_counter()
        return out

    ModelRunner.run, CausalLM.forward = timed, launched
    try:
        result = run_real(config)
    finally:
        ModelRunner.run, CausalLM.forward = run, forward
    return result, np.array(calls).reshape(-1, 3)


def host_table(result, calls: np.ndarray, kind: str = "prefill") -> list[str]:
    """`kind`'s runner calls (a prefill step, a decode segment) in quarters by wall time, fastest
    first: mean wall, launch (start to the forward's return) and the rest, and the `host`
    collector's columns where the run has them."""
    rows = [i for i, step in enumerate(result.run.steps) if step.kind == kind]
    if len(rows) < 4 or len(calls) != len(result.run.steps):
        return []
    wall = calls[rows, 2] - calls[rows, 0]  # [n]
    launch = calls[rows, 1] - calls[rows, 0]  # [n]
    columns = result.step_columns or [{}] * len(result.run.steps)
    host = {name: np.array([columns[i].get(name, math.nan) for i in rows]) for name in HOST_COLUMNS}
    order = np.argsort(wall)
    lines = [
        f"{kind} calls by wall time, quarters (host columns: kvbench.real.host):",
        f"{'quarter':9s} {'calls':>5s} {'wall ms':>8s} {'launch ms':>9s} {'rest ms':>8s} {'cpu ms':>7s} "
        f"{'preempt':>7s} {'waits':>6s} {'runnable':>8s} {'busy %':>6s} {'steal %':>7s} "
        f"{'CPUs':>4s} {'MHz':>6s}",
    ]
    for q, part in enumerate(np.array_split(order, 4), start=1):
        mean = {name: float(np.nanmean(values[part])) if np.isfinite(values[part]).any() else math.nan
                for name, values in host.items()}  # fmt: skip
        lines.append(
            f"Q{q:<8d} {len(part):5d} {1e3 * wall[part].mean():8.2f} {1e3 * launch[part].mean():9.2f} "
            f"{1e3 * (wall[part] - launch[part]).mean():8.2f} {1e3 * mean['host_cpu_s']:7.2f} "
            f"{mean['host_preemptions']:7.2f} {mean['host_waits']:6.2f} {mean['host_runnable']:8.1f} "
            f"{mean['host_busy_pct']:6.1f} {mean['host_steal_pct']:7.2f} "
            f"{len(set(host['host_cpu_id'][part][np.isfinite(host['host_cpu_id'][part])])):4d} "
            f"{mean['host_cpu_mhz']:6.0f}"
        )
    return lines


def cprofile_report(config, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    run_real(config)
    profiler.disable()
    parts = []
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(top)
        body = text.getvalue()
        parts.append(f"--- by {key} ---\n" + body[body.find("ncalls") :])
    return "\n".join(parts)


def torch_report(config, top: int, steps: int = 0, skip: int = 0, kind: str = "mixed") -> str:
    """torch.profiler over the whole run, or (`steps` > 0) over that many steps of `kind` only,
    after the first `skip` of them: the runner's `run` is wrapped to start and stop it around
    each such step, so steps of other kinds between them stay out of the profile."""
    import torch
    import torch.profiler as tp

    activities = [tp.ProfilerActivity.CPU]
    if config.device.startswith("cuda"):
        activities.append(tp.ProfilerActivity.CUDA)
    prof = tp.profile(activities=activities)
    if not steps:
        with prof:
            run_real(config)
    else:
        original, seen = ModelRunner.run, [0]

        def sync() -> None:  # a step's kernels finish inside its own window
            if torch.cuda.is_available():
                torch.cuda.synchronize()

        def run(self, batch, *args):
            profiled = batch.kind == kind and skip <= seen[0] < skip + steps
            if profiled:
                sync()
                if seen[0] == skip:
                    prof.start()
                else:
                    prof.toggle_collection_dynamic(True, activities)
            try:
                return original(self, batch, *args)
            finally:
                if batch.kind == kind:
                    seen[0] += 1
                if profiled:
                    sync()
                    if seen[0] == skip + steps:
                        prof.stop()
                    else:
                        prof.toggle_collection_dynamic(False, activities)

        ModelRunner.run = run
        try:
            run_real(config)
        finally:
            ModelRunner.run = original
        if seen[0] < skip + steps:
            return f"the run had {seen[0]} {kind} steps, fewer than {skip} + {steps}: nothing profiled"
    events = prof.key_averages()
    parts = [f"--- by self host time ---\n{events.table(sort_by='self_cpu_time_total', row_limit=top)}"]
    if len(activities) > 1:
        device_key = (
            "self_device_time_total"
            if hasattr(events[0], "self_device_time_total")
            else "self_cuda_time_total"
        )
        parts.append(f"--- by self device time ---\n{events.table(sort_by=device_key, row_limit=top)}")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--kv-cache-gib", type=float, help="default: the reproduce GPU setting's")
    parser.add_argument("--engine", default="paged")
    parser.add_argument("--trace", default="sharegpt-paper")
    parser.add_argument("--num-requests", type=int, default=100)
    parser.add_argument("--rate", type=float, default=160.0)
    parser.add_argument("--beam-width", type=int, default=1)
    parser.add_argument("--n", type=int, default=1, help="parallel samples per request")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--profiler", choices=("cprofile", "torch", "none"), default="cprofile")
    warm = "the warm-up trace's requests (default: --num-requests)"
    parser.add_argument("--warm-up-requests", type=int, help=warm)
    parser.add_argument("--top", type=int, default=30)
    only = "torch: only K steps of --profile-kind"
    parser.add_argument("--profile-steps", "--profile-mixed-steps", type=int, default=0, help=only)
    parser.add_argument("--profile-kind", choices=("mixed", "prefill", "decode"), default="mixed")
    after = "torch: after S such steps"
    parser.add_argument("--skip-steps", "--skip-mixed-steps", type=int, default=20, help=after)
    parser.add_argument("--chunked-prefill", action="store_true")
    parser.add_argument("--prefill-graphs", action="store_true", help="short prefills as CUDA graphs")
    parser.add_argument("--emulate-gpu", help="size the budget for this GPU (no preset --kv-cache-gib)")
    parser.add_argument("--window-duration", type=float, help="replay: the trace's first S seconds")
    parser.add_argument("--max-total-len", type=int, help="drop requests longer than this (prompt + output)")
    args = parser.parse_args()
    gib = args.kv_cache_gib
    if gib is None and args.emulate_gpu is None:
        if args.model not in GPU_SETTINGS:
            parser.error(f"--kv-cache-gib: no default for {args.model} (known: {', '.join(GPU_SETTINGS)})")
        gib = GPU_SETTINGS[args.model].kv_cache_gib
    window = {} if args.window_duration is None else {"window_duration_s": args.window_duration}
    longest = {} if args.max_total_len is None else {"max_total_len": args.max_total_len}
    workload = WorkloadSpec(
        args.trace,
        num_requests=args.num_requests or None,
        rate=args.rate or None,
        seed=0,
        n=args.n,
        beam_width=args.beam_width,
        **window,
        **longest,
    )
    gpu = {} if args.emulate_gpu is None else {"emulate_gpu": args.emulate_gpu}
    config = RunConfig(
        args.engine, model=args.model, workload=workload, kv_cache_gib=gib, device=args.device,
        chunked_prefill=args.chunked_prefill, prefill_graphs=args.prefill_graphs,
        collectors="torch,nvml,roofline,host", **gpu,
    )  # fmt: skip
    # warm-up on other prompts: another seed's draw, or a replayed window's next window
    other = replace(workload, seed=1)
    if args.warm_up_requests:
        other = replace(other, num_requests=args.warm_up_requests)
    if args.window_duration is not None:
        other = replace(other, window_start_s=args.window_duration)
    run_real(replace(config, workload=other))
    start = time.perf_counter()
    result, calls = timed_run(config)
    wall = time.perf_counter() - start
    busy = result.summary["busy_s"]
    print(f"{args.engine} on {args.model}, {args.trace} x {args.num_requests} at {args.rate:g} req/s "
          f"(n {args.n}, beams {args.beam_width}): {wall:.2f} s wall, busy {busy:.2f} s")  # fmt: skip
    print("\n".join(step_table(result.run) + rows_table(result.run)))
    print("\n".join(["", *host_table(result, calls, "prefill"), "", *host_table(result, calls, "decode")]))
    if args.profiler == "none":
        return
    if args.profiler == "cprofile":
        report = cprofile_report(config, args.top)
    else:
        report = torch_report(config, args.top, args.profile_steps, args.skip_steps, args.profile_kind)
    window = f", {args.profile_kind} steps {args.skip_steps + 1}-{args.skip_steps + args.profile_steps}"
    print(f"\n{args.profiler} of the same run{window if args.profile_steps else ''}:\n" + report)


if __name__ == "__main__":
    main()
