"""Figure 12's sensitivity rows: paged's sustained-rate ratios read again at multiples of the bound
from the cells already run (`kvbench.reproduce.sweeps.sensitivity_rows`).

Each row is worked out by hand from a made-up sweep: the cells' latencies against each multiple
of the bound, the baseline cells left out, repeats at a rate averaged, a failed cell read as
over any bound, and an engine that never passed giving no ratio. A reading that took the
baselines in, or a failed cell as a pass, or the bound unscaled, would move a bracket here.
"""

from __future__ import annotations

import math

import pytest

from kvbench.reproduce.sweeps import SENSITIVITY, sensitivity_rows
from kvbench.sweep.run import SweepResult

BOUND = 0.02  # s/token
PAPER = 1.33


def cell(engine: str, rate: float, latency: float | None, role: str = "grid") -> dict:
    status = "ok" if latency is not None else "failed"
    return {"role": role, "engine": engine, "rate": rate, "status": status, "normalized_latency_s": latency}


SWEEP = SweepResult(
    rows=[
        cell("paged", 1.0, 1.0, role="baseline"),  # taken in, paged would fail from its lowest rate
        cell("paged", 10.0, 0.010), cell("paged", 20.0, 0.018),
        cell("paged", 30.0, 0.022), cell("paged", 30.0, 0.026),  # two repeats: 0.024
        cell("paged", 40.0, None),  # failed: over any bound
        cell("orca-oracle", 10.0, 0.011), cell("orca-oracle", 20.0, 0.014),
        cell("orca-oracle", 30.0, 0.016), cell("orca-oracle", 40.0, 0.030),
    ],
    sustained=[], ran=10, resumed=0, failed=1,
)  # fmt: skip

# multiple -> (paged's bracket, orca-oracle's), worked out by hand; None: no rate passed
BRACKETS = {
    0.5: (None, None),  # 0.010 s/token: neither passes its lowest rate (0.010, 0.011 not under it)
    0.75: ((10, 20), (20, 30)),  # 0.015
    1.0: ((20, 30), (30, 40)),  # 0.020: paged's repeats average 0.024, over
    1.25: ((30, 40), (30, 40)),  # 0.025: paged's mean 0.024 passes, the failed cell fails
    2.0: ((30, 40), (40, math.inf)),  # 0.040: orca-oracle passes every rate
    4.0: ((30, 40), (40, math.inf)),
}


def test_every_multiple_reads_its_own_brackets_and_their_ratio_interval():
    rows = sensitivity_rows("fig12", "alpaca-paper", SWEEP, BOUND, {"orca-oracle": PAPER})
    assert tuple(BRACKETS) == SENSITIVITY and len(rows) == len(SENSITIVITY)
    for row, (multiple, (paged, oracle)) in zip(rows, BRACKETS.items(), strict=True):
        assert (row.figure, row.engine, row.workload, row.paper) == (
            "fig12",
            "paged/orca-oracle",
            "alpaca-paper",
            PAPER,
        )
        assert row.metric == f"sustained_ratio@bound x {multiple:g} ({multiple * BOUND:.3g} s/token)"
        if paged is None:
            assert row.kvbench is None and row.low is None and row.high is None
            continue
        assert row.kvbench == pytest.approx(paged[0] / oracle[0])
        assert row.low == pytest.approx(paged[0] / oracle[1])
        assert row.high == pytest.approx(paged[1] / oracle[0])


def test_the_metric_names_the_scaled_bound():
    rows = sensitivity_rows("fig12", "alpaca-paper", SWEEP, BOUND, {"orca-oracle": PAPER})
    assert [r.metric for r in rows][1:4] == [
        "sustained_ratio@bound x 0.75 (0.015 s/token)",
        "sustained_ratio@bound x 1 (0.02 s/token)",
        "sustained_ratio@bound x 1.25 (0.025 s/token)",
    ]


def test_no_bound_gives_no_rows():
    """A sweep read without a bound (none set) has nothing to scale."""
    assert sensitivity_rows("fig12", "alpaca-paper", SWEEP, None, {"orca-oracle": PAPER}) == []
    assert sensitivity_rows("fig12", "alpaca-paper", SWEEP, 0.0, {"orca-oracle": PAPER}) == []
