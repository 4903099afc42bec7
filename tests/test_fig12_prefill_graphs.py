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
