"""How fast this GPU can stream memory: the floor under every memory-bound kernel.

A decode-attention step reads each token's K and V once and does little arithmetic per
byte, so its best possible time is (bytes it must read) / (read bandwidth). The kernel
benchmark divides every backend's achieved bytes/s by the figure measured here, on the same
GPU in the same run, rather than by a datasheet number no kernel reaches (the H200's
4.8 TB/s). A streaming read kernel measured 4.44 TB/s on an H200;
`measure_read_bandwidth` should land near that there.

Also here: `time_cuda`, the one CUDA timer every kvbench kernel measurement uses.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl

from kvbench.errors import KvbenchError

GIB = 1 << 30
H200_STREAMING_READ = 4.44e12  # bytes/s, a streaming read kernel measured on an H200
_BLOCK = 4096  # float32 elements per load step of one program (16 KiB)


def time_cuda(fns: Sequence[Callable[[], object]], *, warmup: int, repeats: int) -> list[float]:
    """Seconds taken on the GPU by `repeats` calls, cycling through `fns` (one per input copy).

    Each call is bracketed by CUDA events. Before each, the GPU is kept busy with a spin
    (`torch.cuda._sleep`) that outlasts the host's launch work, so the start event and the
    kernel are both queued before the GPU reaches them: the interval is the kernel's
    own time, not Python launch overhead. (A launcher that synchronizes inside, e.g. on
    `.item()`, defeats this; none of the benchmarked backends should.)
    """
    if not fns or repeats < 1:
        raise ValueError("time_cuda needs at least one function and one repeat")
    for i in range(max(warmup, len(fns))):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    host_start = time.perf_counter()
    fns[0]()
    host_s = time.perf_counter() - host_start  # launch cost on the host, the spin must hide it
    torch.cuda.synchronize()
    spin = int(_cycles_per_second() * (2 * host_s + 50e-6))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for i in range(repeats):
        torch.cuda._sleep(spin)
        starts[i].record()
        fns[i % len(fns)]()
        ends[i].record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e-3 for start, end in zip(starts, ends, strict=True)]


def time_host(fns: Sequence[Callable[[], object]], *, warmup: int, repeats: int) -> list[float]:
    """Wall seconds per call on the CPU (the Triton interpreter path: the numbers mean nothing)."""
    for i in range(warmup):
        fns[i % len(fns)]()
    out = []
    for i in range(repeats):
        start = time.perf_counter()
        fns[i % len(fns)]()
        out.append(time.perf_counter() - start)
    return out


def _cycles_per_second() -> float:
    """GPU clock as `torch.cuda._sleep` counts it: time a known spin once."""
    cycles = 2_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # warm the path
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e-3)


def measure_read_bandwidth(
    device: str | torch.device = "cuda", nbytes: int = 2 * GIB, repeats: int = 20
) -> float:
    """Bytes per second this GPU reads when streaming `nbytes` once, the best of two honest reads.

    Both read every byte of a buffer far larger than L2 and reduce it to a few numbers that
    are checked (the buffer holds ones, so the sum is exact), so no read can be skipped:
    a Triton kernel (persistent programs, 16 KiB loads, one partial sum each) and
    `torch.sum`. Median of `repeats` after warm-up; the faster of the two is returned.
    """
    return read_bandwidth_report(device, nbytes, repeats)["read_bandwidth_bytes_per_s"]


def read_bandwidth_report(
    device: str | torch.device = "cuda", nbytes: int = 2 * GIB, repeats: int = 20
) -> dict:
    """`measure_read_bandwidth` with its workings: each method's figure, sizes, the device name."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise KvbenchError(f"measure_read_bandwidth needs a CUDA device, got {device}")
    if not (_BLOCK * 4 <= nbytes <= 4 * GIB):
        raise KvbenchError(f"measure_read_bandwidth: nbytes must be in [16 KiB, 4 GiB], got {nbytes}")
    n = nbytes // 4 // _BLOCK * _BLOCK  # float32 elements, a whole number of load steps
    x = torch.ones(n, dtype=torch.float32, device=device)  # [n]
    with torch.cuda.device(device):
        results = {"torch.sum": _median_rate(lambda: x.sum(), x, n, repeats)}
        try:
            results["triton streaming read"] = _median_rate(_triton_reader(x, device), x, n, repeats)
        except Exception as error:  # a Triton problem must not cost the run its bandwidth figure
            results["triton streaming read"] = f"failed: {type(error).__name__}: {error}".splitlines()[0]
    rates = {name: r for name, r in results.items() if isinstance(r, float)}
    best = max(rates, key=rates.get)
    return {
        "read_bandwidth_bytes_per_s": rates[best],
        "method": best,
        "methods": results,
        "nbytes": n * 4,
        "repeats": repeats,
        "device": torch.cuda.get_device_name(device),
        "h200_reference_bytes_per_s": H200_STREAMING_READ,
    }


def cpu_read_bandwidth_report(nbytes: int = 64 << 20, repeats: int = 5) -> dict:
    """The host's `torch.sum` read rate: only so a CPU smoke run has a figure to divide by."""
    x = torch.ones(nbytes // 4, dtype=torch.float32)  # [n]
    seconds = time_host([lambda: x.sum()], warmup=1, repeats=repeats)
    return {
        "read_bandwidth_bytes_per_s": x.nbytes / statistics.median(seconds),
        "method": "torch.sum on the CPU (a smoke test: this figure means nothing)",
        "methods": {},
        "nbytes": x.nbytes,
        "repeats": repeats,
        "device": "cpu",
        "h200_reference_bytes_per_s": H200_STREAMING_READ,
    }


def _median_rate(read: Callable[[], torch.Tensor], x: torch.Tensor, n: int, repeats: int) -> float:
    total = float(read().double().sum())
    if total != n:  # every element is 1.0: anything else means elements were skipped
        raise RuntimeError(f"read check failed: summed {total}, expected {n}")
    seconds = time_cuda([read], warmup=3, repeats=repeats)
    return x.nbytes / statistics.median(seconds)


def _triton_reader(x: torch.Tensor, device: torch.device) -> Callable[[], torch.Tensor]:
    """A launcher of `_stream_read` over `x`: four persistent programs per SM."""
    programs = torch.cuda.get_device_properties(device).multi_processor_count * 4
    partial = torch.empty(programs, dtype=torch.float32, device=device)  # [P]

    def read() -> torch.Tensor:
        _stream_read[(programs,)](x, partial, x.numel(), BLOCK=_BLOCK, num_warps=8)
        return partial

    return read


@triton.jit
def _stream_read(
    x_ptr,  # [N] float32, N a multiple of BLOCK and below 2**31
    partial_ptr,  # [P] float32: program p's sum
    n_elements,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)  # [BLOCK]
    for start in range(pid * BLOCK, n_elements, step):
        acc += tl.load(x_ptr + start + tl.arange(0, BLOCK))  # [BLOCK]
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))
