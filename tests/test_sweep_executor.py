"""The executor seam: several cells at once on this machine, bisection in batches, the flags.

The parallel path runs real simulated cells in real child processes; which GPU each child was
given is read from the child's own environment (/proc/<pid>/environ) while it runs, so the
scheduling is checked on a machine without GPUs and without faking any of it.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from kvbench.sweep.cell import Outcome
from kvbench.sweep.executor import CellJob, LocalExecutor, Started, gpu_devices
from kvbench.sweep.plan import SustainedOptions
from kvbench.sweep.run import run_sweep
from tests.support import proc_state
from tests.test_cli import kvbench
from tests.test_sweep import plan, quiet, rows_of

ROOT = Path(__file__).resolve().parent.parent


def same_table(a: list[dict], b: list[dict]) -> None:
    """Equal row for row and text for text, but for the wall times and a float's last bit.

    kvbench's pooled means (`np.dot` through BLAS) can differ in the last bit between two runs
    of one cell, even in one process: the kernel's path depends on the arrays' alignment.
    """
    assert [r["cell_id"] for r in a] == [r["cell_id"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x.keys() - {"wall_s"}:
            if x[key] != y[key]:
                assert math.isclose(float(x[key]), float(y[key]), rel_tol=1e-13), (x["cell_id"], key)


def test_gpu_devices_follow_cuda_visible_devices():
    assert gpu_devices(2, {}) == ["0", "1"]
    assert gpu_devices(2, {"CUDA_VISIBLE_DEVICES": "3, 5,6"}) == ["3", "5"]
    assert gpu_devices(1, {"CUDA_VISIBLE_DEVICES": "GPU-1a2b"}) == ["GPU-1a2b"]
    with pytest.raises(KvbenchError, match=r"^--parallel-gpus 2: CUDA_VISIBLE_DEVICES='4' leaves only 1 GPU"):
        gpu_devices(2, {"CUDA_VISIBLE_DEVICES": "4"})


class ChildWatch:
    """Samples the running cell processes under `cells` and the GPU each sees.

    A sample maps each cell seen (its folder, so a fork of a cell, such as the moment before
    `git` replaces it, counts once) to its GPU; a process counts while it is not a zombie (a
    finished child its parent has not reaped: its GPU is already being handed on).

    To see two cells at once without racing them, the watch stops (SIGSTOP) each cell process it
    finds until `hold` cells are stopped together, records that sample and lets them all go on
    (SIGCONT): an executor that runs cells one at a time never shows two, however fast or loaded
    the machine is. `hold_s` is only a safety net: past it the stopped cells go on regardless.
    """

    def __init__(self, cells: Path, hold: int = 2, hold_s: float = 120.0) -> None:
        self.cells, self.samples, self.stop = str(cells), [], threading.Event()
        self.hold, self.hold_s, self.held_since = hold, hold_s, None
        self.stopped: set[int] = set()
        self.thread = threading.Thread(target=self._watch)
        self.thread.start()

    def _scan(self) -> dict[str, tuple[int, str]]:
        """Cell folder -> (a pid, its CUDA_VISIBLE_DEVICES) of every live cell process."""
        seen = {}
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                env = dict(
                    item.split(b"=", 1)
                    for item in (proc / "environ").read_bytes().split(b"\0")
                    if b"=" in item
                )
            except OSError:
                continue
            folders = [a.decode() for a in argv if a.decode(errors="replace").startswith(self.cells)]
            if b"kvbench" in argv and folders:  # python -m kvbench run|simulate ...
                seen[folders[0]] = int(proc.name), env.get(b"CUDA_VISIBLE_DEVICES", b"").decode()
        # a scan takes a while: keep the processes still alive after it, alive together now
        return {
            cell: (pid, gpu) for cell, (pid, gpu) in seen.items() if proc_state(pid) not in (None, "Z", "X")
        }

    def _watch(self) -> None:
        while not self.stop.is_set():
            seen = self._scan()
            self._hold(seen)
            if seen:
                self.samples.append({cell: gpu for cell, (_, gpu) in seen.items()})
            time.sleep(0.005)

    def _hold(self, seen: dict[str, tuple[int, str]]) -> None:
        """Stop newly seen cells until `hold` are stopped at once (or `hold_s` passed), then resume."""
        if not self.hold:
            return
        for pid, _ in seen.values():
            if pid not in self.stopped:
                with contextlib.suppress(ProcessLookupError):  # it may have just ended
                    os.kill(pid, signal.SIGSTOP)
                self.stopped.add(pid)
                self.held_since = self.held_since or time.monotonic()
        late = self.held_since is not None and time.monotonic() - self.held_since > self.hold_s
        if len(seen) >= self.hold or late:
            self._resume()
            self.hold = 0

    def _resume(self) -> None:
        for pid in self.stopped:
            with contextlib.suppress(ProcessLookupError):  # a cell may be killed meanwhile
                os.kill(pid, signal.SIGCONT)
        self.stopped.clear()

    def close(self) -> list[dict[str, str]]:
        self.stop.set()
        self.thread.join()
        self._resume()
        return self.samples


def test_several_cells_at_once_one_gpu_each_give_the_same_sweep(tmp_path, monkeypatch):
    # orca-max cannot fit 1 GiB of OPT-13B KV: failed cells come back from children too
    p = plan(engines=("orca-max", "paged"), rates=(1.0, 2.0), kv=(1.0,), continue_on_error=True)
    one = run_sweep(p, tmp_path / "one", progress=quiet())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")  # the children get these, one each
    watch = ChildWatch(tmp_path / "two" / "cells")
    try:
        two = run_sweep(p, tmp_path / "two", progress=quiet(), executor=LocalExecutor(gpus=2))
    finally:
        samples = watch.close()
    assert (two.ran, two.failed) == (one.ran, one.failed) == (4, 2)
    same_table(rows_of(tmp_path / "one" / "sweep.csv"), rows_of(tmp_path / "two" / "sweep.csv"))
    assert samples, "no cell process was seen"
    assert all(len(set(s.values())) == len(s) <= 2 for s in samples)  # never two cells on one GPU
    assert {gpu for s in samples for gpu in s.values()} == {"5", "7"}
    assert max(len(s) for s in samples) == 2  # and both GPUs busy at once


class CountingExecutor:
    """The local executor, noting the size of every batch the sweep hands it."""

    def __init__(self) -> None:
        self.inner, self.sizes = LocalExecutor(), []

    def run(self, jobs: Sequence[CellJob], started: Started) -> Iterator[tuple[CellJob, Outcome]]:
        self.sizes.append(len(jobs))
        return self.inner.run(jobs, started)

    def describe(self) -> str:
        return "local, counting batches"

    def close(self) -> None:
        pass


def test_bisection_hands_every_groups_next_midpoint_over_in_one_batch(tmp_path):
    # two engines, two repeats, two rounds: each round is one batch of 2 engines x 2 repeats
    p = plan(engines=("paged", "orca-max"), rates=(0.5, 16.0), num_requests=150, kv=(12.0,), repeats=2,
             sustained=SustainedOptions(bisect=2))  # fmt: skip
    batches = CountingExecutor()
    result = run_sweep(p, tmp_path / "s", progress=quiet(), executor=batches)
    assert batches.sizes == [2 + 8, 4, 4] and result.ran == 18
    rows = rows_of(tmp_path / "s" / "sweep.csv")
    assert [r["role"] for r in rows] == ["baseline"] * 2 + ["grid"] * 8 + ["bisect"] * 8
    # as a cell-by-cell search writes it: each engine's bisection rows together, in the order run
    bisected = [(r["engine"], r["repeat"]) for r in rows[10:]]
    assert bisected == [(e, rep) for e in ("paged", "orca-max") for _ in range(2) for rep in ("0", "1")]
    table = rows_of(tmp_path / "s" / "sustained.csv")
    assert [(r["bisect_cells"], r["how"].endswith("(bisected 2x)")) for r in table] == [("4", True)] * 2
    # resumed: the search asks for the same midpoints, all found finished; nothing to hand out
    again = CountingExecutor()
    resumed = run_sweep(p, tmp_path / "s", resume=True, progress=quiet(), executor=again)
    assert (resumed.ran, resumed.resumed, again.sizes) == (0, 18, [])
    assert rows_of(tmp_path / "s" / "sustained.csv") == table


def test_groups_bisecting_to_different_midpoints_still_share_each_rounds_batch(tmp_path):
    """Orca (Max) passes 0.1 and fails 2 req/s under 0.06 s/token and bisects up from 1.05;
    static fails at 1.05 and bisects down: their second midpoints differ, and each round is
    still one batch of both (not one group's midpoint, then the other's)."""
    p = plan(engines=("orca-max", "static"), rates=(0.1, 2.0), num_requests=60, kv=(12.0,),
             sustained=SustainedOptions(threshold_s=0.06, bisect=2))  # fmt: skip
    batches = CountingExecutor()
    result = run_sweep(p, tmp_path / "s", progress=quiet(), executor=batches)
    assert batches.sizes == [4, 2, 2]  # the grid, then each round: both groups' midpoints
    bisected = {(r["engine"], round(r["rate"], 4)) for r in result.rows if r["role"] == "bisect"}
    assert bisected == {("orca-max", 1.05), ("orca-max", 1.525), ("static", 1.05), ("static", 0.575)}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--executor", "foo"), "error: --executor must be local or ray, got 'foo'"),
        (("--ray-address", "127.0.0.1:1"), "error: --ray-address needs --executor ray"),
        (("--parallel-gpus", "0"), "error: --parallel-gpus must be a positive integer up to 2147483647"),
        (("--executor", "ray", "--parallel-gpus", "2"), "error: --parallel-gpus is the local executor's"),
        (
            ("--executor", "ray", "--ray-retries", "-1"),
            "error: --ray-retries must be an integer in 0..1000, got -1",
        ),
        (("--real", "--parallel-gpus", "2", "--device", "cuda:1"), "error: --device cuda:1: each cell gets"),
    ],
)
def test_bad_executor_flags_are_one_line(tmp_path, args, message):
    proc = kvbench("sweep", "--num-requests", "5", *args, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(message)
    assert not (tmp_path / "x").exists()


def test_without_ray_the_ray_executor_says_how_to_install_it(tmp_path):
    hide_ray = "import sys; sys.modules['ray'] = None; from kvbench.cli.app import main; main()"
    argv = ["kvbench", "sweep", "--num-requests", "5", "--executor", "ray", "--out", str(tmp_path / "x")]
    proc = subprocess.run(
        [sys.executable, "-c", hide_ray, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        "error: --executor ray needs Ray, which is not installed: pip install 'kvbench[ray]'"
    )


def test_an_unreachable_ray_address_is_one_line_in_seconds(tmp_path):
    pytest.importorskip("ray")
    # "in seconds" without timing it: the message is kvbench's own probe (a refused connection),
    # not Ray's connection retries; the helper's subprocess timeout is the safety net
    proc = kvbench("sweep", "--num-requests", "5", "--executor", "ray", "--ray-address", "127.0.0.1:1",
                   "--out", str(tmp_path / "x"))  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("error: --ray-address 127.0.0.1:1: no Ray cluster answers there (")
    from kvbench.sweep.ray_executor import check_address

    for address in ("nowhere", "ray://:10001", "host:port"):
        with pytest.raises(
            KvbenchError, match=rf"^--ray-address: '{address}' is not HOST:PORT, ray://HOST:PORT"
        ):
            check_address(address)
