"""Synthetic workloads: paper means after the filter, determinism, Poisson arrivals, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvbench.errors import KvbenchError
from workloads import PRESETS, make_trace
from workloads.arrivals import poisson_arrivals
from workloads.presets import sample_lengths


def lengths(trace) -> tuple[np.ndarray, np.ndarray]:
    prompt = np.array([r.prompt_len for r in trace.requests])
    output = np.array([r.output_len for r in trace.requests])
    return prompt, output


@pytest.fixture(scope="module")
def traces():
    return {name: make_trace(name, 20_000, rate=2.0, seed=0) for name in PRESETS}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_filtered_means_match_paper(traces, name):
    preset = PRESETS[name]
    prompt, output = lengths(traces[name])
    assert prompt.mean() == pytest.approx(preset.paper_prompt_mean, rel=0.02)
    assert output.mean() == pytest.approx(preset.paper_output_mean, rel=0.02)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_calibration_holds_on_a_large_sample(name):
    """Tighter than the 20k test: the calibrated constants, not seed 0's luck, hit the paper."""
    preset = PRESETS[name]
    prompt, output = sample_lengths(preset, 400_000, np.random.default_rng(123))
    assert prompt.mean() == pytest.approx(preset.paper_prompt_mean, rel=0.005)
    assert output.mean() == pytest.approx(preset.paper_output_mean, rel=0.005)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_request_passes_the_filter(traces, name):
    prompt, output = lengths(traces[name])
    assert prompt.min() >= 4 and output.min() >= 4
    assert prompt.max() <= 1024
    assert (prompt + output).max() <= 2048


def test_sharegpt_is_longer_than_alpaca_as_in_the_paper(traces):
    share_p, share_o = lengths(traces["sharegpt-paper"])
    alpaca_p, alpaca_o = lengths(traces["alpaca-paper"])
    assert share_p.mean() / alpaca_p.mean() == pytest.approx(8.4, rel=0.04)
    assert share_o.mean() / alpaca_o.mean() == pytest.approx(5.8, rel=0.04)
    assert share_p.std() > alpaca_p.std() and share_o.std() > alpaca_o.std()


def test_trace_is_sorted_and_numbered_in_arrival_order(traces):
    trace = traces["sharegpt-paper"]
    assert trace.name == "sharegpt-paper"
    assert [r.request_id for r in trace.requests] == list(range(20_000))
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals)
    first = trace.requests[0]
    assert type(first.arrival_s) is float and type(first.prompt_len) is int


def test_same_seed_same_trace_other_seed_other_trace():
    a = make_trace("alpaca-paper", 500, rate=5.0, seed=7)
    assert make_trace("alpaca-paper", 500, rate=5.0, seed=7) == a
    b = make_trace("alpaca-paper", 500, rate=5.0, seed=8)
    assert lengths(a)[0].tolist() != lengths(b)[0].tolist()
    assert [r.arrival_s for r in a.requests] != [r.arrival_s for r in b.requests]


def test_rate_changes_arrivals_but_not_lengths():
    slow = make_trace("sharegpt-paper", 300, rate=1.0, seed=3)
    fast = make_trace("sharegpt-paper", 300, rate=10.0, seed=3)
    assert lengths(slow)[0].tolist() == lengths(fast)[0].tolist()
    assert lengths(slow)[1].tolist() == lengths(fast)[1].tolist()
    assert slow.requests[-1].arrival_s == pytest.approx(10 * fast.requests[-1].arrival_s)


def test_shorter_trace_is_a_prefix_of_a_longer_one():
    short = make_trace("sharegpt-paper", 1_000, rate=2.0, seed=11)
    long = make_trace("sharegpt-paper", 9_000, rate=2.0, seed=11)
    assert long.requests[:1_000] == short.requests


def test_max_model_len_tightens_the_total_length_cap():
    prompt, output = lengths(make_trace("sharegpt-paper", 5_000, rate=1.0, seed=0, max_model_len=512))
    assert (prompt + output).max() <= 512
    assert prompt.min() >= 4 and output.min() >= 4
    wide = make_trace("alpaca-paper", 200, rate=1.0, seed=0, max_model_len=4096)
    assert wide == make_trace("alpaca-paper", 200, rate=1.0, seed=0)


def test_poisson_mean_gap_is_one_over_rate():
    rate = 4.0
    arrivals = poisson_arrivals(20_000, rate, np.random.default_rng(0))
    gaps = np.diff(np.concatenate([[0.0], arrivals]))
    assert arrivals[0] > 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.03)
    assert gaps.std() == pytest.approx(1.0 / rate, rel=0.05)  # exponential: std == mean


def test_infinite_rate_means_everyone_at_time_zero():
    assert poisson_arrivals(100, math.inf, np.random.default_rng(0)).tolist() == [0.0] * 100
    trace = make_trace("alpaca-paper", 50, rate=math.inf, seed=0)
    assert {r.arrival_s for r in trace.requests} == {0.0}
    assert [r.request_id for r in trace.requests] == list(range(50))


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan, -math.inf, "fast"])
def test_bad_rate_names_the_flag(rate):
    with pytest.raises(KvbenchError, match="--rate"):
        poisson_arrivals(10, rate, np.random.default_rng(0))
    with pytest.raises(KvbenchError, match="--rate"):
        make_trace("alpaca-paper", 10, rate=rate, seed=0)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(KvbenchError) as err:
        make_trace("lmsys", 10, rate=1.0, seed=0)
    assert str(err.value) == "unknown --trace 'lmsys'; choose one of: alpaca-paper, sharegpt-paper"


@pytest.mark.parametrize("num", [0, -5, 2.5, True])
def test_bad_num_requests_names_the_flag(num):
    with pytest.raises(KvbenchError, match="--num-requests"):
        make_trace("alpaca-paper", num, rate=1.0, seed=0)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"seed": -1}, "--seed"),
        ({"seed": 1.5}, "--seed"),
        ({"max_model_len": 7}, "--max-model-len"),
        ({"max_model_len": 9}, "--max-model-len"),  # valid but almost nothing fits: refused
    ],
)
def test_other_bad_inputs_name_the_flag(kwargs, flag):
    args = {"seed": 0} | kwargs
    with pytest.raises(KvbenchError, match=flag):
        make_trace("sharegpt-paper", 100, rate=1.0, **args)


def test_poisson_rejects_negative_count():
    with pytest.raises(KvbenchError, match="--num-requests"):
        poisson_arrivals(-1, 1.0, np.random.default_rng(0))
