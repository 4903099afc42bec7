"""Where a sweep's cells run: the `Executor` seam, and the executor of this machine.

A sweep hands its executor one *batch* of independent cells at a time (the baseline and grid
cells together, then each round of bisection, whose rates follow from the rounds before) and
reads the outcomes back as the cells finish, in whatever order they finish. What makes the
executors interchangeable is one contract:

- when `run` yields a job with an ok outcome, `job.out` holds the cell's finished folder,
  made to appear at once (`write_result`'s temporary folder and rename); a failed cell leaves
  no folder;
- a failure the sweep can record (a `KvbenchError`, running out of memory, a child process or
  a cluster worker lost for good) comes back as an outcome with `ok=False`; anything else is
  a kvbench bug and raises;
- closing the iterator early (the sweep stops at a failed cell, or is interrupted) hands out
  no further cell.

`LocalExecutor` runs cells on this machine: one at a time in this process (the default), or,
with `gpus > 1`, that many at once, each in its own `kvbench simulate|run` process that sees
only its own GPU through `CUDA_VISIBLE_DEVICES`, so two cells never share a device and one
that crashes takes only its own process down. `kvbench.sweep.ray_executor.RayExecutor` runs them as
tasks on a Ray cluster.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.sweep.cell import CellRun, Outcome, run_cell


@dataclass(frozen=True)
class CellJob:
    """One cell as an executor sees it: everything needed to run it, and where it must end up."""

    cell_id: str
    config: RunConfig
    out: Path  # <sweep>/cells/<cell_id>
    how: CellRun


Started = Callable[[CellJob], None]  # told when a job is handed to a worker (the progress line)


class Executor(Protocol):
    def run(self, jobs: Sequence[CellJob], started: Started) -> Iterator[tuple[CellJob, Outcome]]:
        """Run `jobs`, yielding each with its outcome as it finishes (the contract above)."""
        ...

    def describe(self) -> str:
        """Where cells run, in a few words (sweep.json's `executor`)."""
        ...

    def close(self) -> None:
        """Give back what the executor holds (a Ray cluster started for the sweep)."""
        ...


def gpu_devices(count: int, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The first `count` GPUs this process may use, as `CUDA_VISIBLE_DEVICES` entries.

    Where `CUDA_VISIBLE_DEVICES` is set, its entries (indices or UUIDs), so a sweep limited
    to GPUs 2,3 hands out exactly those; otherwise indices 0..count-1.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(count)]
    ids = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if len(ids) < count:
        raise KvbenchError(
            f"--parallel-gpus {count}: CUDA_VISIBLE_DEVICES={visible!r} leaves only {len(ids)} GPU(s)"
        )
    return ids[:count]


@dataclass(frozen=True)
class LocalExecutor:
    """Cells on this machine: in order in this process, or `gpus` at once, one per GPU."""

    gpus: int = 1

    def describe(self) -> str:
        return "local" if self.gpus == 1 else f"local, {self.gpus} cells at once (one GPU each)"

    def close(self) -> None:
        pass

    def run(self, jobs: Sequence[CellJob], started: Started) -> Iterator[tuple[CellJob, Outcome]]:
        if self.gpus == 1:
            for job in jobs:
                started(job)
                yield job, run_cell(job.config, job.out, job.how)
        else:
            yield from self._in_parallel(jobs, started)

    def _in_parallel(self, jobs: Sequence[CellJob], started: Started) -> Iterator[tuple[CellJob, Outcome]]:
        """Each job in a child process pinned to a free GPU; the next one starts when a GPU frees.

        Jobs are handed out only as GPUs free up (not queued all at once), so `started` is
        called when a cell really starts, and stopping early leaves nothing queued: the cells
        already running finish into their folders, which a later `--resume` finds.
        """
        waiting = deque(jobs)
        running: dict[Future, tuple[CellJob, str]] = {}
        free = gpu_devices(self.gpus)
        with ThreadPoolExecutor(max_workers=self.gpus, thread_name_prefix="kvbench-cell") as pool:
            while waiting or running:
                while waiting and free:
                    job, device = waiting.popleft(), free.pop(0)
                    started(job)
                    running[pool.submit(_on_device, job, device)] = (job, device)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    job, device = running.pop(future)
                    free.append(device)
                    yield job, future.result()


def _on_device(job: CellJob, device: str) -> Outcome:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device}
    return run_cell(job.config, job.out, replace(job.how, isolate=True), env=env)
