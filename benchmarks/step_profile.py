"""Where a real run's time goes: prefill and decode steps, and the host functions behind them.

Runs one engine with real decoding twice: first on another seed's trace (it compiles the Triton
kernels and captures the CUDA graphs, without showing cuBLAS this trace's prefill shapes), then
on the trace unprofiled (its step times by kind and by rows per decode step are the honest
ones), then again under a profiler, which slows host-bound code (compare profiles with each
other only):

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
        [--device cuda] [--profiler cprofile|torch] [--top 30]
        [--profile-steps K] [--profile-kind mixed|prefill|decode] [--skip-steps S]
        [--chunked-prefill] [--emulate-gpu GPU] [--window-duration S] [--max-total-len N]

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
import pstats
import time
from dataclasses import replace
from itertools import pairwise

from kvbench.config import RunConfig
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

    from kvbench.real.model_runner import ModelRunner

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
    parser.add_argument("--profiler", choices=("cprofile", "torch"), default="cprofile")
    parser.add_argument("--top", type=int, default=30)
    only = "torch: only K steps of --profile-kind"
    parser.add_argument("--profile-steps", "--profile-mixed-steps", type=int, default=0, help=only)
    parser.add_argument("--profile-kind", choices=("mixed", "prefill", "decode"), default="mixed")
    after = "torch: after S such steps"
    parser.add_argument("--skip-steps", "--skip-mixed-steps", type=int, default=20, help=after)
    parser.add_argument("--chunked-prefill", action="store_true")
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
        chunked_prefill=args.chunked_prefill, **gpu,
    )  # fmt: skip
    # warm-up on other prompts: another seed's draw, or a replayed window's next window
    other = replace(workload, seed=1)
    if args.window_duration is not None:
        other = replace(other, window_start_s=args.window_duration)
    run_real(replace(config, workload=other))
    start = time.perf_counter()
    result = run_real(config)
    wall = time.perf_counter() - start
    busy = result.summary["busy_s"]
    print(f"{args.engine} on {args.model}, {args.trace} x {args.num_requests} at {args.rate:g} req/s "
          f"(n {args.n}, beams {args.beam_width}): {wall:.2f} s wall, busy {busy:.2f} s")  # fmt: skip
    print("\n".join(step_table(result.run) + rows_table(result.run)))
    if args.profiler == "cprofile":
        report = cprofile_report(config, args.top)
    else:
        report = torch_report(config, args.top, args.profile_steps, args.skip_steps, args.profile_kind)
    window = f", {args.profile_kind} steps {args.skip_steps + 1}-{args.skip_steps + args.profile_steps}"
    print(f"\n{args.profiler} of the same run{window if args.profile_steps else ''}:\n" + report)


if __name__ == "__main__":
    main()
