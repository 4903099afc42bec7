"""The host behind each step: the CPU time the engine's thread got, how often it gave the CPU
up or had it taken, and how busy the rest of the machine was.

Why: an eager prefill step is host-bound. On OPT-13B a prefill of one or two short prompts has
a device floor of 5.6 ms (its weights read once), launched op by op from Python; such a step took
12 ms in some stretches of a Figure 12 run and 20-25 ms in others, among prefills of at most
64 tokens (results/reproduce/opt-13b-h200, fig12/alpaca-seeds.md). A step's wall time alone
cannot say whether such a step waited on the device, ran on a slower or shared CPU, or lost its
CPU to another process; these columns can:

- `host_cpu_s`: CPU time of the engine's thread during the call (`CLOCK_THREAD_CPUTIME_ID`).
  A CUDA synchronisation spins by default, so a wait on the device counts here too: compare
  it with the call's wall time only together with the other columns.
- `host_waits`, `host_preemptions`: the thread's voluntary context switches (it blocked: a
  sync that yields, I/O, a lock) and involuntary ones (the kernel gave its CPU to another
  thread or process) during the call.
- `host_runnable`: threads runnable on the whole machine when the call ended (`/proc/loadavg`),
  this one included; beside `host_cpus` in the summary it says whether the CPUs were
  oversubscribed.
- `host_cpu_id`, `host_cpu_mhz`: the CPU the thread was on when the call ended
  (`/proc/thread-self/stat`) and that CPU's clock (cpufreq's `scaling_cur_freq`, where the
  machine exposes it): a thread moved to another core, or a core clocked down, shows here.
- `host_busy_pct`, `host_steal_pct`: the machine's CPUs busy, and time a hypervisor gave
  their vCPUs to other guests, over the last 0.1 s or more (`/proc/stat` is read at most
  10 times a second: a read walks every CPU's counters).

Linux only (`/proc`, `RUSAGE_THREAD`); elsewhere the columns the platform lacks are NaN.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Sequence

from engines.scheduler import Batch
from kvbench.runner import StepResult

PERIOD_S = 0.1  # /proc/stat at most 10 Hz, as the torch and NVML collectors sample

_THREAD = getattr(resource, "RUSAGE_THREAD", None)


def _switches() -> tuple[float, float]:
    """The calling thread's (voluntary, involuntary) context switches so far; NaN without
    per-thread usage."""
    if _THREAD is None:
        return math.nan, math.nan
    usage = resource.getrusage(_THREAD)
    return float(usage.ru_nvcsw), float(usage.ru_nivcsw)


class _ProcFile:
    """A /proc file read again from its start on each `read` (None when absent)."""

    def __init__(self, path: str) -> None:
        try:
            self.fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self.fd = None

    def read(self, size: int) -> bytes | None:
        return None if self.fd is None else os.pread(self.fd, size, 0)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def cpu_counters(line: bytes) -> tuple[float, float, float]:
    """(busy, steal, total) jiffies from /proc/stat's first line
    `cpu user nice system idle iowait irq softirq steal ...`: busy is everything but idle,
    iowait and steal; guest time is already inside user and nice."""
    fields = [float(x) for x in line.split()[1:9]]
    fields += [0.0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def processor(stat: bytes) -> float:
    """Field 39 of a /proc/<pid>/task/<tid>/stat line, the CPU the thread last ran on; fields are
    counted after the command name's closing parenthesis (the name may hold spaces)."""
    return float(stat[stat.rindex(b")") + 2 :].split()[36])


def runnable_threads(loadavg: bytes) -> float:
    """The running/total field of /proc/loadavg (`0.50 0.40 0.30 3/345 12345`): its numerator."""
    return float(loadavg.split()[3].split(b"/")[0])


class HostClock:
    """The `host` collector (see the module docstring)."""

    def __init__(self) -> None:
        self._stat = _ProcFile("/proc/stat")
        self._loadavg = _ProcFile("/proc/loadavg")
        self._thread: _ProcFile | None = None  # this thread's stat: opened by the first row (its thread)
        self._clocks: dict[int, _ProcFile] = {}  # CPU -> its cpufreq scaling_cur_freq
        self._read_at = -math.inf
        self._counters = self._cpu_counters()  # at the last /proc/stat read
        self._first = self._counters
        self._shares = {"host_busy_pct": math.nan, "host_steal_pct": math.nan}
        self._start = (0.0, math.nan, math.nan, math.nan)

    def _cpu_counters(self) -> tuple[float, float, float] | None:
        line = self._stat.read(256)
        return None if line is None else cpu_counters(line.split(b"\n", 1)[0])

    def begin(self) -> None:
        begun = time.perf_counter()  # before the CPU clock, so the wall interval holds the CPU one
        self._start = (begun, time.thread_time(), *_switches())

    def row(self, batch: Batch, contexts: Sequence[int], result: StepResult) -> dict[str, float]:
        cpu = time.thread_time()
        wall = time.perf_counter()
        waits, preemptions = _switches()
        begun, started, waits0, preemptions0 = self._start
        loadavg = self._loadavg.read(128)
        cpu_id, mhz = self._where()
        now = time.perf_counter()
        if now - self._read_at >= PERIOD_S and self._counters is not None:
            self._read_at = now
            counters = self._cpu_counters()
            self._shares = _shares(self._counters, counters)
            self._counters = counters
        return {
            "host_cpu_s": cpu - started,
            "host_wall_s": wall - begun,
            "host_waits": waits - waits0,
            "host_preemptions": preemptions - preemptions0,
            "host_runnable": math.nan if loadavg is None else runnable_threads(loadavg),
            "host_cpu_id": cpu_id,
            "host_cpu_mhz": mhz,
            **self._shares,
        }

    def _where(self) -> tuple[float, float]:
        """(CPU the calling thread is on, its clock in MHz), NaN where /proc or cpufreq lack them."""
        if self._thread is None:
            self._thread = _ProcFile("/proc/thread-self/stat")
        stat = self._thread.read(1024)
        if stat is None:
            return math.nan, math.nan
        cpu = processor(stat)
        clock = self._clocks.get(int(cpu))
        if clock is None:
            clock = self._clocks[int(cpu)] = _ProcFile(
                f"/sys/devices/system/cpu/cpu{int(cpu)}/cpufreq/scaling_cur_freq"
            )
        khz = clock.read(32)
        return cpu, math.nan if not khz else float(khz) / 1e3

    def finish(self, rows: list[dict[str, float]], spans: list[tuple[float, float]]) -> dict:
        # over the rows' own wall time, the interval their CPU time was read in: the calls' spans
        # leave out the other collectors' work around them, which the thread's CPU time holds
        # (a tiny model's sub-millisecond calls read 1.01 of their spans on an H200)
        wall = sum(row["host_wall_s"] for row in rows)
        cpu = sum(row["host_cpu_s"] for row in rows)
        preempted = sum(1 for row in rows if row["host_preemptions"] > 0)
        whole = _shares(self._first, self._cpu_counters())
        cpus = {row["host_cpu_id"] for row in rows if not math.isnan(row["host_cpu_id"])}
        for file in (self._stat, self._loadavg, self._thread, *self._clocks.values()):
            if file is not None:
                file.close()
        return {
            "host_cpus": os.cpu_count(),
            "host_cpu_share": cpu / wall if wall > 0 else math.nan,
            "host_preempted_rows": preempted,
            "host_cpus_used": len(cpus),  # CPUs the engine's thread ended its rows on
            "host_run_busy_pct": whole["host_busy_pct"],
            "host_run_steal_pct": whole["host_steal_pct"],
        }


def _shares(before: tuple[float, float, float] | None, after: tuple[float, float, float] | None) -> dict:
    """Busy and steal percentages of the machine's CPU time between two /proc/stat readings
    (NaN without both, or when no tick passed between them)."""
    if before is None or after is None or after[2] <= before[2]:
        return {"host_busy_pct": math.nan, "host_steal_pct": math.nan}
    total = after[2] - before[2]
    return {
        "host_busy_pct": 100.0 * (after[0] - before[0]) / total,
        "host_steal_pct": 100.0 * (after[1] - before[1]) / total,
    }
