"""A reproduction's rows over seeds (kvbench/reproduce/rows.py): each number's mean and 95 % t
interval, brackets kept where wider than the spread, seeds without a value left out, and the
markdown table and figure files that show them.

The intervals here are worked by hand from Student's t (2 and 3 seeds: 12.706 and 4.303), not
from kvbench's own statistics, so a wrong merge cannot agree with itself.
"""

from __future__ import annotations

import math
import statistics

import pytest

from kvbench.reproduce.rows import FigureResult, Row, markdown, merge_seeds, read_figure, write_figure

T975 = {1: 12.706204736174698, 2: 4.302652729911275}  # by degrees of freedom (kvbench: 3 decimals)


def half_width(values: list[float]) -> float:
    return T975[len(values) - 1] * statistics.stdev(values) / math.sqrt(len(values))


def row(metric: str, value, low=None, high=None, paper=None, engine="paged") -> Row:
    return Row("fig13", engine, "sharegpt-paper", metric, value, paper, low, high)


def same_row(a: Row, b: Row) -> bool:
    """Equal rows, NaN seeds equal to NaN."""
    nan_free = [tuple(-1.0 if math.isnan(v) else v for v in r.seeds) for r in (a, b)]
    return a.__class__(**{**a.__dict__, "seeds": ()}) == b.__class__(**{**b.__dict__, "seeds": ()}) and (
        nan_free[0] == nan_free[1]
    )


SEEDS = [
    [row("batch", 1.0, paper=2.5), row("rate", 10.0, 8.0, 12.0), row("flat", 5.0), row("none", None),
     row("gaps", None)],
    [row("batch", 2.0, paper=2.5), row("rate", 10.0, 9.0, 11.0), row("flat", 5.0), row("none", math.inf),
     row("gaps", math.nan), row("late", 7.0, engine="orca-oracle")],
    [row("batch", 3.0, paper=2.5), row("rate", 10.0, 10.0, 14.0), row("flat", 5.0), row("none", None),
     row("gaps", 4.0)],
]  # fmt: skip


def merged() -> dict[str, Row]:
    rows = merge_seeds(SEEDS)
    assert len(rows) == 6 and len({r.metric for r in rows}) == 6
    return {r.metric: r for r in rows}


def test_a_number_over_seeds_is_its_mean_with_a_t_interval():
    batch = merged()["batch"]
    half = half_width([1.0, 2.0, 3.0])
    assert batch.kvbench == 2.0 and batch.n == 3 and batch.paper == 2.5 and batch.seeds == (1.0, 2.0, 3.0)
    assert batch.low == pytest.approx(2.0 - half, rel=1e-3) and batch.high == pytest.approx(
        2.0 + half, rel=1e-4
    )
    assert (batch.figure, batch.engine, batch.workload) == ("fig13", "paged", "sharegpt-paper")


def test_a_bracket_wider_than_the_spread_over_seeds_is_kept():
    """Three seeds all passing 10 req/s: no spread, but each seed's bracket says where the rate
    lies; the merged bracket is the seeds' mean ends (9 and 12.33)."""
    rate = merged()["rate"]
    assert rate.kvbench == 10.0 and rate.n == 3
    assert rate.low == pytest.approx(9.0) and rate.high == pytest.approx(37 / 3)


def test_the_same_value_in_every_seed_is_a_point():
    flat = merged()["flat"]
    assert (flat.kvbench, flat.low, flat.high, flat.n, flat.seeds) == (5.0, None, None, 3, (5.0, 5.0, 5.0))


def test_seeds_without_a_value_are_left_out_and_counted_so():
    """None, NaN and infinity are no measurement: the mean is over the seeds that have one, n
    counts them, and each seed's own value (NaN where it has none) stays for paired ratios."""
    rows = merged()
    gaps, late, none = rows["gaps"], rows["late"], rows["none"]
    assert (gaps.kvbench, gaps.low, gaps.high, gaps.n) == (4.0, None, None, 1)
    assert [math.isnan(v) for v in gaps.seeds] == [True, True, False] and gaps.seeds[2] == 4.0
    assert (late.engine, late.kvbench, late.n) == ("orca-oracle", 7.0, 1)  # in one seed only
    assert [math.isnan(v) for v in late.seeds] == [True, False, True]
    assert none.n == 0 and none.kvbench is None and none.seeds == ()  # the first seed's row, counted empty


def test_one_seed_comes_back_unchanged():
    assert merge_seeds([SEEDS[1]]) == tuple(SEEDS[1])


def test_two_seeds_use_one_degree_of_freedom():
    (two,) = merge_seeds([[row("batch", 1.0)], [row("batch", 4.0)]])
    half = half_width([1.0, 4.0])
    assert (
        two.kvbench == 2.5
        and two.low == pytest.approx(2.5 - half, rel=1e-4)
        and two.high == pytest.approx(2.5 + half, rel=1e-4)
    )


def test_the_markdown_table_shows_intervals_points_gaps_and_the_papers_side():
    rows = (
        row("batch", 2.0, 0.5156, 3.484, paper=2.5),
        row("rate", 150.0, 120.0, math.inf, paper=100.0),
        row("flat", 5.0, None, None),
        row("none", None, paper=30.4),
        row("half", 1.0, 0.5, None),
        row("large", 1234.4, 1200.0, 1300.6, paper=1000.0),
        row("bracket alone", None, 1.0, 2.0),
        Row("fig13", "paged", "sharegpt-paper", "nan", math.nan, None, None, None, 0),
    )
    table = markdown(FigureResult("fig13", "t", rows, "matches: "))
    assert table.split("\n") == [
        "| engine | workload | metric | kvbench [low, high] | n | paper | kvbench / paper |",
        "|---|---|---|---|---|---|---|",
        "| paged | sharegpt-paper | batch | 2 [0.516, 3.48] | 1 | 2.5 | 0.80 |",
        "| paged | sharegpt-paper | rate | 150 [120, inf] | 1 | 100 | 1.50 |",
        "| paged | sharegpt-paper | flat | 5 | 1 | - | - |",
        "| paged | sharegpt-paper | none | - | 1 | 30.4 | - |",
        "| paged | sharegpt-paper | half | 1 | 1 | - | - |",
        "| paged | sharegpt-paper | large | 1234 [1200, 1301] | 1 | 1000 | 1.23 |",
        "| paged | sharegpt-paper | bracket alone | - | 1 | - | - |",
        "| paged | sharegpt-paper | nan | - | 0 | - | - |",
    ]


def test_a_figure_reads_back_as_written(tmp_path):
    rows = merge_seeds(SEEDS)
    result = FigureResult(
        "fig13", "Average batched requests", rows, "differs: x", ("a.png", "b.svg"), ("n1", "n2")
    )
    write_figure(result, tmp_path)
    back = read_figure(tmp_path)
    assert (back.name, back.title, back.verdict, back.plots, back.notes) == (
        "fig13", "Average batched requests", "differs: x", ("a.png", "b.svg"), ("n1", "n2"),
    )  # fmt: skip
    assert len(back.rows) == len(rows) and all(same_row(a, b) for a, b in zip(back.rows, rows, strict=True))
    assert read_figure(tmp_path / "missing") is None
