"""results/reference/fig12-alpaca-prefill-graphs-baselines: the replayed Alpaca panel's five
engines, paged's ratios over each against the paper's, and the committed prediction's outcome.

The page is generated from the cells, so it must not lag them; it must read each engine's bracket
as its sweep did (sustained.csv); a verdict on one seed must say it is one run; and both the
verdicts and the prediction's outcome must be able to come out against (a page that could only
say "matches" or "inside" would be no comparison).
"""

from __future__ import annotations

import csv
import math

import pytest

from kvbench.reproduce.panel import done_brackets, end_margins, seed_cells
from kvbench.reproduce.sweeps import bracket_at
from tests.support import load_script

SCRIPT = "results/reference/fig12-alpaca-prefill-graphs-baselines/compare.py"


@pytest.fixture(scope="module")
def compare():
    return load_script(SCRIPT)


def test_the_committed_page_is_what_the_cells_give(compare):
    page = (compare.HERE / "comparison.md").read_text()
    assert compare.render() == page, f"comparison.md lags: run PYTHONPATH=. python {SCRIPT}"


@pytest.mark.parametrize("engine", ["static", "orca-max", "orca-pow2"])
def test_the_page_reads_each_engine_as_its_sweep_did(compare, engine):
    with open(compare.HERE / engine / "sustained.csv", newline="") as f:
        swept = {int(r["seed"]): r for r in csv.DictReader(f)}
    for seed, row in swept.items():
        assert float(row["latency_threshold_s"]) == pytest.approx(compare.BOUND)
        rows = compare.cells(seed)
        brackets, pending = done_brackets(rows, compare.ENGINES, compare.BOUND, compare.BRACKET)
        assert pending == 0
        swept_bracket = (float(row["last_pass_rate"]), float(row["first_fail_rate"]))
        assert brackets[engine] == pytest.approx(swept_bracket)


def _done(paged: tuple[float, float], other: tuple[float, float]) -> tuple[dict, int]:
    brackets = dict.fromkeys(("paged", "orca-oracle", "static", "orca-max", "orca-pow2"))
    return {**brackets, "paged": paged, "orca-max": other}, 0


def test_a_ratio_verdict_names_one_run_and_can_differ(compare):
    """Paged [94, 100) over Orca-Max [12.5, 13.75) is [6.84, 8.0]: the paper's 7.3 inside; over
    [9.4, 10.0) it is [9.4, 10.6], the paper's below even widened by 15 %."""
    inside = compare.ratio_lines({0: _done((94.0, 100.0), (12.5, 13.75))})
    line = next(x for x in inside if x.startswith("| orca-max |"))
    assert "| matches: paged / orca-max sustained rate at 0.0328 s/token, one run" in line
    outside = compare.ratio_lines({0: _done((94.0, 100.0), (9.4, 10.0))})
    line = next(x for x in outside if x.startswith("| orca-max |"))
    assert "| differs: paged / orca-max" in line and "one run" in line
    assert next(x for x in inside if x.startswith("| static |")).endswith("| no seed done in both |")


def test_seeds_done_in_both_are_judged_together(compare):
    seeds = {0: ((94.0, 100.0), (12.5, 13.75)), 1: ((100.0, 107.0), (12.5, 13.75)), 2: ((94.0, 100.0), None)}
    two = compare.ratio_lines({seed: _done(*pair) for seed, pair in seeds.items()})
    line = next(x for x in two if x.startswith("| orca-max |"))
    assert "per-seed last passes, 2 seeds" in line and "| - |" in line
    assert f"kvbench {(94 / 12.5 + 100 / 12.5) / 2:.3g} [" in line


def test_a_prediction_can_be_refuted_and_an_in_sample_one_is_marked(compare, monkeypatch):
    monkeypatch.setattr(compare, "predicted", lambda engine, seed, name: (80.0, 88.0))
    by_seed = {
        seed: ({**dict.fromkeys(compare.ENGINES), "orca-pow2": found}, 0)
        for seed, found in ((0, (76.0, 80.0)), (1, (80.0, 88.0)), (2, (88.0, 96.0)), (3, None))
    }
    lines = [x for x in compare.bracket_lines(by_seed) if x.startswith("| orca-pow2 |")]
    outcomes = [[cell.strip() for cell in x.split("|")[6:-1:2]] for x in lines]
    assert compare.PREDICTIONS == ("prediction", "placement", "one-fit")  # placement, one-fit: seed 0 fitted
    assert outcomes == [
        ["below", "below (in sample)", "below (in sample)"], ["inside"] * 3, ["above"] * 3, ["-"] * 3
    ]
    assert compare.against((80.0, 84.0), (82.0, 88.0)) == "overlaps"
    assert compare.against((80.0, 84.0), (80.0, 88.0)) == "inside"  # bisected within the prediction


def test_a_seed_is_read_from_its_own_cells_and_a_pending_cell_is_no_fail(tmp_path):
    """`seed_cells` keeps one seed's loaded cells in engine then rate order; `done_brackets` leaves
    an engine with a pending cell not done even where its other cells bracket narrowly, and one
    whose every rate passed (no fail to bracket) not done either."""
    columns = ("cell_id", "role", "status", "engine", "rate", "seed", "normalized_latency_s")
    rows = [
        ("b", "baseline", "ok", "static", "1", "0", "0.01"),
        ("1", "sweep", "ok", "static", "12.5", "0", "0.02"),
        ("2", "sweep", "ok", "static", "13.75", "0", "0.04"),
        ("3", "sweep", "ok", "static", "12.5", "1", "0.05"),
        ("4", "sweep", "ok", "orca-max", "11", "0", "0.02"),
        ("5", "sweep", "ok", "orca-max", "11.5", "0", "0.04"),
        ("6", "sweep", "pending", "orca-max", "12", "0", ""),
        ("7", "sweep", "ok", "orca-pow2", "80", "0", "0.02"),
    ]
    path = tmp_path / "sweep.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([columns, *rows])
    engines = ("static", "orca-max", "orca-pow2")
    cells = seed_cells(path, engines, 0)
    assert [r["cell_id"] for r in cells] == ["1", "2", "4", "5", "6", "7"]
    assert cells[4]["normalized_latency_s"] is None
    brackets, pending = done_brackets(cells, engines, 0.03, 0.1)
    assert pending == 1
    # static's bracket is 10 % wide, as wide as the sweep bisects to: done; orca-max's is 4.5 %
    # wide, but a grid cell above it is still to run
    assert brackets == {"static": (12.5, 13.75), "orca-max": None, "orca-pow2": None}
    assert bracket_at(cells, "orca-max", 0.03) == (11.0, 11.5)
    assert done_brackets(cells, engines, 0.03, 0.09)[0]["static"] is None  # wider than 9 %: not done
    assert done_brackets(seed_cells(path, engines, 1), engines, 0.06, 0.1)[0]["static"] is None
    assert math.isinf(bracket_at(cells, "orca-pow2", 0.03)[1])  # passed at every rate: no first fail
    # each end against the bound: 0.02 and 0.04 under 0.03; a pending cell's end has no latency
    assert end_margins(cells, "static", (12.5, 13.75), 0.03) == pytest.approx((-1 / 3, 1 / 3))
    assert end_margins(cells, "orca-max", (11.5, 12.0), 0.03) == (pytest.approx(1 / 3), None)
