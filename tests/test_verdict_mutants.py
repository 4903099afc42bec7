"""The edges of the comparison rules: where a verdict turns from "matches" to "inconclusive" or
"differs", how engines are paired seed by seed, how a sustained rate is bracketed, bisected and
written to sustained.csv. Every expected value is worked out by hand in the test."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from kvbench.config import RunConfig
from kvbench.reproduce.verdicts import (
    DIFFERS,
    INCONCLUSIVE,
    MATCHES,
    NOT_MEASURED,
    TOLERANCE,
    Interval,
    Verdict,
    missing,
    order_verdict,
    range_verdict,
    ratio_verdict,
    value_verdict,
)
from kvbench.sweep import stats
from kvbench.sweep.files import cell_row
from kvbench.sweep.grid import BASELINE, BISECT, GRID, Axes, Cell
from kvbench.sweep.plan import SustainedOptions, SweepPlan
from kvbench.sweep.stats import bracket_width, sustained_rate, t975
from kvbench.sweep.sustained import shared_bound, step_outside, sustained_table
from workloads.spec import WorkloadSpec

# --- value, ratio, range ---------------------------------------------------------------------


def test_a_value_verdict_names_its_metric_in_every_outcome():
    """Every branch of `value_verdict` (assumed, no upper end, differs, too wide, matches) keeps
    the metric it judged."""
    assumed = value_verdict("swap overhead", Interval(1.2, 1.1, 1.3), 1.2, assumed="swap cost")
    unbounded = value_verdict("sustained rate", Interval.of_bracket(8.0, math.inf), 12.0)
    differs = value_verdict("token states", Interval(10.0, 9.0, 11.0), 30.0)
    wide = value_verdict("capacity", Interval(10.0, 5.0, 12.0), 10.0, tolerance=0.0)  # holds 10 / 2
    matched = value_verdict("batched requests", Interval(10.0, 9.0, 11.0), 10.0)  # widened [7.65, 12.65]
    verdicts = (assumed, unbounded, differs, wide, matched)
    assert [v.outcome for v in verdicts] == [NOT_MEASURED, NOT_MEASURED, DIFFERS, INCONCLUSIVE, MATCHES]
    assert [v.metric for v in verdicts] == [
        "swap overhead",
        "sustained rate",
        "token states",
        "capacity",
        "batched requests",
    ]


def test_a_lower_bound_that_is_the_papers_value_is_not_measured():
    """[8, inf) without tolerance: the paper's 8 lies at the lower end; an interval with no upper
    end cannot confirm it (not "inconclusive", which would read as a near miss)."""
    verdict = value_verdict("sustained rate", Interval.of_bracket(8.0, math.inf), 8.0, tolerance=0.0)
    assert verdict.outcome == NOT_MEASURED and verdict.evidence.endswith(
        "no upper end (no rate swept failed)"
    )


def test_half_or_twice_the_paper_exactly_at_an_end_of_the_interval_is_held():
    """`RESOLUTION`'s rule includes the interval's ends: [5, 12] holds 10 / 2 = 5, [8, 20] holds
    10 x 2 = 20, so neither can tell the paper's 10 from half or twice it: inconclusive."""
    low_end = value_verdict("m", Interval(10.0, 5.0, 12.0), 10.0, tolerance=0.0)
    assert low_end.outcome == INCONCLUSIVE and low_end.evidence.endswith("it holds 5 as well")
    high_end = value_verdict("m", Interval(10.0, 8.0, 20.0), 10.0, tolerance=0.0)
    assert high_end.outcome == INCONCLUSIVE and high_end.evidence.endswith("it holds 20 as well")


def test_a_ratio_over_an_engine_that_sustained_nothing_is_unbounded_not_an_error():
    """Denominator bracket [0, 0.5) (even the lowest rate failed), numerator [2, 2.2): the ratio
    lies in [2 / 0.5, inf) = [4, inf) and its value is inf; the paper's 5 is above the widened
    lower end 3.4, so the verdict is "not measured"."""
    verdict = ratio_verdict("ratio", Interval.of_bracket(2.0, 2.2), Interval.of_bracket(0.0, 0.5), 5.0)
    assert verdict.outcome == NOT_MEASURED
    assert verdict.evidence.startswith("kvbench inf [4, inf] (+-15%: [3.4, inf]), paper 5")


def test_a_ratio_verdict_uses_the_tolerance_it_is_given():
    """[2, 2.2) over [1, 1.1) lies in [2 / 1.1, 2.2 / 1] = [1.82, 2.2]: the paper's 1.75 is
    inside it widened by 15 % (from 1.55) but outside it without tolerance."""
    paged, oracle = Interval.of_bracket(2.0, 2.2), Interval.of_bracket(1.0, 1.1)
    assert ratio_verdict("ratio", paged, oracle, 1.75).outcome == MATCHES
    assert ratio_verdict("ratio", paged, oracle, 1.75, tolerance=0.0).outcome == DIFFERS


def test_a_range_verdict_includes_the_ranges_ends_and_says_both_sides():
    """A measured [16, 128] inside the paper's 16-128 matches (ends included); a lower bound
    that starts at the range's top is "not measured", not "differs"."""
    inside = range_verdict("best block size", Interval(64, 16, 128), (16, 128))
    assert inside == Verdict(MATCHES, "best block size", "kvbench 64 [16, 128], paper 16-128")
    edge = range_verdict("ratio", Interval(4.0, 4.0, math.inf), (2.0, 4.0))
    assert edge == Verdict(
        NOT_MEASURED, "ratio", "kvbench 4 [4, inf], paper 2-4; no upper end (no rate swept failed)"
    )


def test_a_range_verdict_whose_interval_ends_exactly_at_an_end_of_the_range_is_inconclusive():
    """An interval that reaches the paper's range at one end holds that end, a value the paper
    allows, as well as values outside: not wholly outside, so inconclusive, not "differs". The
    paper's 16-128: measured sizes [8, 16] hold 16, [128, 256] hold 128."""
    below = range_verdict("best block size", Interval(8, 8, 16), (16, 128))
    assert below == Verdict(
        INCONCLUSIVE,
        "best block size",
        "kvbench 8 [8, 16], paper 16-128; too wide to tell: it holds values outside the range as well",
    )
    above = range_verdict("best block size", Interval(256, 128, 256), (16, 128))
    assert above.outcome == INCONCLUSIVE
    assert above.evidence.startswith("kvbench 256 [128, 256], paper 16-128; too wide to tell")


def test_a_missing_measurement_differs_naming_the_metric():
    """`missing`: nothing to hold against the paper is a "differs" of that metric."""
    assert missing("sustained rate", "orca-max") == Verdict(
        DIFFERS, "sustained rate", "no measurement: orca-max"
    )


def test_one_run_is_said_of_two_seeds_one_without_a_value_never_of_a_single_seed():
    """Two seeds, one of them NaN: a point over one run, and the label counts 1 of 2. A row of a
    single seed (its one value kept) left nothing out: no label."""
    assert str(Interval(97.4, 97.4, 97.4, (97.4, math.nan))) == "97.4 (one run: 1 of 2 seeds have none)"
    assert str(Interval(97.4, 97.4, 97.4, (math.nan, 97.4))) == "97.4 (one run: 1 of 2 seeds have none)"
    assert str(Interval(97.4, 97.4, 97.4, (97.4,))) == "97.4"


# --- order and seed-by-seed pairing ----------------------------------------------------------


def _seeds(values: list[float]) -> Interval:
    """An interval over seeds, each seed's value kept (as a merged figure row gives it)."""
    mean, half = stats.mean_ci95(values)
    return Interval(mean, mean - half, mean + half, tuple(values))


def test_paired_ratios_skip_a_seed_the_lower_engine_did_not_sustain():
    """Seed by seed `other / self`, leaving out seeds where `self` is 0 (no ratio): (1, 3, 6)
    over (0, 2, 4) is 1.5 twice, two seeds, so an interval (a point: no spread)."""
    assert _seeds([0.0, 2.0, 4.0]).paired_ratio(_seeds([1.0, 3.0, 6.0])) == Interval(1.5, 1.5, 1.5)


def test_paired_ratios_keep_rates_below_one_and_a_zero_above():
    """Rates under 1 req/s pair as any other: (1, 0.5, 1.5) over (0.5, 0.25, 0.75) is 2 in every
    seed. A higher engine that sustained 0 in a seed gives a ratio of 0 there: (0, 4, 8) over
    (1, 2, 4) is 0, 2, 2, mean 4 / 3."""
    assert _seeds([0.5, 0.25, 0.75]).paired_ratio(_seeds([1.0, 0.5, 1.5])) == Interval(2.0, 2.0, 2.0)
    ratio = _seeds([1.0, 2.0, 4.0]).paired_ratio(_seeds([0.0, 4.0, 8.0]))
    assert ratio is not None and ratio.value == pytest.approx(4 / 3)


def test_engines_are_ranked_by_the_papers_values_not_by_name():
    """The paper puts b (10) below a (20); measured the other way round, the order differs."""
    measured = {"a": Interval(10.0, 9.0, 11.0), "b": Interval(20.0, 19.0, 21.0)}
    verdict = order_verdict("x", measured, {"a": 20.0, "b": 10.0})
    assert verdict.outcome == DIFFERS
    assert verdict.evidence == (
        "b 20 [19, 21] (paper 10), a 10 [9, 11] (paper 20); "
        "not in the paper's order: b 20 [19, 21] vs a 10 [9, 11]"
    )


def test_the_first_two_engines_are_compared_as_well():
    """Paper a 10 < b 20 < c 40, measured b below a, both below c: the pair (a, b) alone differs."""
    measured = {
        "a": Interval(20.0, 19.0, 21.0),
        "b": Interval(10.0, 9.0, 11.0),
        "c": Interval(40.0, 39.0, 41.0),
    }
    verdict = order_verdict("x", measured, {"a": 10.0, "b": 20.0, "c": 40.0})
    assert verdict.outcome == DIFFERS and verdict.evidence.endswith(
        "not in the paper's order: a 20 [19, 21] vs b 10 [9, 11]"
    )


def test_a_pair_exactly_at_the_tolerance_may_come_in_either_order():
    """A gap is more than `TOLERANCE` above: b = a x (1 + TOLERANCE) exactly is no gap."""
    paper = {"a": 10.0, "b": 10.0 * (1 + TOLERANCE)}
    measured = {"a": Interval(11.0, 11.0, 11.0), "b": Interval(10.0, 10.0, 10.0)}
    assert order_verdict("x", measured, paper).outcome == MATCHES


def test_a_pair_without_a_gap_does_not_end_the_search_for_later_pairs():
    """Paper a 10, b 10.5 (within 15 %), c 20: (a, b) needs no order, yet (a, c) is reversed."""
    measured = {
        "a": Interval(30.0, 29.0, 31.0),
        "b": Interval(10.0, 9.0, 11.0),
        "c": Interval(20.0, 19.0, 21.0),
    }
    verdict = order_verdict("x", measured, {"a": 10.0, "b": 10.5, "c": 20.0})
    assert verdict.outcome == DIFFERS and verdict.evidence.endswith(
        "not in the paper's order: a 30 [29, 31] vs c 20 [19, 21]"
    )


def test_reversed_pairs_and_missing_engines_are_each_named():
    """Three engines measured in the reverse of the paper's order, apart (not tied, no seeds to
    pair), and two engines not measured: every wrong pair is listed, then the missing ones."""
    paper = {"a": 1.0, "b": 2.0, "c": 4.0, "d": 8.0, "e": 16.0}
    measured = {"a": Interval(4.0, 4.0, 4.0), "b": Interval(2.0, 2.0, 2.0), "c": Interval(1.0, 1.0, 1.0)}
    verdict = order_verdict("sustained rate", measured, paper)
    assert verdict == Verdict(
        DIFFERS,
        "sustained rate",
        "a 4 (paper 1), b 2 (paper 2), c 1 (paper 4); not in the paper's order: a 4 vs b 2; a 4 vs c 1; "
        "b 2 vs c 1; no measurement for d, e",
        True,
    )


def test_every_pair_separated_seed_by_seed_is_listed_in_the_evidence():
    """Seeds (8, 10, 12), x 1.25 and x 1.5625: intervals over three seeds overlap (a 10 [5.03,
    14.97], b 12.5 [6.29, 18.71], c 15.625 [7.86, 23.39]; t(2) = 4.303), yet every seed ranks
    a < b < c: ratios b/a 1.25, c/a 1.5625, c/b 1.25 in every seed, so the order matches."""
    a = [8.0, 10.0, 12.0]
    measured = {"a": _seeds(a), "b": _seeds([v * 1.25 for v in a]), "c": _seeds([v * 1.5625 for v in a])}
    verdict = order_verdict("sustained rate", measured, {"a": 1.0, "b": 2.0, "c": 4.0})
    assert verdict == Verdict(
        MATCHES,
        "sustained rate",
        "a 10 [5.03, 15] (paper 1), b 12.5 [6.29, 18.7] (paper 2), c 15.6 [7.86, 23.4] (paper 4); "
        "overlapping intervals separated seed by seed (paired ratios): b/a 1.25, c/a 1.56, c/b 1.25",
        True,
    )


def test_a_pair_separated_seed_by_seed_does_not_excuse_the_next_pair():
    """Paper a 1, b 2, c 2.1. b is 1.25 x a in every seed (paired: separated). c equals a in
    every seed: a ratio of exactly 1 is not above 1, so (a, c) is tied across the paper's gap.
    (b, c) are within 15 % in the paper: either order."""
    a = [8.0, 10.0, 12.0]
    measured = {"a": _seeds(a), "b": _seeds([v * 1.25 for v in a]), "c": _seeds(a)}
    verdict = order_verdict("sustained rate", measured, {"a": 1.0, "b": 2.0, "c": 2.1})
    assert verdict.outcome == DIFFERS
    assert verdict.evidence.endswith(
        "not in the paper's order: a 10 [5.03, 15] vs c 10 [5.03, 15] (tied), seed by seed c/a 1"
    )


# --- stats: the t quantile, the sustained rate ----------------------------------------------


def test_the_t_quantile_refuses_zero_degrees_of_freedom_and_follows_students_t():
    """Table to 30 degrees of freedom (t(30) = 2.042 as tabulated), then the Cornish-Fisher
    series, whose next term at 5000 degrees is about 2e-11: Student's t(0.975, 5000) is
    1.96043855171 (to 12 digits)."""
    with pytest.raises(ValueError, match=r"^a t quantile needs at least one degree of freedom$"):
        t975(0)
    assert t975(30) == 2.042
    assert t975(5000) == pytest.approx(1.9604385517065, abs=2e-10)


def test_a_sustained_rate_must_stay_strictly_under_the_threshold():
    """A rate whose latency equals the threshold fails; each verdict says why in words."""
    assert sustained_rate([(1.0, 0.05), (2.0, 0.1), (4.0, 0.5)], 0.1) == stats.Verdict(
        1.0, 2.0, "under 0.1 s/token up to 1, over at 2"
    )
    assert sustained_rate([(0.5, None), (1.0, 0.02)], 0.1) == stats.Verdict(
        None, 0.5, "over 0.1 s/token from the lowest rate, 0.5"
    )
    assert sustained_rate([], 0.1) == stats.Verdict(None, None, "no rate swept")


def test_a_bracket_below_one_request_per_second_has_a_width():
    """(0.6 - 0.5) / 0.5 = 0.2; only a bracket starting at 0 is infinitely wide."""
    assert bracket_width((0.5, 0.6)) == pytest.approx(0.2)


def test_a_step_down_starts_only_from_a_lowest_rate_that_failed():
    """`step_outside` steps down where nothing passed and the lowest swept rate failed; a
    verdict whose first failure is not the lowest swept rate gives no step."""
    assert step_outside(stats.Verdict(None, 2.0, ""), [1.8, 2.0], 0.1) is None


# --- sustained.py: the shared bound and sustained.csv's rows ---------------------------------


def test_the_shared_bound_is_a_multiple_of_the_lowest_baseline_and_flags_overlap():
    """4 x the lowest unloaded latency (0.025 s/token of paged); a lowest baseline whose requests
    overlapped (peak batch 2) is said so; a peak of 1 is a clean baseline."""
    clean = [
        {"engine": "orca-max", "normalized_latency_s": 0.03, "peak_batched_requests": 2},
        {"engine": "paged", "normalized_latency_s": 0.025, "peak_batched_requests": 1},
    ]
    source = "4 x 0.025 s/token, the lowest unloaded latency of 2 engines (paged), shared by all"
    assert shared_bound(clean, 4.0) == (pytest.approx(0.1), source)
    overlapped = [{**clean[0]}, {**clean[1], "peak_batched_requests": 2}]
    assert shared_bound(overlapped, 4.0) == (
        pytest.approx(0.1),
        source + "; its requests overlapped (peak batch 2): lower --baseline-rate",
    )


class Curve:
    """A sweep whose cells' normalized latency is a made-up function of (rate, repeat): it keeps
    sweep.csv rows by cell id (built by the sweep's own `cell_row`), runs the cells the search
    asks for, and refuses to run more than `limit` of them (a search that never ends)."""

    def __init__(self, plan: SweepPlan, latency: Callable[[float, int], float | None], limit: int = 40):
        self.plan, self.latency, self.limit = plan, latency, limit
        self.rows: dict[str, dict] = {}
        self.planned: list[Cell] = []
        self.ran: list[Cell] = []

    def row(self, cell: Cell) -> dict:
        latency = self.latency(cell.rate, cell.repeat)
        if latency is None:
            return cell_row(cell, self.plan.config(cell), "failed", None, "made to fail", 0.0)
        summary = {"normalized_latency_s": latency, "peak_batched_requests": 1}
        return cell_row(cell, self.plan.config(cell), "ok", summary, "", 0.0)

    def fill(self, cells: list[Cell]) -> None:
        for cell in cells:
            self.rows[cell.id] = self.row(cell)

    def plan_cells(self, cells: list[Cell]) -> None:
        self.planned.extend(cells)

    def run(self, cell: Cell) -> dict:
        assert len(self.ran) < self.limit, "the search ran more cells than any bisection needs"
        self.ran.append(cell)
        self.rows[cell.id] = self.row(cell)
        return self.rows[cell.id]


def _plan(engines=("paged",), rates=(2.0,), seed=0, repeats=1, **sustained) -> SweepPlan:
    axes = Axes(tuple(engines), ("sharegpt-paper",), tuple(rates), (16,), (4.0,), (seed,), repeats)
    base = RunConfig(
        "paged", model="opt-13b", emulate_gpu="a100-40gb", workload=WorkloadSpec(num_requests=40)
    )
    return SweepPlan(axes, base, sustained=SustainedOptions(**sustained))


def _grid(plan: SweepPlan) -> list[Cell]:
    a = plan.axes
    return [
        Cell(GRID, engine, a.traces[0], rate, a.block_sizes[0], a.kv_cache_gib[0], a.seeds[0], r)
        for engine in a.engines
        for rate in a.rates
        for r in range(a.repeats)
    ]


def _row(**values) -> dict:
    """A sustained.csv row of the sweep `_plan` makes, with `values` in place of the defaults."""
    row = {
        "engine": "paged", "model": "opt-13b", "trace": "sharegpt-paper", "block_size": 16,
        "kv_cache_gib": 4.0, "emulate_gpu": "a100-40gb", "seed": 0, "sustained_rate": None,
        "latency_threshold_s": 0.1, "unloaded_latency_s": None, "threshold_source": "--latency-threshold",
        "last_pass_rate": None, "first_fail_rate": None, "last_pass_latency_s": None,
        "first_fail_latency_s": None, "rates_tried": 1, "bisect_cells": 0, "how": "",
    }  # fmt: skip
    assert set(values) <= set(row)
    return {**row, **values}


def test_a_group_of_one_cell_gives_a_whole_row_of_sustained_csv():
    """One rate (2 req/s, 0.05 s/token under --latency-threshold 0.1), one repeat, seed 3:
    passed at every rate; nothing to bisect; every column named as sustained.csv names it."""
    plan = _plan(seed=3, threshold_s=0.1)
    state = Curve(plan, lambda rate, repeat: 0.05)
    grid = _grid(plan)
    state.fill(grid)
    assert sustained_table(plan, state, grid) == [
        _row(seed=3, sustained_rate=2.0, last_pass_rate=2.0, last_pass_latency_s=0.05,
             how="under 0.1 s/token at every swept rate: the sustained rate may be higher")
    ]  # fmt: skip
    assert state.ran == []


def _baselines(plan: SweepPlan, latency: dict[str, float | None]) -> list[Cell]:
    cells = [Cell(BASELINE, e, "sharegpt-paper", None, 16, 4.0, 0) for e in plan.axes.engines]
    return [c for c in cells if c.engine in latency]


def test_every_baseline_failed_gives_a_row_without_a_threshold():
    """No finished baseline, no bound: no rate, no bracket, no bisection, and the row says why."""
    plan = _plan(engines=("paged", "orca-max"), rates=(1.0, 2.0), bisect=2)
    state = Curve(plan, lambda rate, repeat: None if rate is None else 0.05)
    grid = _grid(plan)
    state.fill(grid + _baselines(plan, {"paged": None, "orca-max": None}))
    source = "every baseline of sharegpt-paper failed"
    how = "no threshold: the unloaded cell failed"
    common = {"latency_threshold_s": None, "threshold_source": source, "rates_tried": 2, "how": how}
    assert sustained_table(plan, state, grid) == [_row(**common), _row(engine="orca-max", **common)]
    assert state.ran == []


def test_an_engine_whose_own_baseline_failed_is_judged_against_the_others_bound():
    """paged's baseline failed, orca-max's took 0.025 s/token: both are judged under
    4 x 0.025 = 0.1 s/token; paged's own unloaded latency is unknown (None)."""
    plan = _plan(engines=("paged", "orca-max"), rates=(1.0,))

    def latency(rate, repeat):
        return 0.05 if rate is not None else None

    state = Curve(plan, latency)
    grid = _grid(plan)
    state.fill(grid)
    orca_max_baseline = _baselines(plan, {"orca-max": 0.025})[0]
    state.rows[orca_max_baseline.id] = cell_row(
        orca_max_baseline, plan.config(orca_max_baseline), "ok",
        {"normalized_latency_s": 0.025, "peak_batched_requests": 1}, "", 0.0,
    )  # fmt: skip
    state.fill(_baselines(plan, {"paged": None}))
    table = sustained_table(plan, state, grid)
    assert [row["unloaded_latency_s"] for row in table] == [None, 0.025]
    assert [row["latency_threshold_s"] for row in table] == [pytest.approx(0.1)] * 2
    source = "4 x 0.025 s/token, the lowest unloaded latency of 1 engines (orca-max), shared by all"
    assert [row["threshold_source"] for row in table] == [source, source]
    assert [row["sustained_rate"] for row in table] == [1.0, 1.0]


def test_bisection_runs_every_repeat_of_the_groups_seed_and_averages_the_repeats():
    """Seed 3, two repeats whose latencies are 0.04 and 0.08 below 1.6 req/s (mean 0.06, under
    0.1) and 0.2 and 0.3 above (mean 0.25): grid 1 and 2 bracket the knee; two rounds run 1.5
    (passes) then 1.75 (fails), each for repeats 0 and 1 of seed 3."""
    plan = _plan(rates=(1.0, 2.0), seed=3, repeats=2, threshold_s=0.1, bisect=2)
    state = Curve(plan, lambda rate, repeat: (0.04, 0.08)[repeat] if rate < 1.6 else (0.2, 0.3)[repeat])
    grid = _grid(plan)
    state.fill(grid)
    (row,) = sustained_table(plan, state, grid)
    assert row == _row(
        seed=3, sustained_rate=1.5, last_pass_rate=1.5, first_fail_rate=1.75, rates_tried=4, bisect_cells=4,
        last_pass_latency_s=pytest.approx(0.06), first_fail_latency_s=pytest.approx(0.25),
        how="under 0.1 s/token up to 1.5, over at 1.75 (bisected 2x)",
    )  # fmt: skip
    bisected = [
        Cell(BISECT, "paged", "sharegpt-paper", rate, 16, 4.0, 3, r) for rate in (1.5, 1.75) for r in (0, 1)
    ]
    assert state.ran == bisected and state.planned == bisected


def test_a_bracket_exactly_as_narrow_as_asked_is_not_bisected():
    """Pass at 1, fail at 1.5: (1.5 - 1) / 1 = 0.5, exactly --bracket 0.5: done."""
    plan = _plan(rates=(1.0, 1.5), threshold_s=0.1, bracket=0.5)
    state = Curve(plan, lambda rate, repeat: 0.05 if rate < 1.2 else 0.5)
    grid = _grid(plan)
    state.fill(grid)
    assert sustained_table(plan, state, grid) == [
        _row(sustained_rate=1.0, last_pass_rate=1.0, first_fail_rate=1.5, rates_tried=2,
             last_pass_latency_s=0.05, first_fail_latency_s=0.5, how="under 0.1 s/token up to 1, over at 1.5")
    ]  # fmt: skip
    assert state.ran == []


def test_steps_below_the_grid_stop_at_extend_then_bisection_takes_over():
    """Knee at 0.7 req/s, grid 1 and 2 (both fail), --bracket 0.1, --extend 2, --bisect 1: two
    steps down, each / 1.095 to 4 digits (1 -> 0.9132 -> 0.834, both fail), then one midpoint of
    [0, 0.834): 0.417 passes."""
    plan = _plan(rates=(1.0, 2.0), threshold_s=0.1, bracket=0.1, extend=2, bisect=1)
    state = Curve(plan, lambda rate, repeat: 0.05 if rate < 0.7 else 0.5)
    grid = _grid(plan)
    state.fill(grid)
    assert sustained_table(plan, state, grid) == [
        _row(sustained_rate=0.417, last_pass_rate=0.417, first_fail_rate=0.834, rates_tried=5, bisect_cells=3,
             last_pass_latency_s=0.05, first_fail_latency_s=0.5,
             how="under 0.1 s/token up to 0.417, over at 0.834 (stepped outside the grid 2x, bisected 1x)")
    ]  # fmt: skip
    assert [cell.rate for cell in state.ran] == [0.9132, 0.834, 0.417]


def test_a_rate_where_one_repeat_failed_is_over_the_bound_for_the_search_and_for_the_pages():
    """Three repeats a rate under --latency-threshold 0.1: 0.05 s/token at 1 and 2 req/s but for
    repeat 1 at 2, which failed, and 0.5 at 3. A mean over the finished repeats would pass 2 on
    the two that finished; the one reading (`rate_latency`) counts it over, says so in `how`,
    and the pages' reader of the same rows (`bracket_at`) brackets it where the search did."""
    from kvbench.reproduce.sweeps import bracket_at, rate_latencies

    plan = _plan(rates=(1.0, 2.0, 3.0), repeats=3, threshold_s=0.1)
    state = Curve(plan, lambda rate, r: None if (rate, r) == (2.0, 1) else 0.5 if rate > 2 else 0.05)
    grid = _grid(plan)
    state.fill(grid)
    assert sustained_table(plan, state, grid) == [
        _row(sustained_rate=1.0, last_pass_rate=1.0, first_fail_rate=2.0, rates_tried=3,
             last_pass_latency_s=pytest.approx(0.05), first_fail_latency_s=None,
             how="under 0.1 s/token up to 1, over at 2; 1 of 3 repeats failed at 2 (read as over)")
    ]  # fmt: skip
    rows = list(state.rows.values())
    assert rate_latencies(rows, "paged") == {1.0: pytest.approx(0.05), 2.0: None, 3.0: pytest.approx(0.5)}
    assert bracket_at(rows, "paged", 0.1) == (1.0, 2.0)


def test_partly_failed_rates_are_each_named_in_how_and_wholly_failed_ones_are_not():
    """Repeats failing at 1 (2 of 3, under a pass above it) and at 3 (3 of 3): the search stops
    at 1, yet `how` names every rate swept where some but not all repeats failed, in rate order."""
    failed = {(1.0, 0), (1.0, 2), (3.0, 0), (3.0, 1), (3.0, 2), (2.0, 2)}
    plan = _plan(rates=(3.0, 1.0, 2.0), repeats=3, threshold_s=0.1)
    state = Curve(plan, lambda rate, repeat: None if (rate, repeat) in failed else 0.05)
    grid = _grid(plan)
    state.fill(grid)
    (row,) = sustained_table(plan, state, grid)
    assert row["how"] == (
        "over 0.1 s/token from the lowest rate, 1; 2 of 3 repeats failed at 1, 1 of 3 repeats failed at 2 "
        "(read as over)"
    )
    assert row["sustained_rate"] is None and row["first_fail_rate"] == 1.0


def test_rate_latency_is_the_mean_of_the_repeats_or_none_where_any_has_none():
    assert stats.rate_latency([0.1, 0.3]) == pytest.approx(0.2)
    assert stats.rate_latency([0.04]) == 0.04
    assert stats.rate_latency([0.1, None, 0.3]) is None
    assert stats.rate_latency([None]) is None
    assert stats.rate_latency([]) is None  # no repeat ran: nothing passed
    assert stats.sustained_rate([(1.0, stats.rate_latency([0.05, None]))], 0.1).first_fail == 1.0
