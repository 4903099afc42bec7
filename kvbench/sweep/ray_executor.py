"""Sweep cells as Ray tasks, on a cluster of machines or a local one started for the sweep.

Each cell is one task that asks for one CPU and, for a real cell on `--device cuda`, one GPU
(Ray then sets the task's `CUDA_VISIBLE_DEVICES`, so `cuda` is that GPU). The task runs the
cell with `run_cell` into a temporary folder on whichever node it lands on and returns the
folder's files as bytes with the outcome: the nodes need not share a filesystem with the
driver. The driver writes them into `cells/<id>` atomically (`write_run_atomically`), so a
cell folder means the same as a local one and `--resume` works across executors.

Failures, told apart the way the sweep needs:
- the cell's own (a `KvbenchError`, out of memory): `run_cell` returns them as an outcome,
  the task succeeds, nothing is retried; the sweep records it as with a local cell;
- the worker process or its node lost (killed, crashed, a node gone): Ray runs the task again
  up to `retries` times (the task's `max_retries`); after that the driver gets a
  `WorkerCrashedError`, `NodeDiedError`, ... and records the cell as failed, saying so, so a
  lost cell is never dropped silently (and `--resume` runs it again);
- anything else raised in the task is a kvbench bug: Ray's `RayTaskError` is raised on the
  driver with the remote traceback.

Real cells run in a fresh worker process each (`max_calls=1`), the cluster's `--isolate`:
a cell that leaks GPU memory cannot poison the next one. Simulated cells reuse workers.
Ray is imported only here, and only when this executor is made.
"""

from __future__ import annotations

import logging
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath

from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.results.files import write_run_atomically
from kvbench.sweep.cell import CellRun, Outcome, run_cell
from kvbench.sweep.executor import CellJob, Started

INSTALL = "pip install 'kvbench[ray]'"
TASK_NAME = "kvbench-cell"  # a running cell's worker process is titled `ray::kvbench-cell <id>`


def import_ray():
    try:
        import ray
    except ImportError:
        raise KvbenchError(f"--executor ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, with one line, where no cluster listens at `address`.

    `ray.init` itself keeps retrying an address that does not answer for minutes.
    """
    if address == "auto":  # the cluster `ray start` started on this machine; ray.init fails fast
        return
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not host or not port.isdigit():
        raise KvbenchError(f"--ray-address: {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        why = error.strerror or str(error) or type(error).__name__
        raise KvbenchError(
            f"--ray-address {address}: no Ray cluster answers there ({why}); "
            "start one with `ray start --head` or check the address"
        ) from None


def cell_task(config: RunConfig, how: CellRun) -> tuple[Outcome, dict[str, bytes]]:
    """On a worker: run the cell in a temporary folder; its outcome and its files' contents."""
    with tempfile.TemporaryDirectory(prefix="kvbench-cell-") as tmp:
        out = Path(tmp) / "cell"
        outcome = run_cell(config, out, how)
        files = {}
        if outcome.ok:
            files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    return outcome, files


def write_files(out: Path, files: dict[str, bytes]) -> None:
    """A cell's files, as a worker returned them, made to appear at `out` all at once.

    The names come over the network from another machine: each must name a file inside the
    cell's folder (`check_name`), or nothing is written.
    """
    for name in files:
        check_name(out, name)

    def write(tmp: Path) -> None:
        root = tmp.resolve()
        for name, data in files.items():
            target = tmp / name
            if not target.resolve().is_relative_to(root):  # e.g. through a link: never followed out
                raise KvbenchError(f"cell {out.name}: the file name {name!r} leaves the cell's folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    write_run_atomically(out, write)


def check_name(out: Path, name: object) -> None:
    """A worker's file name must be a relative path inside the cell folder `out`: no absolute
    path, drive or `..`; one line naming the cell otherwise."""
    why = _name_problem(out, name)
    if why:
        raise KvbenchError(f"cell {out.name}: the Ray worker returned a file name {name!r}, which {why}")


def _name_problem(out: Path, name: object) -> str:
    if not isinstance(name, str) or not name or "\0" in name:
        return "is not a file name"
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).anchor:
        return "is an absolute path"
    if ".." in PurePosixPath(name).parts or ".." in PureWindowsPath(name).parts:
        return "contains '..'"
    target, root = (out / name).resolve(), out.resolve()
    return "leaves the cell's folder" if target == root or not target.is_relative_to(root) else ""


def _needs_gpu(job: CellJob) -> bool:
    return job.how.real and job.config.device.startswith("cuda")


class RayExecutor:
    """Connects on creation (or reuses this process's Ray connection); `close` disconnects."""

    def __init__(self, address: str | None = None, retries: int = 3) -> None:
        ray = import_ray()
        if address is not None:
            check_address(address)
        self.ray, self.address, self.retries = ray, address, retries
        self.owns_connection = not ray.is_initialized()
        if self.owns_connection:
            try:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            except (ConnectionError, RuntimeError) as error:  # no cluster there; versions differ
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise KvbenchError(f"--executor ray ({address or 'local'}): {first}") from None
        # real cells: a fresh worker process each (max_calls=1); simulated: workers are reused
        self.tasks = {False: ray.remote(cell_task), True: ray.remote(max_calls=1)(cell_task)}

    def describe(self) -> str:
        resources = self.ray.cluster_resources()
        nodes = sum(1 for node in self.ray.nodes() if node.get("Alive"))
        where = self.address or self.ray.get_runtime_context().gcs_address
        return (
            f"ray ({where}): {nodes} node(s), {resources.get('CPU', 0):g} CPUs, "
            f"{resources.get('GPU', 0):g} GPUs; a lost cell is retried {self.retries}x"
        )

    def close(self) -> None:
        if self.owns_connection and self.ray.is_initialized():
            self.ray.shutdown()

    def run(self, jobs: Sequence[CellJob], started: Started) -> Iterator[tuple[CellJob, Outcome]]:
        """Submit every job at once (the cluster schedules them); yield each as it finishes."""
        ray = self.ray
        if any(map(_needs_gpu, jobs)) and not ray.cluster_resources().get("GPU"):
            # such a task would wait for a GPU forever
            raise KvbenchError("the Ray cluster has no GPU for these cells: start its GPU nodes first")
        pending: dict = {}  # ObjectRef -> (job, submitted at)
        try:
            for job in jobs:
                task = self.tasks[job.how.real].options(
                    num_cpus=1,
                    num_gpus=int(_needs_gpu(job)),
                    max_retries=self.retries,
                    retry_exceptions=False,  # a cell's own error is an outcome, never retried
                    name=f"{TASK_NAME} {job.cell_id}",
                )
                pending[task.remote(job.config, job.how)] = (job, time.perf_counter())
                started(job)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    job, submitted = pending.pop(ref)
                    yield job, self._gather(ref, job, submitted)
        finally:
            for ref in pending:  # stopped early: cancel what has not finished
                ray.cancel(ref, force=True)

    def _gather(self, ref, job: CellJob, submitted: float) -> Outcome:
        try:
            outcome, files = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError:
            raise  # the cell raised something no cell should: a kvbench bug, with its traceback
        except self.ray.exceptions.RayError as error:  # worker or node lost, after every retry
            first = (str(error).strip().splitlines() or [""])[0]
            why = f"lost on the Ray cluster, {self.retries} retries spent ({type(error).__name__}: {first})"
            return Outcome(False, None, why, time.perf_counter() - submitted)
        if outcome.ok:
            try:
                write_files(job.out, files)
            except KvbenchError as error:  # a name that would leave the cell folder: nothing written
                return Outcome(False, None, str(error), outcome.wall_s)
        return outcome
