"""Arrival processes and trace replay: seeds fix times, statistics match, windows are exact."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvbench.errors import KvbenchError
from workloads.arrivals import (
    AllAtOnce,
    ArrivalProcess,
    Constant,
    Gamma,
    Poisson,
    check_rate,
    poisson_arrivals,
    replay,
)

PROCESSES: list[ArrivalProcess] = [
    AllAtOnce(),
    Poisson(3.0),
    Poisson(math.inf),
    Gamma(3.0, 0.25),
    Constant(3.0),
]


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("process", PROCESSES, ids=lambda p: p.describe())
def test_sorted_float64_and_deterministic(process):
    times = process.times(2_000, rng(1))
    assert times.shape == (2_000,) and times.dtype == np.float64
    assert (np.diff(times) >= 0).all() and times.min() >= 0.0
    assert np.array_equal(times, process.times(2_000, rng(1)))
    assert process.times(0, rng(1)).shape == (0,)


def test_all_at_once_is_zeros():
    assert AllAtOnce().times(5, rng()).tolist() == [0.0] * 5


def test_poisson_is_the_paper_process():
    assert np.array_equal(Poisson(2.5).times(1_000, rng(4)), poisson_arrivals(1_000, 2.5, rng(4)))
    assert Poisson(math.inf).times(3, rng()).tolist() == [0.0] * 3


@pytest.mark.parametrize("burstiness", [0.1, 0.25, 1.0, 4.0])
def test_gamma_mean_gap_and_cv_over_200k(burstiness):
    """Gap mean = 1/rate and CV = 1/sqrt(burstiness), both within 3 % (worst over seeds 0-9: 1.2 %)."""
    rate = 5.0
    times = Gamma(rate, burstiness).times(200_000, rng(7))
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.03)


def test_gamma_burstiness_one_is_exponential():
    gaps = np.diff(Gamma(2.0, 1.0).times(200_000, rng(2)), prepend=0.0)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)
    assert np.median(gaps) == pytest.approx(math.log(2) / 2.0, rel=0.02)  # exponential's median


def test_constant_gaps_are_exact():
    assert Constant(4.0).times(5, rng()).tolist() == [0.25, 0.5, 0.75, 1.0, 1.25]
    times = Constant(3.0).times(10_000, rng())
    assert np.diff(times) == pytest.approx(np.full(9_999, 1 / 3), rel=1e-12)
    assert times[0] == 1 / 3  # first arrival one gap after 0, like Poisson


def test_replay_window_and_scale_on_a_hand_example():
    t = np.array([0.0, 0.5, 1.0, 1.0, 2.0, 3.5, 4.0, 9.0])
    index, times = replay(t, start_s=1.0, duration_s=3.0)  # [1, 4): rows 2..5
    assert index.tolist() == [2, 3, 4, 5] and times.tolist() == [0.0, 0.0, 1.0, 2.5]
    index, times = replay(t, time_scale=2.0, start_s=1.0, duration_s=3.0)
    assert index.tolist() == [2, 3, 4, 5] and times.tolist() == [0.0, 0.0, 0.5, 1.25]
    index, times = replay(t, time_scale=0.5, start_s=0.5, max_requests=3)
    assert index.tolist() == [1, 2, 3] and times.tolist() == [0.0, 1.0, 1.0]
    index, times = replay(t)
    assert index.tolist() == list(range(8)) and times.tolist() == t.tolist()
    index, times = replay(t + 10.0, start_s=0.0, duration_s=11.5)  # re-based to the first selected
    assert index.tolist() == [0, 1, 2, 3] and times.tolist() == [0.0, 0.5, 1.0, 1.0]
    index, times = replay(t, start_s=5.0, duration_s=1.0)
    assert index.size == 0 and times.size == 0


def test_replay_keeps_dtype_and_shape():
    index, times = replay([0, 1, 2], time_scale=3)
    assert index.dtype == np.int64 and times.dtype == np.float64
    assert times.tolist() == pytest.approx([0.0, 1 / 3, 2 / 3])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Poisson(0.0), "rate must be > 0, got 0.0"),
        (lambda: Poisson(float("nan")), "rate must be > 0"),
        (lambda: Gamma(math.inf, 1.0), "rate must be finite and > 0, got inf"),
        (lambda: Gamma(1.0, -1), "burstiness must be finite and > 0, got -1"),
        (lambda: Gamma(1.0, 0), "burstiness must be finite and > 0, got 0"),
        (lambda: Constant("fast"), "rate must be a number > 0, got 'fast'"),
        (lambda: Constant(-2), "rate must be finite and > 0, got -2"),
        (lambda: Constant(1.0).times(-1, rng()), "num_requests must be an integer >= 0, got -1"),
        (lambda: replay([0.0, 1.0], time_scale=0), "time_scale must be finite and > 0, got 0"),
        (lambda: replay([0.0, 1.0], duration_s=-1.0), "duration_s must be finite and > 0"),
        (lambda: replay([0.0, 1.0], max_requests=0), "max_requests must be an integer >= 1, got 0"),
        (lambda: replay([0.0, 1.0], start_s=math.nan), "start_s must be a finite number"),
        (lambda: replay([1.0, 0.0]), "non-decreasing"),
        (lambda: replay([]), "non-empty"),
    ],
)
def test_bad_parameters_are_named(make, message):
    with pytest.raises(KvbenchError) as err:
        make()
    assert message in str(err.value)


def test_check_rate_still_names_the_flag():
    assert check_rate(2) == 2.0 and check_rate(math.inf) == math.inf
    with pytest.raises(KvbenchError, match="--rate"):
        check_rate(0)
