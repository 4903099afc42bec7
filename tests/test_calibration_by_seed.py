"""results/reference/opt-13b-calibration-by-seed: a second fit of the OPT-13B cost model, and the
page that sets its held-out errors beside the reproduction's own fit.

The page is generated from the cost files, so it must not lag them; the fit must hold out
only other trace draws (seed 0 fitted, seeds 1 and 2 held out) or its errors say nothing; and the
comparison must judge both fits on the same runs, which a cost file holding out other runs than
the other's would break.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "reference" / "opt-13b-calibration-by-seed"


@pytest.fixture(scope="module")
def compare():
    return load_script("results/reference/opt-13b-calibration-by-seed/compare.py")


def _seed(run: str) -> int:
    return int(re.search(r"/seed-(\d+)/", run).group(1))


def test_the_committed_page_is_what_the_cost_files_give(compare):
    regenerate = "PYTHONPATH=. python results/reference/opt-13b-calibration-by-seed/compare.py"
    assert compare.render() == (FOLDER / "comparison.md").read_text(), f"comparison.md lags: run {regenerate}"


def test_the_fit_holds_out_only_other_trace_draws():
    cost = json.loads((FOLDER / "cost.json").read_text())
    assert cost["model"] == "opt-13b" and cost["runs"]
    assert {_seed(run) for run in cost["runs"]} == {0}
    assert {_seed(check["run"]) for check in cost["held_out"]} == {1, 2}


def test_only_runs_both_fits_hold_out_are_compared(compare, tmp_path):
    """A run one fit holds out and the other does not is left out of both columns."""
    ours = json.loads((FOLDER / "cost.json").read_text())
    first = ours["held_out"][0]["run"]
    ours["held_out"] = [c for c in ours["held_out"] if c["run"] != first]
    (tmp_path / "cost.json").write_text(json.dumps(ours))
    page = compare.render({**compare.FITS, list(compare.FITS)[1]: tmp_path / "cost.json"})
    runs = int(re.search(r"(\d+) runs held out by all", page).group(1))
    whole = int(re.search(r"(\d+) runs held out by all", compare.render()).group(1))
    assert runs == whole - 1
    assert (
        "| sharegpt-paper | loaded | normalized_latency_s | 33 | 17 | 9.9 % | 57.4 % | 21 | 6.6 % | 28.0 % |"
        in (compare.render())
    )
