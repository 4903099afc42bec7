"""Throughput of the sweep executors themselves: many small simulated cells, local and on Ray.

200 cells by default (the five paper engines x 40 rates, `--num-requests` 20 each, OPT-13B,
12 GiB), small enough that what is measured is the executor: handing a cell out, running it,
bringing its files back and writing its folder and sweep.csv on the driver. The same sweep
runs three ways, each into a fresh folder:

- `local`: in order, in this process (the default executor);
- `ray`: one Ray task per cell on a local cluster of `--cpus` CPUs, started first (its start-up
  is printed apart, since a real cluster is started once, not per sweep);
- `local x N` (`--parallel`, off by default): N child processes at once, as `--parallel-gpus N`
  runs real cells (each pays a Python start-up: this is the GPU path, not a CPU one).

Printed per executor: wall time, cells/s and wall ms per cell, and CPU ms per cell: the CPU
time of this process and every process under it (Ray's workers, raylet and GCS, the children
of `--parallel`), read from /proc, so Linux only. Ray's overhead per cell is its extra CPU
time per cell over the in-process loop: unlike a wall-clock difference it does not depend on
how busy the machine is or on how many cores share the work.

    python benchmarks/ray_executor.py [--cells 200] [--num-requests 20] [--cpus 2] [--parallel 2]
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import resource
import tempfile
import time
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.sweep.executor import Executor, LocalExecutor
from kvbench.sweep.grid import PAPER_ENGINES, Axes
from kvbench.sweep.plan import SustainedOptions, SweepPlan
from kvbench.sweep.progress import Progress
from kvbench.sweep.run import run_sweep
from workloads.spec import WorkloadSpec


def sweep_plan(cells: int, num_requests: int) -> SweepPlan:
    engines = PAPER_ENGINES
    rates = tuple(float(r) for r in range(1, -(-cells // len(engines)) + 1))
    axes = Axes(engines, ("sharegpt-paper",), rates, (16,), (12.0,), (0,))
    base = RunConfig("paged", workload=WorkloadSpec(num_requests=num_requests))
    # a fixed threshold: no baseline cells, so exactly engines x rates cells
    return SweepPlan(axes, base, sustained=SustainedOptions(threshold_s=1.0))


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process, its live descendants (from /proc) and its
    children that ended (`--parallel`'s, which `getrusage` counts once they are waited for)."""
    parent, cpu = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        pid = frontier.pop()
        for child in (c for c, p in parent.items() if p == pid and c not in tree):
            tree.add(child)
            frontier.append(child)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return sum(cpu.get(pid, 0.0) for pid in tree) + ended.ru_utime + ended.ru_stime


def timed(plan: SweepPlan, out: Path, executor: Executor) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the process tree, cells run)."""
    cpu, start = tree_cpu_seconds(), time.perf_counter()
    result = run_sweep(plan, out, progress=Progress(0, stream=io.StringIO()), executor=executor)
    wall = time.perf_counter() - start
    assert result.failed == 0, [r["error"] for r in result.rows if r["status"] == "failed"]
    return wall, tree_cpu_seconds() - cpu, result.ran


def line(name: str, wall: float, cpu: float, cells: int) -> None:
    print(f"{name:<12} {wall:9.2f} {cells / wall:8.1f} {1e3 * wall / cells:10.1f} {1e3 * cpu / cells:10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--num-requests", type=int, default=20)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    parser.add_argument("--parallel", type=int, default=0, help="also time the local executor with N slots")
    args = parser.parse_args()
    import ray

    from kvbench.sweep.ray_executor import RayExecutor

    plan = sweep_plan(args.cells, args.num_requests)
    with tempfile.TemporaryDirectory(prefix="kvbench-bench-") as tmp:
        local = timed(plan, Path(tmp) / "local", LocalExecutor())
        start = time.perf_counter()
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, logging_level=logging.WARNING)
        started_s = time.perf_counter() - start
        executor = RayExecutor()
        try:
            timed(plan, Path(tmp) / "warm-up", executor)  # the first tasks start worker processes
            on_ray = timed(plan, Path(tmp) / "ray", executor)
        finally:
            ray.shutdown()
        parallel = None
        if args.parallel > 1:
            parallel = timed(plan, Path(tmp) / "parallel", LocalExecutor(gpus=args.parallel))
    cells = local[2]
    print(f"{cells} simulated cells of {args.num_requests} requests; Ray cluster: {args.cpus} CPUs")
    print(f"{'executor':<12} {'wall s':>9} {'cells/s':>8} {'wall ms':>10} {'CPU ms':>10}  (per cell)")
    line("local", *local)
    line("ray", *on_ray)
    if parallel is not None:
        line(f"local x {args.parallel}", *parallel)
    print(
        f"Ray overhead per cell: {1e3 * (on_ray[1] - local[1]) / cells:+.1f} ms of CPU over the in-process "
        f"loop; wall {1e3 * (on_ray[0] - local[0] / args.cpus) / cells:+.1f} ms per cell over an ideal "
        f"{args.cpus}-way split of it; cluster start {started_s:.1f} s, once"
    )


if __name__ == "__main__":
    main()
