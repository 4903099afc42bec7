"""Collectors: the roofline arithmetic, the wrapper's bookkeeping, CSV columns, and (on a GPU)
a real run with every collector on."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engines.scheduler import Batch
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.errors import KvbenchError
from kvbench.real.collectors import CollectingRunner, Roofline, parse_collectors
from kvbench.requests import Request
from kvbench.runner import StepResult
from kvbench.sequence import Sequence

ROOT = Path(__file__).resolve().parents[1]


def decoding(prompt: int) -> Sequence:
    seq = Sequence(Request(prompt, 0.0, prompt, 50))
    seq.advance(1, end_s=0.0)  # prefilled: prompt + 1 tokens known
    return seq


def test_roofline_counts_weights_once_per_step_and_the_kv_each_step_moves():
    seqs = (decoding(9), decoding(19))  # 10 and 20 tokens before the segment
    batch = Batch(seqs, is_prefill=False, num_tokens=2, num_context=30, steps_to_finish=49)
    roofline = Roofline(weight_bytes=1000, kv_bytes_per_token=10, read_bandwidth=100.0)
    row = roofline.row(batch, [10, 20], StepResult(np.array([1.0, 1.0, 1.0])))
    # steps read 28, 30, 32 earlier positions and write 2 new ones each
    assert row["roofline_s"] == (3 * 1000 + (28 + 30 + 32 + 6) * 10) / 100.0
    prefill = Batch(seqs, is_prefill=True, num_tokens=30, num_context=30)
    assert math.isnan(roofline.row(prefill, [10, 20], StepResult(np.array([1.0])))["roofline_s"])
    summary = roofline.finish([row, {"roofline_s": math.nan}], [(0.0, 40.0), (40.0, 41.0)])
    assert summary["roofline_efficiency"] == pytest.approx(row["roofline_s"] / 40.0)


def test_roofline_reads_the_routed_experts_a_steps_rows_pick():
    """Of 1,000 weight bytes 800 are routed experts, each row picking a quarter of them: 2 rows
    pick 1 - 0.75^2 = 43.75 % between them, so a step must read 200 + 350 bytes of weights."""
    seqs = (decoding(9), decoding(19))
    batch = Batch(seqs, is_prefill=False, num_tokens=2, num_context=30, steps_to_finish=49)
    moe = Roofline(
        weight_bytes=1000, kv_bytes_per_token=10, read_bandwidth=100.0, routed_bytes=800, expert_pick=0.25
    )
    row = moe.row(batch, [10, 20], StepResult(np.array([1.0, 1.0, 1.0])))
    assert row["roofline_s"] == pytest.approx((3 * 550 + (28 + 30 + 32 + 6) * 10) / 100.0, rel=1e-12)
    every = Roofline(
        weight_bytes=1000, kv_bytes_per_token=10, read_bandwidth=100.0, routed_bytes=800, expert_pick=1.0
    )
    one_step = every.row(batch, [10, 20], StepResult(np.array([1.0])))
    assert one_step["roofline_s"] == (1000 + (28 + 2) * 10) / 100.0  # a pick of 1: every weight


class Counting:
    """A collector that numbers the rows it saw: proves the wrapper calls every collector."""

    def begin(self):
        self.began = getattr(self, "began", 0) + 1

    def row(self, batch, contexts, result):
        assert self.began == getattr(self, "rows", 0) + 1  # each call begun once, before its row
        self.rows = self.began
        return {"batch_seen": len(contexts), "steps_seen": len(result.durations)}

    def finish(self, rows, spans):
        assert len(rows) == len(spans) and all(end >= start for start, end in spans)
        return {"rows": len(rows)}


def test_collecting_runner_sees_every_engine_call_and_columns_reach_steps_csv(tmp_path):
    from kvbench.config import RunConfig, prepare
    from kvbench.simulate import execute, write_result
    from workloads.spec import WorkloadSpec

    config = RunConfig(
        engine="paged", model="opt-13b", workload=WorkloadSpec("sharegpt-paper", num_requests=40, rate=8.0)
    )
    prepared = prepare(config)
    wrapped = []

    def make_runner(_):
        wrapped.append(CollectingRunner(CostModelRunner(CostModel(0.02, 1e-4, 5e-7)), [Counting()]))
        return wrapped[0]

    result = execute(config, make_runner, mode="simulated", coalesce=True, prepared=prepared)
    runner = wrapped[0]
    assert runner.finish() == {"rows": len(result.run.steps)}
    assert [row["steps_seen"] for row in runner.rows] == [step.num_steps for step in result.run.steps]
    assert [row["batch_seen"] for row in runner.rows] == [step.batch_size for step in result.run.steps]
    from dataclasses import replace

    write_result(replace(result, step_columns=tuple(runner.rows)), tmp_path / "run")
    with open(tmp_path / "run" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result.run.steps)
    assert [int(row["steps_seen"]) for row in rows] == [step.num_steps for step in result.run.steps]


def test_unknown_collector_is_a_one_line_error():
    with pytest.raises(KvbenchError, match="--collectors: unknown collector 'gpu'"):
        parse_collectors("torch,gpu")
    assert parse_collectors("none") == ()
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "run", "--engine", "paged", "--model", "tiny-llama",
         "--device", "cpu", "--collectors", "bogus", "--out", "/tmp/never"],
        capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --collectors: unknown collector 'bogus'; choose from torch, nvml, roofline, host or none"
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device")
def test_a_real_run_with_every_collector(tmp_path):
    from kvbench.config import RunConfig
    from kvbench.real.run import run_real
    from kvbench.simulate import write_result
    from workloads.spec import WorkloadSpec

    workload = WorkloadSpec("uniform:prompt=8..64,output=8..64", num_requests=32, rate=50.0)
    config = RunConfig(
        engine="paged",
        model="tiny-llama",
        workload=workload,
        kv_cache_gib=0.05,
        device="cuda",
        collectors="torch,nvml,roofline,host",
    )
    result = run_real(config)
    write_result(result, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["torch_peak_allocated_bytes"] > summary["arena_bytes"]
    assert 0 < summary["roofline_efficiency"] < 1.5 and summary["read_bandwidth_Bps"] > 1e11
    with open(tmp_path / "run" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["torch_allocated_bytes"]) >= summary["arena_bytes"]
    if "nvml_samples" in summary:  # NVML present on the machine
        assert summary["nvml_samples"] > 0 and float(rows[0]["nvml_used_bytes"]) > summary["arena_bytes"]
    assert all(0 <= float(row["host_cpu_s"]) <= float(row["duration_s"]) + 1e-3 for row in rows)
    assert summary["host_cpus_used"] >= 1 and 0 < summary["host_cpu_share"] <= 1
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["gpu"] and env["packages"]["torch"]


def test_host_counters_parse_proc_files_as_linux_writes_them():
    from kvbench.real.host import _shares, cpu_counters, processor, runnable_threads

    # user nice system idle iowait irq softirq steal guest guest_nice
    busy, steal, total = cpu_counters(b"cpu  100 20 30 500 40 5 5 50 7 0")
    assert (busy, steal, total) == (160.0, 50.0, 750.0)  # guest time is inside user already
    assert cpu_counters(b"cpu  1 2 3 4") == (6.0, 0.0, 10.0)  # an old kernel's four fields
    assert runnable_threads(b"0.50 0.40 0.30 3/345 12345\n") == 3.0
    fields = " ".join(str(n) for n in range(3, 53))  # field n holds n: the state, field 3, is "3"
    assert processor(f"17578 (a (tricky) name) {fields}".encode()) == 39.0
    shares = _shares((160.0, 50.0, 750.0), (260.0, 100.0, 1000.0))
    assert shares == {"host_busy_pct": 40.0, "host_steal_pct": 20.0}
    for before, after in (
        ((1.0, 0.0, 5.0), (1.0, 0.0, 5.0)),
        (None, (1.0, 0.0, 5.0)),
        ((1.0, 0.0, 5.0), None),
    ):
        nothing = _shares(before, after)  # no tick between the readings, or a reading missing
        assert list(nothing) == ["host_busy_pct", "host_steal_pct"] and all(map(math.isnan, nothing.values()))


class Waiting:
    """A runner whose call blocks (as a step waiting on a device that yields the CPU) or burns
    CPU on the calling thread (a host-bound step), for `seconds` each."""

    allocates_ahead = False

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, batch, max_steps, start_s, until_s):
        if batch.is_prefill:
            end = time.thread_time() + self.seconds
            while time.thread_time() < end:
                pass
        else:
            time.sleep(self.seconds)
        return StepResult(np.array([self.seconds]))


def test_host_clock_tells_a_step_that_waited_from_one_that_ran_on_the_cpu():
    import resource

    from kvbench.real.host import HostClock

    seqs = (decoding(9),)
    runner = CollectingRunner(Waiting(0.03), [HostClock()])
    prefill = Batch(seqs, is_prefill=True, num_tokens=10, num_context=10)
    decode = Batch(seqs, is_prefill=False, num_tokens=1, num_context=10, steps_to_finish=49)
    time.sleep(0.001)  # the thread has given its CPU up before: its counters do not start at 0
    switches = []  # this thread's (voluntary, involuntary) switches around each call
    outside = []  # each call's wall time measured around it: what `begin` to `row` lies within
    for batch in (prefill, decode):
        before = resource.getrusage(resource.RUSAGE_THREAD)
        called = time.perf_counter()
        runner.run(batch, 1, 0.0, math.inf)
        outside.append(time.perf_counter() - called)
        after = resource.getrusage(resource.RUSAGE_THREAD)
        switches.append((after.ru_nvcsw - before.ru_nvcsw, after.ru_nivcsw - before.ru_nivcsw))
    (ran, waited), spans = runner.rows, runner.spans
    # over the call alone: `begin` and `row` bracket its wall span with a few us of bookkeeping
    assert 0.03 <= ran["host_cpu_s"] <= spans[0][1] - spans[0][0] + 1e-3
    for row, (start, end), around in zip(runner.rows, spans, outside, strict=True):
        # its own interval holds the call's span and lies inside the call as measured around it
        assert end - start <= row["host_wall_s"] <= around and row["host_cpu_s"] <= row["host_wall_s"]
    assert waited["host_cpu_s"] < 0.015 <= 0.03 <= spans[1][1] - spans[1][0]
    assert waited["host_waits"] >= 1  # a sleep gives the CPU up
    for row, (waits, preemptions) in zip(runner.rows, switches, strict=True):
        # counted inside the call: never more than around it
        assert 0 <= row["host_waits"] <= waits and 0 <= row["host_preemptions"] <= preemptions
        assert row["host_runnable"] >= 1  # this thread ran
        assert 0 <= row["host_cpu_id"] < os.cpu_count()
        assert set(row) == {"host_cpu_s", "host_wall_s", "host_waits", "host_preemptions", "host_runnable",
                            "host_cpu_id", "host_cpu_mhz", "host_busy_pct", "host_steal_pct"}  # fmt: skip
    summary = runner.finish()
    assert summary["host_cpus"] == os.cpu_count()
    assert 0 < summary["host_cpu_share"] < 1  # one call of two burnt its CPU, the other slept
    assert 0 <= summary["host_preempted_rows"] <= 2 and 1 <= summary["host_cpus_used"] <= 2
    assert 0 <= summary["host_run_busy_pct"] <= 100 and 0 <= summary["host_run_steal_pct"] <= 100


def test_host_clocks_summary_is_its_rows_arithmetic():
    """The run's summary from hand-made rows: CPU time over wall time, rows with a preemption,
    distinct CPUs (a NaN CPU, where /proc lacks it, is none)."""
    from kvbench.real.host import HostClock

    rows = [
        {"host_cpu_s": 0.01, "host_wall_s": 0.02, "host_preemptions": 0.0, "host_cpu_id": 3.0},
        {"host_cpu_s": 0.03, "host_wall_s": 0.04, "host_preemptions": 2.0, "host_cpu_id": 5.0},
        {"host_cpu_s": 0.02, "host_wall_s": 0.04, "host_preemptions": 1.0, "host_cpu_id": 3.0},
        {"host_cpu_s": 0.0, "host_wall_s": 0.0, "host_preemptions": 0.0, "host_cpu_id": math.nan},
    ]
    spans = [(0.0, 0.5), (1.0, 1.5), (2.0, 2.5), (3.0, 3.5)]  # not the share's wall time: the rows' is
    clock = HostClock()
    summary = clock.finish(rows, spans)
    assert clock._stat.fd is None and clock._loadavg.fd is None  # its /proc files closed
    assert summary["host_cpu_share"] == pytest.approx(0.06 / 0.10)
    assert summary["host_preempted_rows"] == 2 and summary["host_cpus_used"] == 2
    assert math.isnan(HostClock().finish([], [])["host_cpu_share"])  # no wall time: no share


def test_host_clock_reads_the_machines_cpu_shares_at_most_once_a_period(monkeypatch):
    """Rows inside one period carry the same busy and steal shares (one /proc/stat read); with
    a period of 0 every row reads again, and the machine's counters move between rows."""
    from kvbench.real import host
    from kvbench.real.host import HostClock

    seqs = (decoding(9),)
    batch = Batch(seqs, is_prefill=True, num_tokens=10, num_context=10)
    monkeypatch.setattr(host, "PERIOD_S", 1e9)
    runner = CollectingRunner(Waiting(0.02), [HostClock()])
    for _ in range(3):
        runner.run(batch, 1, 0.0, math.inf)
    first, *rest = runner.rows
    assert all(row["host_busy_pct"] == first["host_busy_pct"] for row in rest)
    monkeypatch.setattr(host, "PERIOD_S", 0.0)
    reads = []  # the n-th read: n busy jiffies of 2n in all

    def counters(self) -> tuple[float, float, float]:
        reads.append(1)
        return float(len(reads)), 0.0, 2.0 * len(reads)

    monkeypatch.setattr(HostClock, "_cpu_counters", counters)
    runner = CollectingRunner(Waiting(0.0), [HostClock()])  # its first read: at construction
    for _ in range(3):
        runner.run(batch, 1, 0.0, math.inf)
    assert len(reads) == 4 and [row["host_busy_pct"] for row in runner.rows] == [50.0, 50.0, 50.0]


def test_host_clock_reads_the_machines_cpu_line_not_one_cpus():
    """/proc/stat's first line sums every CPU: the collector's reading is that line's (its total
    moves only by the ticks between the two reads), not cpu0's below it."""
    from kvbench.real.host import HostClock, cpu_counters

    ours = HostClock()._cpu_counters()
    with open("/proc/stat", "rb") as f:
        machine = cpu_counters(f.readline())
    # the ticks of a descheduled moment between the reads, however loaded the machine; cpu0's
    # line alone would hold about 1 / (CPUs) of the total
    assert abs(ours[2] - machine[2]) <= max(1e-3 * machine[2], 100)


def test_host_clock_reads_a_cpus_clock_in_khz_as_mhz(tmp_path):
    """cpufreq's `scaling_cur_freq` holds kHz. Where the machine exposes none (as here, in a VM)
    the column is NaN; the reading is checked on a file of that form for every CPU."""
    from kvbench.real.host import HostClock, _ProcFile

    khz = tmp_path / "scaling_cur_freq"
    khz.write_text("2400000\n")
    clock = HostClock()
    clock._clocks = {cpu: _ProcFile(str(khz)) for cpu in range(os.cpu_count())}
    runner = CollectingRunner(Waiting(0.0), [clock])
    seqs = (decoding(9),)
    runner.run(Batch(seqs, is_prefill=True, num_tokens=10, num_context=10), 1, 0.0, math.inf)
    assert runner.rows[0]["host_cpu_mhz"] == 2400.0
    clock._clocks = {cpu: _ProcFile(str(tmp_path / "absent")) for cpu in range(os.cpu_count())}
    runner.run(Batch(seqs, is_prefill=True, num_tokens=10, num_context=10), 1, 0.0, math.inf)
    assert math.isnan(runner.rows[1]["host_cpu_mhz"])
