"""Collectors: what a real run measures beside the engine's own step rows.

Each collector adds columns to the step rows (one row per engine call: a prefill step or a
decode segment) and entries to the summary, and each can be switched off (`--collectors`).
They wrap the runner (`CollectingRunner`) instead of living in it, so the model runner stays
about decoding and a collector sees exactly what the engine saw: each call's batch, its wall
span and its result. Allocator occupancy is not here: the engine records it on every row.

- `torch`: the CUDA caching allocator's allocated and reserved bytes after each row; peaks,
  inactive-split bytes (fragmentation inside torch's own pool), allocation retries and OOMs
  in the summary.
- `nvml`: device memory used, this process's memory, utilization and power, sampled on a
  background thread (`kvbench.real.nvml`) and joined to rows by wall time; energy per output token.
- `roofline`: for decode rows, the bytes the steps must move (weights + K/V read + K/V
  written) over the read bandwidth measured once per run, beside the measured time. K/V read is
  per layer group, as the cost model prices it (`KvReads`): a sliding-window layer reads only
  its window of a row, so a Gemma or Mistral run's floor is not inflated by K/V it never reads.
- `host`: the engine thread's CPU time and context switches in each call, and how busy the
  machine's CPUs were (`kvbench.real.host`): whether a slow host-bound step (an eager prefill)
  waited on the device or on a shared or slower CPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from engines.scheduler import Batch
from kvbench.cost_model import KvReads, routed_share
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_distinct
from kvbench.models import ModelSpec
from kvbench.runner import Runner, StepResult

COLLECTORS = ("torch", "nvml", "roofline", "host")


def parse_collectors(text: str) -> tuple[str, ...]:
    """`--collectors torch,nvml,roofline,host` (or `none`) -> names, checked."""
    if text.strip() in ("", "none"):
        return ()
    names = tuple(name.strip() for name in text.split(","))
    for name in names:
        if name not in COLLECTORS:
            choices = ", ".join(COLLECTORS)
            raise KvbenchError(f"--collectors: unknown collector {name!r}; choose from {choices} or none")
    check_distinct("--collectors", names)
    return names


class Collector(Protocol):
    def begin(self) -> None:
        """Note what a call's columns are measured from, just before the call."""
        ...

    def row(self, batch: Batch, contexts: Sequence[int], result: StepResult) -> dict[str, float]:
        """Columns for the row just run; `contexts`: each sequence's tokens before it ran."""
        ...

    def finish(self, rows: list[dict[str, float]], spans: list[tuple[float, float]]) -> dict:
        """Complete `rows` in place once the run is over (`spans`: each row's wall start/end,
        `time.perf_counter`); return the collector's summary entries."""
        ...


class CollectingRunner:
    """A runner that forwards to another and lets the collectors see every call."""

    def __init__(self, inner: Runner, collectors: Sequence[Collector]) -> None:
        self.inner = inner
        self.collectors = tuple(collectors)
        self.allocates_ahead = inner.allocates_ahead
        self.rows: list[dict[str, float]] = []
        self.spans: list[tuple[float, float]] = []

    def run(self, batch: Batch, max_steps: int, start_s: float, until_s: float) -> StepResult:
        contexts = [seq.num_tokens for seq in batch.seqs]
        for collector in self.collectors:
            collector.begin()
        start = time.perf_counter()
        result = self.inner.run(batch, max_steps, start_s, until_s)
        self.spans.append((start, time.perf_counter()))
        row: dict[str, float] = {}
        for collector in self.collectors:
            row.update(collector.row(batch, contexts, result))
        self.rows.append(row)
        return result

    def finish(self) -> dict:
        summary: dict = {}
        for collector in self.collectors:
            summary.update(collector.finish(self.rows, self.spans))
        return summary


class TorchMemory:
    """The CUDA caching allocator's view at each row (what torch holds beyond the arena).

    `memory_allocated` and `memory_reserved` each build the allocator's whole statistics dict:
    asked on every row they cost 7 % of a small model's decode throughput on the H200. So the
    counters are read at most every `PERIOD_S` (10 Hz, as NVML) and a row carries the latest
    reading; the peaks in the summary are the allocator's own, exact whatever the period.
    """

    PERIOD_S = 0.1

    def __init__(self, device) -> None:
        import torch

        self.cuda = torch.cuda
        self.device = device
        self.cuda.reset_peak_memory_stats(device)
        self._read_at = -math.inf
        self._reading: dict[str, float] = {}

    def begin(self) -> None:
        """Nothing to note before a call: a row reads the latest state."""

    def row(self, batch: Batch, contexts: Sequence[int], result: StepResult) -> dict[str, float]:
        now = time.perf_counter()
        if now - self._read_at >= self.PERIOD_S:
            self._read_at = now
            self._reading = {
                "torch_allocated_bytes": self.cuda.memory_allocated(self.device),
                "torch_reserved_bytes": self.cuda.memory_reserved(self.device),
            }
        return self._reading

    def finish(self, rows: list[dict[str, float]], spans: list[tuple[float, float]]) -> dict:
        stats = self.cuda.memory_stats(self.device)
        return {
            "torch_inactive_split_bytes": stats.get("inactive_split_bytes.all.current", 0),
            "torch_peak_inactive_split_bytes": stats.get("inactive_split_bytes.all.peak", 0),
            "torch_peak_allocated_bytes": stats.get("allocated_bytes.all.peak", 0),
            "torch_peak_reserved_bytes": stats.get("reserved_bytes.all.peak", 0),
            "torch_alloc_retries": stats.get("num_alloc_retries", 0),
            "torch_ooms": stats.get("num_ooms", 0),
        }


class Roofline:
    """Each decode row's floor: bytes that must move over the measured read bandwidth.
    `reads`: what the model's window layers skip (`KvReads.of` its group shapes); the default,
    no window layers, counts every layer reading its whole context. `routed_bytes`: a MoE model's
    routed experts (part of `weight_bytes`), of which a step of b rows reads the share its rows
    pick: the expected share for rows routed independently and uniformly (`routed_share`, the
    simulator's), not a floor for a router that favours some experts (`routed_expert_bytes`)."""

    def __init__(
        self, weight_bytes: int, kv_bytes_per_token: int, read_bandwidth: float, reads: KvReads | None = None,
        *, routed_bytes: int = 0, expert_pick: float = 0.0,
    ) -> None:  # fmt: skip
        self.weight_bytes = weight_bytes
        self.kv_bytes_per_token = kv_bytes_per_token
        self.bandwidth = read_bandwidth
        self.reads = reads or KvReads()
        self.routed_bytes = routed_bytes
        self.expert_pick = expert_pick

    def begin(self) -> None:
        """Nothing to note before a call: a row's floor is the batch's arithmetic."""

    def row(self, batch: Batch, contexts: Sequence[int], result: StepResult) -> dict[str, float]:
        if batch.is_prefill:
            return {"roofline_s": math.nan}
        k, b = len(result.durations), len(contexts)
        # step j reads contexts[i] - 1 + j positions of each sequence and writes one more
        read = k * (sum(contexts) - b) + b * k * (k - 1) // 2
        weights = self.weight_bytes - self.routed_bytes * (1.0 - routed_share(self.expert_pick, b))
        moved = k * weights + (read + k * b) * self.kv_bytes_per_token
        if self.reads.windows:  # less what window layers skip (the engine has not advanced the rows yet)
            moved -= float(self.reads.skipped(batch, k).sum()) * self.kv_bytes_per_token
        return {"roofline_s": moved / self.bandwidth}

    def finish(self, rows: list[dict[str, float]], spans: list[tuple[float, float]]) -> dict:
        floors = np.array([row["roofline_s"] for row in rows])
        took = np.array([end - start for start, end in spans])
        decode = ~np.isnan(floors)
        return {
            "read_bandwidth_Bps": self.bandwidth,
            "roofline_efficiency": float(floors[decode].sum() / took[decode].sum()) if decode.any() else None,
        }


def routed_expert_bytes(spec: ModelSpec, dispatch: str, weight_bytes: int) -> tuple[int, float]:
    """(routed bytes, expert pick) for `Roofline`: the grouped dispatch reads the routed experts a
    step's rows pick; the dense one runs every expert over every row, and a dense model has none
    (0, 0.0: every weight, every step). `weight_bytes` are the weights as loaded (their dtype), of
    which the routed experts' share is their share of the parameters."""
    if dispatch != "grouped" or not spec.expert_pick:
        return 0, 0.0
    return weight_bytes * spec.routed_expert_params // spec.num_params, spec.expert_pick


def build_collectors(
    names: Sequence[str], *, device, weight_bytes: int, kv_bytes_per_token: int, read_bandwidth: float | None,
    reads: KvReads | None = None, routed_bytes: int = 0, expert_pick: float = 0.0,
) -> list:  # fmt: skip
    """The named collectors that can run here: all of them need CUDA (none run on CPU).
    `reads`, `routed_bytes`, `expert_pick`: the model's window layers and routed experts, for the
    roofline (`Roofline`)."""
    if device.type != "cuda":
        return []
    collectors: list = []
    if "torch" in names:
        collectors.append(TorchMemory(device))
    if "roofline" in names and read_bandwidth:
        experts = {"routed_bytes": routed_bytes, "expert_pick": expert_pick}
        collectors.append(Roofline(weight_bytes, kv_bytes_per_token, read_bandwidth, reads, **experts))
    if "host" in names:
        from kvbench.real.host import HostClock

        collectors.append(HostClock())
    if "nvml" in names:
        from kvbench.real.nvml import NvmlSampler

        sampler = NvmlSampler.start(device)
        if sampler is not None:
            collectors.append(sampler)
    return collectors
