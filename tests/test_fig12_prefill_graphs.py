"""results/reference/fig12-alpaca-prefill-graphs: Figure 12's Alpaca panel with replayed prefills
beside the reproduction's eager one.

The page is generated from both panels' cells, so it must not lag them; its reading of the
sustained rates at the panel's own bound must be the sweep's (sustained.csv), or the sensitivity
rows at other bounds read the cells some other way; and its ratio intervals must be able to put
the paper outside (a page that could only say "inside" would be no comparison).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "reference" / "fig12-alpaca-prefill-graphs"


@pytest.fixture(scope="module")
def compare():
    return load_script("results/reference/fig12-alpaca-prefill-graphs/compare.py")


def test_the_committed_page_is_what_the_cells_give(compare):
    regenerate = "PYTHONPATH=. python results/reference/fig12-alpaca-prefill-graphs/compare.py"
    assert compare.render() == (FOLDER / "comparison.md").read_text(), f"comparison.md lags: run {regenerate}"


@pytest.mark.parametrize("panel", ["eager (the reproduction's seed 0)", "CUDA graphs (this folder)"])
def test_the_page_reads_each_panel_as_its_sweep_did_at_its_bound(compare, panel):
    folder = compare.PANELS[panel]
    rows = compare.sweep_rows(folder)
    with open(folder / "sustained.csv", newline="") as f:
        sustained = {r["engine"]: r for r in csv.DictReader(f) if int(r["seed"]) == compare.SEED}
    for engine in compare.ENGINES:
        swept = sustained[engine]
        assert float(swept["latency_threshold_s"]) == pytest.approx(compare.BOUND, rel=0.001)
        low, high = compare.bracket_at(rows, engine, float(swept["latency_threshold_s"]))
        assert low == pytest.approx(float(swept["last_pass_rate"]))
        assert high == pytest.approx(float(swept["first_fail_rate"]))


def test_a_ratio_interval_says_where_the_paper_lies(compare):
    """At the bound, both panels put paged below orca-oracle and the paper above; at 1.5 x the
    bound, where paged passes every rate run, the interval is open above and holds the paper."""
    assert pytest.approx(28.1 / 21.1) == compare.PAPER
    for rows in (compare.sweep_rows(folder) for folder in compare.PANELS.values()):
        assert compare.sensitivity_line("x", rows, 1.0).endswith("| paper above |")
        assert compare.sensitivity_line("x", rows, 1.5).endswith("| paper inside |")
        assert compare.bracket_at(rows, "paged", 1.5 * compare.BOUND)[1] == math.inf


def _row(engine: str, rate: float, latency: float | None, status: str = "ok") -> dict:
    return {"engine": engine, "rate": rate, "normalized_latency_s": latency, "status": status}


def test_a_seed_is_read_only_once_done_and_the_seeds_are_judged_together(compare):
    """A pending cell is neither a pass nor a fail: the seed is not done, whatever its neighbours
    say (read as a fail, seed 1's orca-oracle would read [107, 113.5)). Done seeds' ratios of
    last passes are judged together against the paper's, and can differ."""
    bound = compare.BOUND
    under, over = 0.9 * bound, 1.1 * bound
    done = [_row("paged", 94.02, under), _row("paged", 100.5, over),
            _row("orca-oracle", 113.5, under), _row("orca-oracle", 120.0, over)]  # fmt: skip
    late = [*done[:2], _row("orca-oracle", 107.0, under), _row("orca-oracle", 113.5, None, "pending"),
            _row("orca-oracle", 120.0, over)]  # fmt: skip
    wide = [*done[:2], _row("orca-oracle", 94.02, under), _row("orca-oracle", 120.0, over)]
    assert compare.seed_brackets(late) == ({"paged": (94.02, 100.5), "orca-oracle": None}, 1)
    assert compare.seed_brackets(wide)[0]["orca-oracle"] is None  # 28 % wide: bisection goes on
    one = compare.seed_lines({0: done, 1: late})
    assert one[-1] == "Over the seeds: 1 of 2 done, no interval over seeds yet."
    assert "| 1 | [94.02, 100.5) | not done | - | 1 |" in one
    three = compare.seed_lines({0: done, 1: done, 2: done})
    assert three[-1].startswith("Over the seeds: differs: paged / orca-oracle sustained rate")
    assert "kvbench 0.828 (+-15%: [0.704, 0.953]), paper 1.33" in three[-1]
    level = [_row("paged", 140.0, under), _row("paged", 150.0, over), *done[2:]]
    assert compare.seed_lines({0: level, 1: level})[-1].startswith("Over the seeds: matches")
