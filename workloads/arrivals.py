"""Arrival processes: when each request of a trace reaches the server.

The PagedAttention paper (§6.1) feeds every system the same trace with Poisson arrivals at a
given request rate, so the only arrival process needed to reproduce it is a Poisson one:
independent exponential gaps with mean ``1 / rate``. ``rate = inf`` is the offline case (the
whole trace is queued at t = 0), which measures peak throughput rather than latency under load.
"""

from __future__ import annotations

import math

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
