"""The claims table's rules, each on hand-made figure rows (`kvbench.reproduce.claims`).

A claim's verdict is only as good as the quantity it takes from the figures and the rule it holds
it against: the engine a claim is about, the share it turns into waste, the range or level it is
judged by. Each test builds the rows a figure would write and checks the verdict and the evidence
a reader sees in claims.md, so a judge that picked another engine, flipped an interval or dropped
a trace would fail here.
"""

from __future__ import annotations

import math

from kvbench.reproduce.claims import CLAIMS, NO_SHARE, claim_verdict, claims_table
from kvbench.reproduce.rows import Row

SHAREGPT, ALPACA = "sharegpt-paper", "alpaca-paper"


def _claim(text: str):
    return next(c for c in CLAIMS if c.text == text)


def _fig2(**token_states) -> list[Row]:
    """Figure 2's token-state shares (%), each (mean, low, high) or a point."""
    rows = []
    for engine, share in token_states.items():
        value, low, high = share if isinstance(share, tuple) else (share, None, None)
        rows.append(Row("fig2", engine.replace("_", "-"), SHAREGPT, "token_states_%", value, None, low, high))
    return rows


UNUSED = "without paging, up to 60 % of KV memory is unused"
USEFUL = "20.4-38.2 % useful occupancy (Orca variants)"
WASTE_SUMMARIES, WASTE_PAPER = "~5 % fragmentation with paging", "< 4 % waste with PagedAttention"
PARALLEL = "up to 4x more parallel requests"
PAGES = "pages of 128-256 tokens"


def test_unused_memory_is_judged_on_the_engine_that_leaves_the_most_unused():
    """100 less the token-state share, its interval turned round: static's 40 [38, 42] % is 60
    [58, 62] % unused, which matches "up to 60 %"; the Orca variants' smaller waste is not the
    one judged."""
    rows = _fig2(static=(40.0, 38.0, 42.0), orca_max=(70.0, 69.0, 71.0), orca_pow2=75.0, orca_oracle=80.0)
    verdict = claim_verdict(_claim(UNUSED), rows)
    assert verdict == "matches"
    wasteful = _fig2(static=(8.3, 8.0, 8.6), orca_max=20.0, orca_pow2=28.0, orca_oracle=38.0)
    verdict = claim_verdict(_claim(UNUSED), wasteful)
    assert verdict.startswith(
        "differs (differs: unused KV share of static, time-weighted while requests wait:"
    )
    assert "kvbench 91.7 [91.4, 92] (+-15%: [77.7, 106]), paper 60" in verdict
    table = claims_table(wasteful)
    assert "static 91.7 %, orca-max 80.0 %, orca-pow2 72.0 %, orca-oracle 62.0 %" in table


def test_a_share_no_request_waited_for_says_so_rather_than_a_number():
    rows = _fig2(static=math.nan, orca_max=20.0, orca_pow2=28.0, orca_oracle=38.0)
    assert f"static {NO_SHARE}, orca-max 80.0 %" in claims_table(rows)
    # the NaN share is no measurement: the judged engine is the largest one measured
    assert "unused KV share of orca-max" in claim_verdict(_claim(UNUSED), rows)


def test_pagings_waste_is_judged_against_each_claims_range():
    inside = _fig2(paged=(97.4, 96.5, 98.3))  # waste 2.6 [1.7, 3.5]
    assert claim_verdict(_claim(WASTE_SUMMARIES), inside) == "matches"
    assert claim_verdict(_claim(WASTE_PAPER), inside) == "matches"
    across = _fig2(paged=(96.5, 95.5, 97.5))  # waste 3.5 [2.5, 4.5]: across 4, inside 5
    assert claim_verdict(_claim(WASTE_SUMMARIES), across) == "matches"
    verdict = claim_verdict(_claim(WASTE_PAPER), across)
    assert verdict.startswith("inconclusive (") and "kvbench 3.5 [2.5, 4.5], paper 0-4" in verdict
    outside = _fig2(paged=(90.0, 89.0, 91.0))  # waste 10 [9, 11]
    assert claim_verdict(_claim(WASTE_PAPER), outside).startswith("differs (")
    assert claim_verdict(_claim(WASTE_SUMMARIES), outside).startswith("differs (")
    assert "paged wastes 10.0 % of the KV arena (token states 90.0 %)" in claims_table(outside)


def test_orca_useful_occupancy_is_judged_inside_the_papers_range_widened_by_the_tolerance():
    """20.4-38.2 % widened by 15 % is 17.34-43.93: every Orca variant's interval is judged, and
    the claim takes the worst part."""
    inside = _fig2(orca_max=(20.0, 18.0, 22.0), orca_pow2=(28.0, 26.0, 30.0), orca_oracle=(38.0, 37.0, 39.0))
    assert claim_verdict(_claim(USEFUL), inside) == "matches"
    across = _fig2(orca_max=(19.5, 17.0, 22.1), orca_pow2=(28.0, 26.0, 30.0), orca_oracle=(38.0, 37.0, 39.0))
    verdict = claim_verdict(_claim(USEFUL), across)
    assert verdict.startswith(
        "inconclusive (inconclusive: orca-max token states (%): kvbench 19.5 [17, 22.1]"
    )
    assert "paper 17.34-43.93" in verdict and "orca-pow2" not in verdict
    outside = _fig2(orca_max=(19.5, 17.0, 22.1), orca_pow2=(28.0, 26.0, 30.0), orca_oracle=(46.0, 45.0, 47.0))
    assert claim_verdict(_claim(USEFUL), outside).startswith("differs (")


def _batched(trace: str, paged: tuple, max_: tuple) -> list[Row]:
    return [
        Row("fig13", "paged", trace, "mean_batched_requests", *paged[:1], None, *paged[1:]),
        Row("fig13", "orca-max", trace, "mean_batched_requests", *max_[:1], None, *max_[1:]),
    ]


def test_parallel_requests_are_paged_over_orca_max_as_an_interval_and_either_trace_may_match():
    """The ratio's interval runs from paged's low over Orca-Max's high to paged's high over its
    low; "up to 4x" matches if one trace's ratio holds 4 (the claim's "up to")."""
    sharegpt = _batched(SHAREGPT, (28.0, 26.0, 30.0), (7.0, 6.5, 7.5))  # 4 [3.47, 4.62]
    alpaca = _batched(ALPACA, (70.0, 60.0, 80.0), (7.0, 6.8, 7.2))  # 10 [8.33, 11.8]
    assert claim_verdict(_claim(PARALLEL), sharegpt + alpaca) == "matches"
    verdict = claim_verdict(_claim(PARALLEL), alpaca)
    assert verdict.startswith(
        "differs (differs: alpaca-paper paged/orca-max mean batched requests, busy-weighted:"
    )
    assert "kvbench 10 [8.33, 11.8]" in verdict
    assert "sharegpt-paper paged/orca-max 4.00x, alpaca-paper paged/orca-max 10.00x" in claims_table(
        sharegpt + alpaca
    )


def test_parallel_requests_with_no_orca_max_batch_are_not_judged():
    rows = _batched(SHAREGPT, (28.0, 26.0, 30.0), (0.0, 0.0, 0.0))
    assert claim_verdict(_claim(PARALLEL), rows) == "not measured"


def test_the_best_block_size_is_judged_inside_128_to_256():
    def best(size: float) -> list[Row]:
        return [Row("fig18b", "paged", trace, "best_block_size", size) for trace in (SHAREGPT, ALPACA)]

    assert claim_verdict(_claim(PAGES), best(128.0)) == "matches"
    assert claim_verdict(_claim(PAGES), best(256.0)) == "matches"
    verdict = claim_verdict(_claim(PAGES), best(16.0))
    assert (
        verdict.startswith("differs (")
        and "sharegpt-paper best block size: kvbench 16, paper 128-256" in verdict
    )
    assert claim_verdict(_claim(PAGES), best(math.nan)) == "not measured"
    assert "end-to-end best block size: sharegpt-paper best 16, alpaca-paper best 16" in claims_table(
        best(16.0)
    )


def test_a_claim_whose_figure_did_not_run_is_not_measured_and_says_which_figure():
    table = claims_table([])
    for claim in CLAIMS:
        assert claim_verdict(claim, []) == "not measured"
    assert "not measured in this folder: no fig13/figure.json (`kvbench reproduce fig13` writes it" in table
    assert "not measured in this folder: no fig12/figure.json" in table
    assert table.count("\n") == len(CLAIMS) + 1  # the header, its rule and one row a claim
    for claim in CLAIMS:
        if claim.needs:  # nothing measured: the row says which figure to run, never a measure's frame
            assert (
                f"| {claim.text} | {claim.source} | not measured in this folder: no {claim.needs}/" in table
            )


def _ratio(
    pair: str, value: float, low: float, high: float, trace: str = SHAREGPT, metric: str = "sustained_ratio"
):
    return Row("fig12", pair, trace, metric, value, None, low, high)


def test_the_throughput_claim_names_each_part_and_holds_it_to_2_to_4x():
    """4.5 [4.2, 4.8] lies wholly above 2-4x: a differs naming the pair; the parts inside are not
    reasons; two failing parts are listed apart."""
    claim = _claim("2-4x higher throughput")
    rows = [_ratio("paged/orca-oracle", 2.5, 2.2, 2.8), _ratio("paged/orca-max", 4.5, 4.2, 4.8)]
    verdict = claim_verdict(claim, rows)
    assert verdict == (
        "differs (differs: sharegpt-paper paged/orca-max sustained rate: kvbench 4.5 [4.2, 4.8], paper 2-4)"
    )
    both = [
        *rows,
        _ratio("paged/orca-oracle", 0.5, 0.4, 0.6, ALPACA),
        _ratio("paged/orca-max", 3.0, 2.5, 3.5, ALPACA),
    ]
    assert "paper 2-4; differs: alpaca-paper paged/orca-oracle sustained rate: kvbench 0.5 [0.4, 0.6]" in (
        claim_verdict(claim, both)
    )
    unmeasured = [
        Row("fig12", "paged", ALPACA, "sustained_rate", 7.4, 28.1),
        _ratio("paged/orca-max", None, None, None),
    ]
    verdict = claim_verdict(claim, unmeasured)
    assert (
        "differs: alpaca-paper paged/orca-oracle sustained rate: no measurement: an engine sustained"
        in verdict
    )
    # a ratio row without a value is no measurement of its pair, not a crash
    assert "differs: sharegpt-paper paged/orca-max sustained rate: no measurement" in verdict


def test_the_papers_sharegpt_ranges_name_the_missing_ratio():
    claim = _claim(
        "ShareGPT: 1.7-2.7x the rate of Orca (Oracle), 2.7-8x Orca (Max), up to 22x FasterTransformer"
    )
    rows = [
        Row("fig12", "paged", SHAREGPT, "sustained_rate", 7.4, 1.93),
        _ratio("paged/orca-max", 3.66, 3.13, 4.18),
    ]
    verdict = claim_verdict(claim, rows)
    assert verdict.startswith(
        "differs (differs: sharegpt-paper paged/orca-oracle sustained rate: no measurement"
    )
    assert "differs: sharegpt-paper paged/static sustained rate: no measurement" in verdict


def test_each_orca_variant_and_each_trace_is_judged():
    pow2_outside = _fig2(
        orca_max=(20.0, 18.0, 22.0), orca_pow2=(50.0, 48.0, 52.0), orca_oracle=(38.0, 37.0, 39.0)
    )
    assert "orca-pow2 token states (%)" in claim_verdict(_claim(USEFUL), pow2_outside)
    alpaca_only = [
        Row("fig18b", "paged", SHAREGPT, "best_block_size", 128.0),
        Row("fig18b", "paged", ALPACA, "best_block_size", 16.0),
    ]
    assert "alpaca-paper best block size: kvbench 16, paper 128-256" in claim_verdict(
        _claim(PAGES), alpaca_only
    )
    waste = claim_verdict(_claim(WASTE_PAPER), _fig2(paged=(90.0, 89.0, 91.0)))
    assert (
        waste == "differs (differs: paged's KV share not holding token states: kvbench 10 [9, 11], paper 0-4)"
    )


def test_up_to_4x_parallel_requests_is_a_level_held_to_the_tolerance():
    """3.6 [3.5, 3.7] widened by 15 % is [2.98, 4.26]: it holds 4, and neither 2 nor 8."""
    rows = _batched(SHAREGPT, (25.2, 24.5, 25.9), (7.0, 7.0, 7.0))
    assert claim_verdict(_claim(PARALLEL), rows) == "matches"


def test_the_claims_table_shows_each_claims_evidence_as_measured():
    rows = [
        *_fig2(static=8.3, orca_max=20.0, orca_pow2=28.0, orca_oracle=38.0, paged=97.5),
        _ratio("paged/orca-oracle", 1.95, 1.79, 2.14), _ratio("paged/orca-max", 3.66, 3.13, 4.18),
        _ratio("paged/static", 10.8, 4.04, 17.6),
        _ratio("paged/orca-oracle", 1.9, 1.69, 2.12, metric="capacity_ratio"),
    ]  # fmt: skip
    table = claims_table(rows)
    assert (
        "| 2-4x higher throughput | summaries | sharegpt-paper paged/orca-oracle: sustained rate "
        "1.95 [1.79, 2.14], capacity 1.9 [1.69, 2.12]; sharegpt-paper paged/orca-max: sustained rate "
        "3.66 [3.13, 4.18], capacity - (sustained: the paper's measure; capacity: most completed req/s) |"
    ) in table
    assert (
        "| 10-20x throughput | summaries | paged/static (FasterTransformer-like) 10.80x on ShareGPT; "
        "the 10-20x figure is against HF Transformers, which kvbench runs only for real (hf-generate) "
        "| not measured |"
    ) in table
    assert ("closest: orca-max reserves 5.0x the slots its tokens use, paged 1.03x | not measured |") in table
    assert (
        "| ShareGPT: 1.7-2.7x the rate of Orca (Oracle), 2.7-8x Orca (Max), up to 22x FasterTransformer "
        "| paper | sharegpt-paper sustained rate: paged/orca-oracle 1.95 [1.79, 2.14] (paper 1.7-2.7), "
        "paged/orca-max 3.66 [3.13, 4.18] (paper 2.7-8), paged/static 10.8 [4.04, 17.6] (paper 1-22) "
        "| matches |"
    ) in table
    assert (
        "| <1 % latency overhead thanks to GPU-optimized page lookups | summaries | not measured by these "
        "figures (whole runs, where attention is one kernel among many); `kvbench kernels` measures it: "
        "on the H200 kvbench's paged decode kernel took 0.99-1.03x the time of its contiguous mode in "
        "every cell (results/reference/kernels-bench) | not measured |"
    ) in table
    nan = claims_table(_fig2(static=8.3, orca_max=math.nan, orca_pow2=28.0, orca_oracle=38.0, paged=math.nan))
    assert f"closest: orca-max reserves {NO_SHARE} the slots its tokens use, paged {NO_SHARE} |" in nan


def test_the_claims_tables_text_as_a_reader_sees_it():
    rows = [
        *_fig2(static=8.3, orca_max=30.0, orca_pow2=28.0, orca_oracle=38.0),
        *_batched(SHAREGPT, (28.0, 26.0, 30.0), (7.0, 6.5, 7.5)),
        Row("fig13", "orca-oracle", SHAREGPT, "mean_batched_requests", 14.0),
        Row("fig18b", "paged", SHAREGPT, "best_block_size", 32.0),
        _ratio("paged/orca-oracle", 1.9, 1.69, 2.12, metric="capacity_ratio"),
    ]
    table = claims_table(rows)
    assert table.startswith("| claim | who says it | kvbench measured | verdict |\n|---|---|---|---|\n| ")
    assert (
        "| summaries | unused (not token states) in contiguous engines: static 91.7 %, orca-max 70.0 %, "
        "orca-pow2 72.0 %, orca-oracle 62.0 % |"
    ) in table
    assert "| paper | token states orca-max 30.0 %, orca-pow2 28.0 %, orca-oracle 38.0 % |" in table
    assert (
        "| mean batched requests sharegpt-paper paged/orca-oracle 2.00x, "
        "sharegpt-paper paged/orca-max 4.00x |" in (table)
    )
    assert "| end-to-end best block size: sharegpt-paper best 32 (paper 16-128 / 16-32) |" in table
    assert (
        "sharegpt-paper paged/orca-oracle: sustained rate -, capacity 1.9 [1.69, 2.12] (sustained:" in table
    )
    # no paged share (paged did not run Figure 2): its reservation reads as none, 1.00x
    assert "closest: orca-max reserves 3.3x the slots its tokens use, paged 1.00x |" in table
    assert len(table.split("\n")) == len(CLAIMS) + 2
