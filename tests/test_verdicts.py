"""The verdict rules of `kvbench reproduce` on hand-made tables: ties, tolerance, intervals."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvbench.reproduce.verdicts import (
    DIFFERS,
    INCONCLUSIVE,
    MATCHES,
    NOT_MEASURED,
    RESOLUTION,
    TOLERANCE,
    Interval,
    Verdict,
    order_verdict,
    overall,
    range_verdict,
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


def test_an_interval_that_holds_half_or_twice_the_papers_value_is_inconclusive():
    """A match must be able to tell the paper's number from one twice or half as large."""
    assert RESOLUTION == 2.0
    measured = Interval(10.0, 5.0, 20.0)  # widened: [4.25, 23.0]
    for paper in (8.0, 11.0, 4.25, 23.0):  # 4.0 or 16.0 / 2.125 or 8.5 / 11.5 / 46: one end holds
        assert value_verdict("sustained ratio", measured, paper).outcome == INCONCLUSIVE
    text = str(value_verdict("sustained ratio", measured, 8.0))
    assert text.startswith("inconclusive: sustained ratio: kvbench 10 [5, 20]")
    assert text.endswith("too wide to tell: it holds 16 as well")  # 4 lies below 4.25
    both = str(value_verdict("sustained ratio", measured, 10.0))
    assert both.endswith("too wide to tell: it holds 5 and 20 as well")
    assert value_verdict("sustained ratio", measured, 24.0).outcome == DIFFERS  # outside: refutes
    narrow = Interval(10.0, 8.0, 12.0)  # widened: [6.8, 13.8]
    assert value_verdict("sustained ratio", narrow, 7.0).outcome == MATCHES  # 3.5 and 14 outside
    assert value_verdict("sustained ratio", narrow, 6.85).outcome == INCONCLUSIVE  # 13.7 = 2 x 6.85 inside
    # three seeds that spread like Figure 12's paged/static on ShareGPT at OPT-13B
    spread = Interval.of_samples([9.14, 7.83, 13.87])
    assert value_verdict("paged/static", spread, 8.39).outcome == INCONCLUSIVE
    assert overall([Verdict(MATCHES, "a", ""), Verdict(INCONCLUSIVE, "b", "")]) == INCONCLUSIVE
    assert overall([Verdict(INCONCLUSIVE, "a", ""), Verdict(NOT_MEASURED, "b", "")]) == NOT_MEASURED
    assert overall([Verdict(INCONCLUSIVE, "a", ""), Verdict(DIFFERS, "b", "")]) == DIFFERS


def test_the_interval_of_repeated_runs_is_the_95_percent_t_interval():
    interval = Interval.of_samples([10.0, 12.0, 14.0])  # mean 12, sd 2, t(2) = 4.303
    assert interval.value == 12.0
    assert (interval.low, interval.high) == pytest.approx((12 - 4.303 * 2 / 3**0.5, 12 + 4.303 * 2 / 3**0.5))
    one = Interval.of_samples([5.0])
    assert (one.value, one.low, one.high) == (5.0, 5.0, 5.0)


def test_a_value_over_seeds_only_one_of_which_has_it_is_labelled_one_run():
    """Figure 2's share weighted by the time requests wait exists only in a seed where some
    request waited: a mean over one seed of three is a point, and its verdict says so."""
    nan = math.nan
    one = Interval(97.4, 97.4, 97.4, (97.4, nan, nan))
    assert str(one) == "97.4 (one run: 2 of 3 seeds have none)"
    assert "one run" in value_verdict("token states (%)", one, 96.3).evidence
    assert str(Interval(97.4, 90.0, 99.0, (97.4, 95.0, nan))) == "97.4 [90, 99]"
    assert str(Interval(97.4, 97.4, 97.4)) == "97.4"  # a figure of one seed: nothing left out


def test_a_ratio_of_two_sustained_rate_brackets_is_an_interval():
    paged, oracle = Interval.of_bracket(2.0, 2.2), Interval.of_bracket(1.0, 1.1)  # ratio in [1.82, 2.2]
    assert ratio_verdict("sustained rate ratio paged/orca-oracle", paged, oracle, 1.75).outcome == MATCHES
    assert ratio_verdict("sustained rate ratio paged/orca-oracle", paged, oracle, 2.7).outcome == DIFFERS
    # grid points 2-4x apart cannot confirm a ratio: the interval is wide, and the verdict says so
    coarse = ratio_verdict("ratio", Interval.of_bracket(2.0, 8.0), Interval.of_bracket(1.0, 4.0), 1.75)
    assert coarse.outcome == INCONCLUSIVE and "[0.5, 8]" in coarse.evidence


def test_a_lower_bound_alone_refutes_but_never_confirms():
    """A sustained rate no swept rate failed: [pass, inf). The paper below it widened: differs;
    above it: not measured, never matches."""
    unbounded = Interval.of_bracket(8.0, math.inf)
    assert value_verdict("sustained rate", unbounded, 5.0).outcome == DIFFERS
    verdict = value_verdict("sustained rate", unbounded, 12.0)
    assert verdict.outcome == NOT_MEASURED and "no upper end" in verdict.evidence
    assert ratio_verdict("ratio", unbounded, unbounded, 1.75).outcome == NOT_MEASURED  # [0, inf]


def test_a_best_block_size_matches_only_inside_the_papers_range():
    paper = (16, 128)
    assert range_verdict("best block size", Interval(32, 16, 64), paper).outcome == MATCHES
    # every size tied with the best: the measurement cannot tell 1 or 256 from the paper's sizes
    assert range_verdict("best block size", Interval(1, 1, 256), paper).outcome == INCONCLUSIVE
    assert range_verdict("best block size", Interval(256, 256, 256), paper).outcome == DIFFERS
    assert range_verdict("best block size", Interval(8, 4, 8), paper).outcome == DIFFERS


def test_a_range_verdict_straddling_an_end_neither_confirms_nor_refutes():
    """An interval across one end of the range holds values the paper allows and values it does
    not: inconclusive, whichever side its mean falls on; touching an end from outside is not
    across it."""
    paper = (17.34, 43.93)  # 20.4-38.2 % widened by 15 %
    for measured in (Interval(19.5, 17.0, 22.1), Interval(16.0, 15.0, 18.0), Interval(43.0, 40.0, 50.0)):
        verdict = range_verdict("token states (%)", measured, paper)
        assert verdict.outcome == INCONCLUSIVE and "too wide to tell" in verdict.evidence
    assert range_verdict("token states (%)", Interval(16.0, 15.0, 17.3), paper).outcome == DIFFERS
    assert range_verdict("token states (%)", Interval(45.0, 44.0, 46.0), paper).outcome == DIFFERS
    assert range_verdict("token states (%)", Interval(17.34, 17.34, 17.34), paper).outcome == MATCHES
    # a ratio of sustained rates no swept rate bounded above: never inside a claimed 2-4x
    assert range_verdict("ratio", Interval(1.0, 0.0, math.inf), (2.0, 4.0)).outcome == NOT_MEASURED
    assert range_verdict("ratio", Interval(5.0, 5.0, math.inf), (2.0, 4.0)).outcome == DIFFERS


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


def test_equal_points_where_the_paper_shows_a_gap_are_a_tie():
    """Fig. 13 Alpaca: pow2, oracle and paged all batch the same 29.8 requests, the paper
    43 / 73 / 132: equal single-seed values are a tie, not the paper's order."""
    paper = {"orca-pow2": 43.24, "orca-oracle": 72.75, "paged": 132.44}
    same = {e: Interval(29.8, 29.8, 29.8) for e in paper}
    verdict = order_verdict("mean batched requests, busy-weighted", same, paper)
    assert verdict.outcome == DIFFERS and "(tied)" in verdict.evidence
    # brackets that touch ([16, 32) then [32, 64)) are apart: the first rate failed where the next passed
    touching = {"orca-pow2": Interval.of_bracket(8, 16), "orca-oracle": Interval.of_bracket(16, 32),
                "paged": Interval.of_bracket(32, 64)}  # fmt: skip
    assert order_verdict("sustained rate", touching, paper).outcome == MATCHES


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


def _over_seeds(values: list[float]) -> Interval:
    """An interval over seeds as a merged figure row gives it: each seed's value kept in order."""
    return replace(Interval.of_samples(values), seeds=tuple(values))


def test_overlapping_intervals_over_seeds_are_separated_where_every_seed_ranks_the_engines_alike():
    """Figure 12's ShareGPT sustained rates at OPT-13B over three seeds: orca-max's and
    orca-pow2's t intervals overlap, yet pow2 sustains 1.41-1.53x max in every seed (the same
    trace draw for both); a seed that reverses them leaves the pair tied."""
    paper = {"orca-max": 0.52, "orca-pow2": 0.77}
    low, high = [1.976, 2.4, 2.4], [3.028, 3.611, 3.387]
    unpaired = {"orca-max": Interval.of_samples(low), "orca-pow2": Interval.of_samples(high)}
    assert unpaired["orca-max"].overlaps(unpaired["orca-pow2"])
    assert order_verdict("sustained rate", unpaired, paper).outcome == DIFFERS
    paired = order_verdict(
        "sustained rate", {"orca-max": _over_seeds(low), "orca-pow2": _over_seeds(high)}, paper
    )
    assert paired.outcome == MATCHES and paired.order_only
    assert "separated seed by seed (paired ratios): orca-pow2/orca-max 1.48 [1.33, 1.64]" in paired.evidence
    reversed_seed = [3.028, 2.3, 3.387]
    verdict = order_verdict(
        "sustained rate", {"orca-max": _over_seeds(low), "orca-pow2": _over_seeds(reversed_seed)}, paper
    )
    assert verdict.outcome == DIFFERS and "(tied), seed by seed orca-pow2/orca-max 1.3 [" in verdict.evidence
    # no pairing across different seeds, nor from one seed measured in both
    assert _over_seeds(low).paired_ratio(_over_seeds(high[:2])) is None
    assert _over_seeds([2.0, math.nan]).paired_ratio(_over_seeds([3.0, 4.0])) is None
