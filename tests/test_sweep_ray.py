"""`kvbench sweep --executor ray` on a real local Ray cluster of 2 CPUs, started by the test.

What it checks: a simulated sweep through Ray writes the same sweep.csv as the
local executor; a cell whose worker process is killed (SIGKILL to the real worker, found by
the process title Ray gives a running task) is run again and the sweep completes, or, with no
retries left, is recorded as failed and `--resume` runs it; a driver killed mid-sweep resumes
without redoing a finished cell.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from kvbench.config import RunConfig
from kvbench.sweep.grid import Axes
from kvbench.sweep.plan import SustainedOptions, SweepPlan
from kvbench.sweep.progress import Progress
from kvbench.sweep.run import run_sweep
from tests.support import sweep_stopped_after_its_first_cell
from tests.test_cli import kvbench
from tests.test_sweep import rows_of
from tests.test_sweep_executor import same_table
from workloads.spec import WorkloadSpec

ray = pytest.importorskip("ray")
from kvbench.sweep.ray_executor import TASK_NAME, RayExecutor  # noqa: E402  (needs ray)

ROOT = Path(__file__).resolve().parent.parent


def quiet() -> Progress:
    return Progress(0, stream=io.StringIO())


def plan(engines, rates, num_requests, repeats=1, bisect=0, threshold=None, **kw) -> SweepPlan:
    axes = Axes(tuple(engines), ("sharegpt-paper",), tuple(rates), (16,), (4.0,), (0,), repeats)
    base = RunConfig("paged", workload=WorkloadSpec(num_requests=num_requests))
    return SweepPlan(axes, base, sustained=SustainedOptions(threshold, bisect=bisect), **kw)


def kill_first_cell_worker(timeout_s: float = 300.0) -> str:
    """SIGKILL the worker process of the first running cell found; its cell id.

    The worker is stopped (SIGSTOP) first and its title read again: a cell that finished between
    the two reads is let go and the search goes on, so the kill always lands on a running cell
    however the machine's load times it. `timeout_s` is only a safety net (a busy 2-core machine
    starts Ray workers slowly)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if not _task_title(pid).startswith(f"ray::{TASK_NAME} "):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGSTOP)
                title = _task_title(pid)
                if title.startswith(f"ray::{TASK_NAME} "):
                    os.kill(int(pid), signal.SIGKILL)
                    return title.split()[-1]
                os.kill(int(pid), signal.SIGCONT)
        time.sleep(0.005)
    raise AssertionError("no running cell found to kill")


def _task_title(pid: str) -> str:
    """The title Ray gives a worker process (its task while it runs one); "" if it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().strip()
    except OSError:
        return ""


def sweep_in_background(*args, **kwargs) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def target():
        try:
            result["value"] = run_sweep(*args, **kwargs)
        except BaseException as error:  # re-raised by the test
            result["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def start_local_cluster(attempts: int = 5) -> None:
    """A local Ray cluster of 2 CPUs. Ray gives its raylet a fixed 30 s of wall time to register
    (ray/_private/node.py, not configurable), which a loaded 2-core machine can miss: that one
    failure is tried again, a few times (the cluster answering is the state awaited)."""
    for attempt in range(attempts):
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
            return
        except Exception as error:
            if "timed out during startup" not in str(error) or attempt == attempts - 1:
                raise
            ray.shutdown()


def test_sweeps_on_a_local_ray_cluster(tmp_path):
    """One test, so one cluster: under pytest-xdist, separate tests could start one per worker."""
    start_local_cluster()
    try:
        same_sweep_as_the_local_executor(tmp_path / "same")
        a_killed_worker_is_retried_or_recorded_and_resumed(tmp_path / "worker")
        a_killed_driver_resumes_without_redoing_a_cell(
            tmp_path / "driver", ray.get_runtime_context().gcs_address
        )
    finally:
        ray.shutdown()


def same_sweep_as_the_local_executor(tmp_path: Path) -> None:
    # baselines, a grid with repeats, and two rounds of bisection (each round one batch)
    p = plan(("paged", "orca-oracle"), (1.0, 4.0), 60, repeats=2, bisect=2)
    local = run_sweep(p, tmp_path / "local", progress=quiet())
    executor = RayExecutor(retries=1)
    through_ray = run_sweep(p, tmp_path / "ray", progress=quiet(), executor=executor)
    assert (through_ray.ran, through_ray.failed) == (local.ran, 0) and local.ran > 2 + 8
    same_table(rows_of(tmp_path / "local" / "sweep.csv"), rows_of(tmp_path / "ray" / "sweep.csv"))
    assert rows_of(tmp_path / "local" / "sustained.csv") == rows_of(tmp_path / "ray" / "sustained.csv")
    for row in rows_of(tmp_path / "ray" / "sweep.csv"):  # every file came back to the driver
        cell = tmp_path / "ray" / "cells" / row["cell_id"]
        assert sorted(f.name for f in cell.iterdir()) == sorted(
            f.name for f in (tmp_path / "local" / "cells" / row["cell_id"]).iterdir()
        )
        assert (cell / "requests.csv").read_text() == (
            tmp_path / "local" / "cells" / row["cell_id"] / "requests.csv"
        ).read_text()
    assert not list((tmp_path / "ray" / "cells").glob(".*"))
    assert "2 CPUs" in executor.describe()


def a_killed_worker_is_retried_or_recorded_and_resumed(tmp_path: Path) -> None:
    out = tmp_path / "s"
    p = plan(("paged", "orca-oracle"), (4.0,), 600, threshold=1.0, continue_on_error=True)
    # no retries: the lost cell is a failed row (never dropped), the other cell finishes
    thread, result = sweep_in_background(p, out, progress=quiet(), executor=RayExecutor(retries=0))
    killed = kill_first_cell_worker()
    thread.join(600)  # a safety net: the sweep ends by itself
    assert not thread.is_alive()
    rows = {r["cell_id"]: r for r in rows_of(out / "sweep.csv")}
    assert "error" not in result and result["value"].failed == 1
    assert rows[killed]["status"] == "failed" and "lost on the Ray cluster" in rows[killed]["error"]
    assert "WorkerCrashedError" in rows[killed]["error"] and not (out / "cells" / killed).exists()
    assert [r["status"] for cid, r in rows.items() if cid != killed] == ["ok"]
    # resumed with a retry: killed again, run again, and the sweep completes
    thread, result = sweep_in_background(
        p, out, resume=True, progress=quiet(), executor=RayExecutor(retries=1)
    )
    assert kill_first_cell_worker() == killed
    thread.join(600)  # a safety net: the sweep ends by itself
    assert not thread.is_alive()
    assert "error" not in result and (result["value"].ran, result["value"].resumed) == (1, 1)
    rows = {r["cell_id"]: r for r in rows_of(out / "sweep.csv")}
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert rows[killed]["completed"] == rows[killed]["num_requests"] != ""


def a_killed_driver_resumes_without_redoing_a_cell(tmp_path: Path, cluster: str) -> None:
    out = tmp_path / "s"
    args = ["sweep", "--engines", "paged", "--rates", "4,8,12,16", "--latency-threshold", "0.1",
            "--kv-cache-gib", "4", "--num-requests", "300", "--executor", "ray", "--ray-address", cluster,
            "--out", str(out)]  # fmt: skip
    sweep_stopped_after_its_first_cell(args, out, ROOT)  # the driver, SIGKILLed after its first cell
    done = {f: f.stat().st_mtime_ns for f in out.glob("cells/*/summary.json")}
    assert len(done) == 1
    resumed = kvbench(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"4 cells ({4 - len(done)} run, {len(done)} resumed, 0 failed)" in resumed.stdout
    assert {f: f.stat().st_mtime_ns for f in done} == done  # not redone
    assert {r["status"] for r in rows_of(out / "sweep.csv")} == {"ok"}
    assert len(list(out.glob("cells/*/summary.json"))) == 4 and not list(out.glob("cells/.*"))
