"""The verdict rules of `kvbench reproduce` on hand-made tables: ties, tolerance, intervals."""

from __future__ import annotations

import pytest

from kvbench.reproduce.verdicts import (
    DIFFERS,
    MATCHES,
    NOT_MEASURED,
    TOLERANCE,
    Interval,
    Verdict,
    order_verdict,
    overall,
    ratio_verdict,
    value_verdict,
)


def test_a_value_matches_only_inside_the_interval_widened_by_the_tolerance():
    measured = Interval(10.0, 9.0, 11.0)  # widened by 15 %: [7.65, 12.65]
    assert TOLERANCE == 0.15
    assert value_verdict("batched requests, busy-weighted", measured, 12.6).outcome == MATCHES
    assert value_verdict("batched requests, busy-weighted", measured, 7.7).outcome == MATCHES
    assert value_verdict("batched requests, busy-weighted", measured, 12.7).outcome == DIFFERS
    assert value_verdict("batched requests, busy-weighted", measured, 7.6).outcome == DIFFERS
    verdict = value_verdict("batched requests, busy-weighted", measured, 30.42)
    text = str(verdict)
    assert text.startswith("differs: batched requests, busy-weighted: kvbench 10 [9, 11]")
    assert "paper 30.4" in text  # both sides of the evidence


def test_the_interval_of_repeated_runs_is_the_95_percent_t_interval():
    interval = Interval.of_samples([10.0, 12.0, 14.0])  # mean 12, sd 2, t(2) = 4.303
    assert interval.value == 12.0
    assert (interval.low, interval.high) == pytest.approx((12 - 4.303 * 2 / 3**0.5, 12 + 4.303 * 2 / 3**0.5))
    one = Interval.of_samples([5.0])
    assert (one.value, one.low, one.high) == (5.0, 5.0, 5.0)


def test_a_ratio_of_two_sustained_rate_brackets_is_an_interval():
    paged, oracle = Interval.of_bracket(2.0, 2.2), Interval.of_bracket(1.0, 1.1)  # ratio in [1.82, 2.2]
    assert ratio_verdict("sustained rate ratio paged/orca-oracle", paged, oracle, 1.75).outcome == MATCHES
    assert ratio_verdict("sustained rate ratio paged/orca-oracle", paged, oracle, 2.7).outcome == DIFFERS
    # grid points 2-4x apart cannot confirm a ratio: the interval is wide, and says so
    coarse = ratio_verdict("ratio", Interval.of_bracket(2.0, 8.0), Interval.of_bracket(1.0, 4.0), 1.75)
    assert coarse.outcome == MATCHES and "[0.5, 8]" in coarse.evidence


def test_a_tie_where_the_paper_shows_a_gap_differs():
    paper = {"orca-pow2": 16.1, "orca-oracle": 21.1, "paged": 28.1}  # Fig. 12 Alpaca, req/s
    tied = {e: Interval.of_bracket(16.0, 32.0) for e in paper}  # all three at the top of the grid
    verdict = order_verdict("sustained rate", tied, paper)
    assert verdict.outcome == DIFFERS and verdict.order_only and "(tied)" in verdict.evidence
    assert str(verdict).startswith("differs (order only): sustained rate")
    apart = {
        "orca-pow2": Interval.of_bracket(15.0, 16.5),
        "orca-oracle": Interval.of_bracket(20.0, 22.0),
        "paged": Interval.of_bracket(27.0, 29.0),
    }
    assert order_verdict("sustained rate", apart, paper).outcome == MATCHES
    reversed_order = {**apart, "paged": Interval.of_bracket(10.0, 11.0)}
    assert order_verdict("sustained rate", reversed_order, paper).outcome == DIFFERS


def test_engines_the_paper_shows_within_the_tolerance_may_come_in_either_order():
    paper = {"a": 10.0, "b": 10.5, "c": 20.0}  # a and b within 15 % of each other
    measured = {"a": Interval(11.0, 10.8, 11.2), "b": Interval(10.0, 9.8, 10.2), "c": Interval(20.0, 19, 21)}
    assert order_verdict("x", measured, paper).outcome == MATCHES


def test_a_missing_engine_is_not_a_match():
    paper = {"a": 1.0, "b": 2.0}
    assert order_verdict("x", {"a": Interval(1.0, 1.0, 1.0)}, paper).outcome == DIFFERS


def test_a_measurement_resting_on_an_assumed_constant_is_not_measured():
    verdict = ratio_verdict(
        "Fig. 19 overhead",
        Interval(1.2, 1.1, 1.3),
        Interval(1.0, 1.0, 1.0),
        1.2,
        assumed="swap cost per block",
    )
    assert verdict.outcome == NOT_MEASURED and "assumed swap cost per block" in verdict.evidence


def test_a_figure_differs_if_any_part_differs():
    ok, bad, unknown = (Verdict(MATCHES, "m", ""), Verdict(DIFFERS, "m", ""), Verdict(NOT_MEASURED, "m", ""))
    assert overall([ok, ok]) == MATCHES
    assert overall([ok, unknown]) == NOT_MEASURED
    assert overall([ok, unknown, bad]) == DIFFERS
    assert overall([]) == NOT_MEASURED
