"""NVML sampling on a background thread, joined to step rows by wall time.

NVML (`nvidia-ml-py`) reports what torch cannot: the device memory used by everyone (CUDA
context and other processes included), this process's share where the driver says, the
utilization, the power draw and the energy counter. A thread samples every 100 ms (10 Hz;
this process's memory once a second), so a 2 ms decode step may fall between two samples: a
row takes the samples inside its wall span, or the nearest one when none falls inside. The
thread shares the interpreter with the decode loop, so it does as little as it can.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import numpy as np

from engines.scheduler import Batch
from kvbench.runner import StepResult

PERIOD_S = 0.1  # 10 Hz
PROCESS_EVERY = 10  # the per-process query lists every process: once a second is enough


class NvmlSampler:
    def __init__(self, nvml, handle) -> None:
        self.nvml, self.handle = nvml, handle
        self.samples: list[tuple[float, float, float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvbench-nvml", daemon=True)

    @classmethod
    def start(cls, device) -> NvmlSampler | None:
        """A running sampler for `device`, or None where NVML is missing or refuses."""
        try:
            import pynvml as nvml
            import torch

            nvml.nvmlInit()
            bus = getattr(torch.cuda.get_device_properties(device), "pci_bus_id", None)
            if bus:
                handle = nvml.nvmlDeviceGetHandleByPciBusId(bus)
            else:
                handle = nvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:  # no driver library, no permission: the run goes on without NVML
            return None
        sampler = cls(nvml, handle)
        sampler._thread.start()
        return sampler

    def _read(self) -> tuple[float, float, float, float, float, float]:
        nvml, handle = self.nvml, self.handle
        mine = self.samples[-1][2] if self.samples else float("nan")
        if len(self.samples) % PROCESS_EVERY == 0:
            try:
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if process.pid == os.getpid() and process.usedGpuMemory is not None:
                        mine = float(process.usedGpuMemory)
            except nvml.NVMLError:
                pass
        try:
            energy = float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1e3  # mJ -> J
        except nvml.NVMLError:
            energy = float("nan")
        return (
            time.perf_counter(),
            float(nvml.nvmlDeviceGetMemoryInfo(handle).used),
            mine,
            float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,  # mW -> W
            energy,
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._read())
            self._stop.wait(PERIOD_S)

    def begin(self) -> None:
        """Nothing to note before a call: rows are joined to samples by wall time."""

    def row(self, batch: Batch, contexts: Sequence[int], result: StepResult) -> dict[str, float]:
        return {}  # filled in `finish`, once samples after the row exist

    def finish(self, rows: list[dict[str, float]], spans: list[tuple[float, float]]) -> dict:
        self._stop.set()
        self._thread.join()
        self.samples.append(self._read())
        data = np.array(self.samples)  # [N, 6]: time, used, process, utilization, power, energy
        times = data[:, 0]
        for row, (start, end) in zip(rows, spans, strict=True):
            inside = (times >= start) & (times <= end)
            pick = data[inside] if inside.any() else data[[np.abs(times - (start + end) / 2).argmin()]]
            row.update(
                nvml_used_bytes=float(pick[:, 1].max()),
                nvml_process_bytes=float(pick[:, 2].max()),
                nvml_utilization_pct=float(pick[:, 3].mean()),
                nvml_power_w=float(pick[:, 4].mean()),
            )
        first = spans[0][0] if spans else times[0]
        during = data[(times >= first)]
        energy = float(during[-1, 5] - during[0, 5]) if len(during) > 1 else float("nan")
        return {
            "nvml_samples": len(self.samples),
            "nvml_peak_used_bytes": float(data[:, 1].max()),
            "nvml_mean_power_w": float(during[:, 4].mean()) if len(during) else float("nan"),
            "energy_j": energy,
        }
