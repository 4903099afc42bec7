"""The demo's side-by-side row: occupancy is the saturated-weighted figure or nothing."""

from __future__ import annotations

import math

from kvbench.config import RunConfig
from kvbench.demo import _row, format_table
from kvbench.simulate import simulate
from workloads.spec import WorkloadSpec


def _summary(rate: float) -> dict:
    workload = WorkloadSpec("sharegpt-paper", num_requests=40, seed=0, rate=rate)
    return simulate(RunConfig(engine="paged", workload=workload, kv_cache_gib=12.0)).summary


def test_a_run_that_never_saturates_has_no_figure_2_occupancy_not_the_busy_one():
    summary = _summary(0.05)  # one request every 20 s: nobody ever waits
    assert summary["saturated_s"] == 0 and not summary["occupancy_saturated"]
    assert summary["occupancy"]["token_states"] > 0  # the busy-weighted figure exists...
    row = _row(summary)
    assert all(math.isnan(v) for v in row.occupancy.values())  # ...and is not shown in its place
    assert row.saturated_share == 0
    line = next(line for line in format_table([row]).splitlines() if line.startswith("| paged"))
    assert "  -   ( 96.3)" in line and "nan" not in line


def test_a_saturated_run_shows_its_saturated_weighted_occupancy():
    summary = _summary(float("inf"))  # all at once: requests wait from the start
    row = _row(summary)
    saturated = summary["occupancy_saturated"]
    assert row.occupancy["token_states"] == 100 * saturated["token_states"]
    assert row.occupancy["token_states"] != 100 * summary["occupancy"]["token_states"]
    assert 0 < row.saturated_share <= 1
