"""Arrival processes: when each request of a trace reaches the server.

The PagedAttention paper (§6.1) feeds every system the same trace with Poisson arrivals at a
given request rate, so the only arrival process needed to reproduce it is a Poisson one:
independent exponential gaps with mean ``1 / rate``. ``rate = inf`` is the offline case (the
whole trace is queued at t = 0), which measures peak throughput rather than latency under load.

Beyond the paper, the ``ArrivalProcess`` family (`AllAtOnce`, `Poisson`, `Gamma`, `Constant`)
varies burstiness at a fixed mean rate, and `replay` reuses a real trace's own timestamps
(a window of them, optionally sped up), since real traffic is burstier than Poisson.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvbench.errors import KvbenchError


def check_rate(rate: float) -> float:
    """Return ``rate`` as a float, or raise if it is not a usable request rate.

    Positive finite rates and ``math.inf`` are accepted; zero, negative and NaN are not (a zero
    rate would mean no request ever arrives, and NaN would silently poison every timestamp).
    """
    try:
        value = float(rate)
    except (TypeError, ValueError):
        raise KvbenchError(f"--rate must be positive or 'inf', got {rate!r}") from None
    if math.isnan(value) or value <= 0.0:
        raise KvbenchError(f"--rate must be positive or 'inf', got {rate!r}")
    return value


def poisson_arrivals(num: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in seconds of ``num`` requests of a Poisson process with ``rate`` req/s.

    The first request arrives after the first exponential gap (not at t = 0), so every request,
    the first included, sees the same memoryless process; the result is the cumulative sum of
    ``num`` gaps and is therefore non-decreasing. With ``rate == inf`` every request arrives at
    t = 0 and ``rng`` is left untouched.

    Returns a float64 array of shape ``[num]``.
    """
    if isinstance(num, bool) or not isinstance(num, int | np.integer) or num < 0:
        raise KvbenchError(f"--num-requests must be an integer >= 0, got {num!r}")
    value = check_rate(rate)
    if math.isinf(value):
        return np.zeros(num, dtype=np.float64)
    gaps = rng.exponential(scale=1.0 / value, size=num)  # [num] seconds apart
    return np.cumsum(gaps)


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an integer (bools excluded) of at least ``minimum``, else raise.

    ``name`` is the spec key the user wrote, so the one-line error says what to fix.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise KvbenchError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_positive(name: str, value: object, allow_inf: bool = False) -> float:
    """Return ``value`` as a float if it is a number > 0 (finite unless ``allow_inf``), else raise."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise KvbenchError(f"{name} must be a number > 0, got {value!r}")
    number = float(value)
    if math.isnan(number) or number <= 0.0 or (math.isinf(number) and not allow_inf):
        raise KvbenchError(f"{name} must be {'> 0' if allow_inf else 'finite and > 0'}, got {value!r}")
    return number


class ArrivalProcess(Protocol):
    """When requests arrive: ``times(num, rng)`` is a sorted float64 array (num,) of seconds.

    Every process starts its clock at 0 and draws only from ``rng``, so a seed fixes the times.
    """

    def times(self, num: int, rng: np.random.Generator) -> np.ndarray: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class AllAtOnce:
    """The offline case: the whole trace is queued at t = 0 (peak throughput, no load curve)."""

    def times(self, num: int, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(check_int("num_requests", num, 0), dtype=np.float64)

    def describe(self) -> str:
        return "all at t=0"


@dataclass(frozen=True)
class Poisson:
    """The paper's process (§6.1): exponential gaps of mean 1/rate; ``rate = inf`` is `AllAtOnce`.

    Delegates to `poisson_arrivals`, so it yields the very times the paper presets use.
    """

    rate: float

    def __post_init__(self) -> None:
        check_positive("rate", self.rate, allow_inf=True)

    def times(self, num: int, rng: np.random.Generator) -> np.ndarray:
        return poisson_arrivals(check_int("num_requests", num, 0), self.rate, rng)

    def describe(self) -> str:
        return f"Poisson at {self.rate:g} req/s"


@dataclass(frozen=True)
class Gamma:
    """Bursty (or smoothed) arrivals: gamma gaps with shape ``burstiness`` and mean 1/rate.

    The gap CV is 1/sqrt(burstiness): 1 is Poisson, < 1 clumps requests into bursts (real
    traces such as Azure's and Mooncake's have interarrival CVs of 1.1 and 3.0), > 1 is more
    regular. The mean rate stays ``rate`` whatever the burstiness, so sweeps compare fairly.
    """

    rate: float
    burstiness: float

    def __post_init__(self) -> None:
        check_positive("rate", self.rate)
        check_positive("burstiness", self.burstiness)

    def times(self, num: int, rng: np.random.Generator) -> np.ndarray:
        num = check_int("num_requests", num, 0)
        scale = 1.0 / (self.rate * self.burstiness)  # mean gap = shape * scale = 1 / rate
        gaps = rng.gamma(shape=self.burstiness, scale=scale, size=num)  # (num,) seconds apart
        return np.cumsum(gaps)

    def describe(self) -> str:
        return f"gamma at {self.rate:g} req/s, burstiness {self.burstiness:g}"


@dataclass(frozen=True)
class Constant:
    """Perfectly regular arrivals, one every 1/rate seconds: load without any burst.

    Like `Poisson`, the first request arrives one gap after t = 0.
    """

    rate: float

    def __post_init__(self) -> None:
        check_positive("rate", self.rate)

    def times(self, num: int, rng: np.random.Generator) -> np.ndarray:
        num = check_int("num_requests", num, 0)
        return np.arange(1, num + 1, dtype=np.float64) / self.rate  # (num,)

    def describe(self) -> str:
        return f"constant at {self.rate:g} req/s"


def replay(
    arrival_s: np.ndarray,
    time_scale: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Replay a window of a real trace's timestamps ``arrival_s`` (N,), sorted, in seconds.

    Selects the rows with ``start_s <= t < start_s + duration_s`` (no upper bound without a
    duration), keeps the first ``max_requests`` of them, and re-bases their times so the first
    selected request arrives at 0, then divides by ``time_scale`` (2 replays twice as fast:
    the same requests at twice the rate, burst shape intact). Returns ``(index, times)``: the
    selected rows (int64, (K,)) for `Columns.take`, and their new times (float64, (K,)); both
    are empty when no request lies in the window (the caller words that error).
    """
    arrival = np.asarray(arrival_s, dtype=np.float64)
    if arrival.ndim != 1 or arrival.size == 0:
        raise KvbenchError("replay needs a non-empty 1-D array of arrival times")
    if not np.isfinite(arrival).all() or (np.diff(arrival) < 0).any():
        raise KvbenchError("replay needs finite arrival times in non-decreasing order")
    scale = check_positive("time_scale", time_scale)
    if (
        isinstance(start_s, bool)
        or not isinstance(start_s, int | float | np.integer)
        or not math.isfinite(start_s)
    ):
        raise KvbenchError(f"start_s must be a finite number of seconds, got {start_s!r}")
    end = math.inf if duration_s is None else start_s + check_positive("duration_s", duration_s)
    first, stop = np.searchsorted(arrival, [start_s, end], side="left")  # half-open [start, end)
    if max_requests is not None:
        stop = min(stop, first + check_int("max_requests", max_requests, 1))
    index = np.arange(first, max(first, stop), dtype=np.int64)  # (K,); K = 0 for an empty window
    if index.size == 0:  # the caller names its own flags in the error
        return index, np.zeros(0, dtype=np.float64)
    return index, (arrival[index] - arrival[first]) / scale
