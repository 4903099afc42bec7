"""vmm decoding for real over CUDA virtual memory, beside orca-oracle and paged.

Two workloads, each through every variant with the same model and weights, all requests
arriving at once, greedy:

- the reference workload (`benchmarks/real_decode.py`'s `reference_trace`: 256 requests,
  `llama-1b-ref`, bf16, random weights), `--kv-cache-gib 8`;
- OPT-13B (random weights, bf16) on `--opt-requests` ShareGPT-like requests (the
  `sharegpt-paper` preset, prompt + output at most 2,048), `--opt-kv-cache-gib 12`.

Variants: `orca-oracle` and `paged` over a plain arena; `vmm:<layout>:<map>` over a
`VirtualKVArena` whose pages are mapped through the driver as the allocator holds them (map
`sync`: just before the step that needs them, inside its time; `ahead`: while the previous
segment runs). Throughput is output tokens over the engine loop's wall time (runner setup,
which captures the CUDA graphs, is before it and reported apart). Per vmm variant: page
groups mapped and unmapped, those mapped (and idle ones reclaimed) ahead, and the seconds spent
in driver calls, in all and inside the measured steps. Every
variant's tokens are compared with orca-oracle's (bf16: a different batch composition may
legitimately flip a near tie, so differing requests are counted, not fatal).

    PYTHONPATH=. python benchmarks/vmm_real.py --out results/vmm-real [--opt-requests 300]
        [--variants orca-oracle,paged,vmm:per-layer:sync,vmm:per-layer:ahead] [--skip-opt]

Writes `<out>/vmm_real.json` and prints a table per workload. About 4 minutes on one H200.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable without PYTHONPATH too

from benchmarks.real_decode import reference_trace
from engines import ENGINES, EngineOptions
from kvbench.engine import Engine
from kvbench.gc_pause import gc_paused
from kvbench.modeling.arena import KVArena
from kvbench.modeling.virtual_arena import VirtualKVArena
from kvbench.modeling.weights import random_model
from kvbench.models import ModelSpec, get_model
from kvbench.real.model_runner import ModelRunner
from kvbench.requests import Request, Trace
from kvbench.results.files import write_json
from kvbench.vmm.pages import DEFAULT_PAGE_KIB, page_geometry
from workloads.spec import WorkloadSpec, build_trace

DEFAULT_VARIANTS = "orca-oracle,paged,vmm:per-layer:sync,vmm:per-layer:ahead"


def sharegpt_trace(num: int, max_len: int) -> Trace:
    """The `sharegpt-paper` lengths (seed 0), every request arriving at 0."""
    spec = WorkloadSpec("sharegpt-paper", num_requests=num, rate=1.0, max_total_len=max_len)
    lengths = [(r.prompt_len, r.output_len) for r in build_trace(spec).requests]
    requests = tuple(Request(i, 0.0, prompt, output) for i, (prompt, output) in enumerate(lengths))
    return Trace(f"sharegpt-paper-{num}", requests)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(
    variant: str, model, spec: ModelSpec, trace: Trace, kv_gib: float, plain: KVArena, page_kib: int
) -> dict:
    engine, _, rest = variant.partition(":")
    layout, _, vmm_map = rest.partition(":")
    layout, vmm_map = layout or "per-layer", vmm_map or "sync"
    budget = int(kv_gib * 2**30)
    num_slots = budget // spec.kv_bytes_per_token
    options = EngineOptions(num_slots=num_slots, max_len=spec.max_len)
    if engine == "vmm":
        pages = page_geometry(spec, budget, layout, page_kib)
        options = EngineOptions(
            num_slots=num_slots, max_len=spec.max_len, page_tokens=pages.page_tokens,
            num_pages=pages.num_pages,
        )  # fmt: skip
    sched = ENGINES[engine].build(options)
    device = plain.k.device
    arena = plain
    if engine == "vmm":
        arena = VirtualKVArena.for_allocator(spec, sched.allocator, layout, plain.k.dtype, device)
    max_len = max(r.kv_len for r in trace.requests) + 1
    try:
        setup = time.perf_counter()
        runner = ModelRunner(
            model, arena, sched.allocator, max_batch=len(trace), max_len=max_len, vmm_map=vmm_map
        )  # fmt: skip
        setup = time.perf_counter() - setup
        synchronize(device)
        with gc_paused(collect=True):
            start = time.perf_counter()
            run = Engine(sched, runner).run(trace)
            synchronize(device)
            wall = time.perf_counter() - start
        out = sum(r.output_len for r in trace.requests)
        row = {
            "variant": variant, "wall_s": wall, "output_tokens_per_s": out / wall, "runner_setup_s": setup,
            "steps": sum(s.num_steps for s in run.steps), "engine_calls": len(run.steps),
            "preemptions": sum(s.num_preemptions for s in run.sequences), "peak_running": run.peak_running,
            "cuda_graphs": runner.cuda_graphs, "attention": runner.backend,
        }  # fmt: skip
        if engine == "vmm":
            row.update(arena.stats())
            row.update(
                page_tokens=float(sched.allocator.page_tokens), num_pages=sched.allocator.num_pages,
                allocator_maps=sched.allocator.maps, allocator_reused=sched.allocator.reused,
                map_share=arena.map_s / wall,
            )  # fmt: skip
            buffer = getattr(arena._pages, "buffer", None)  # the driver's counts (CUDA only)
            if buffer is not None:
                row.update(driver_maps=buffer.maps, driver_unmaps=buffer.unmaps, creates=buffer.creates)
        row["tokens"] = [s.output_ids for s in run.sequences]
        del runner
        return row
    finally:
        if arena is not plain:
            synchronize(device)
            arena.close()


def workload(name: str, spec: ModelSpec, trace: Trace, kv_gib: float, args: argparse.Namespace) -> dict:
    out = sum(r.output_len for r in trace.requests)
    mean_in = np.mean([r.prompt_len for r in trace.requests])
    mean_out = np.mean([r.output_len for r in trace.requests])
    print(f"\n== {name}: {spec.name}, {len(trace)} requests, mean {mean_in:.0f} in / {mean_out:.0f} out, "
          f"{out} output tokens, KV {kv_gib} GiB", flush=True)  # fmt: skip
    build = time.perf_counter()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # CPU: a smoke test
    model = random_model(spec, dtype, device, seed=0)
    plain = KVArena(spec, int(kv_gib * 2**30) // spec.kv_bytes_per_token, dtype, device)
    print(f"model and arena built in {time.perf_counter() - build:.1f} s", flush=True)
    rows = []
    for variant in args.variants.split(","):
        row = run_variant(variant, model, spec, trace, kv_gib, plain, args.page_kib)
        rows.append(row)
        print(f"  {variant}: {row['output_tokens_per_s']:.0f} tok/s in {row['wall_s']:.2f} s", flush=True)
    reference = next((r["tokens"] for r in rows if r["variant"] == "orca-oracle"), rows[0]["tokens"])
    for row in rows:
        tokens = row.pop("tokens")
        row["requests_differing_from_oracle"] = sum(a != b for a, b in zip(tokens, reference, strict=True))
    print_table(rows)
    del model, plain
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"model": spec.name, "requests": len(trace), "output_tokens": out, "kv_gib": kv_gib, "rows": rows}


def print_table(rows: list[dict]) -> None:
    """`ahead` maps/unmaps/lost: pages mapped and idle pages reclaimed early, and pages mapped
    early that another sequence's growth took before they were written; `in-step ms`: the
    driver calls' time left inside the measured steps (all of it under sync)."""
    head = f"{'variant':<22}{'tok/s':>9}{'wall s':>8}{'steps':>7}{'preempt':>8}{'maps':>7}{'unmaps':>7}" \
           f"{'ahead':>14}{'map ms':>9}{'in-step ms':>11}{'map %':>7}{'differ':>7}"  # fmt: skip
    print(head)
    for r in rows:
        if "vmm_maps" in r:
            ahead = f"{r['vmm_ahead_maps']}/{r['vmm_ahead_unmaps']}/{r['vmm_ahead_lost']}"
            cells = (
                f"{r['vmm_maps']:>7}{r['vmm_unmaps']:>7}{ahead:>14}{1e3 * r['vmm_map_s']:>9.1f}"
                f"{1e3 * (r['vmm_map_s'] - r['vmm_ahead_map_s']):>11.1f}{100 * r['map_share']:>7.2f}"
            )
        else:
            cells = f"{'-':>7}{'-':>7}{'-':>14}{'-':>9}{'-':>11}{'-':>7}"
        print(f"{r['variant']:<22}{r['output_tokens_per_s']:>9.0f}{r['wall_s']:>8.2f}{r['steps']:>7}"
              f"{r['preemptions']:>8}{cells}{r['requests_differing_from_oracle']:>7}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for vmm_real.json (created)")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="engines; vmm:<layout>:<sync|ahead>")
    parser.add_argument("--kv-cache-gib", type=float, default=8.0, help="the reference workload's budget")
    parser.add_argument("--num-requests", type=int, default=256, help="the reference workload's requests")
    parser.add_argument("--opt-requests", type=int, default=300)
    parser.add_argument("--opt-kv-cache-gib", type=float, default=12.0)
    parser.add_argument("--skip-opt", action="store_true", help="the reference workload only")
    parser.add_argument("--page-kib", type=int, default=DEFAULT_PAGE_KIB, help="vmm page (driver's: 2048)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (emulated arena)")
    parser.add_argument("--ref-model", default="llama-1b-ref")
    parser.add_argument("--opt-model", default="opt-13b")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: this benchmark maps CUDA virtual memory: it needs a CUDA device (or --device cpu)")
    for variant in args.variants.split(","):
        engine = variant.partition(":")[0]
        if engine not in ENGINES:
            sys.exit(f"error: --variants: unknown engine {engine!r} in {variant!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
    results = {"gpu": gpu, "torch": torch.__version__, "args": vars(args), "workloads": {}}
    ref = get_model(args.ref_model)
    results["workloads"]["reference"] = workload(
        "reference", ref, reference_trace(args.num_requests), args.kv_cache_gib, args
    )
    write_json(out / "vmm_real.json", results)  # the first half survives a failure in the second
    if not args.skip_opt:
        opt = get_model(args.opt_model)
        trace = sharegpt_trace(args.opt_requests, opt.max_len)
        results["workloads"]["opt-sharegpt"] = workload(opt.name, opt, trace, args.opt_kv_cache_gib, args)
    results["total_s"] = time.perf_counter() - start
    write_json(out / "vmm_real.json", results)
    print(f"\nwrote {out / 'vmm_real.json'} ({results['total_s']:.0f} s in all)")


if __name__ == "__main__":
    main()
