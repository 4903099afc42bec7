"""results/reference/calibration-knee-gain: one fit of the replayed panel's runs with a decode knee
the default rule drops, beside the same fit without it and the fit by engine.

The page is generated from the three cost files and the unseen engines' cells, so it must not
lag them; the fits must be of the same runs and hold out the same ones (or the comparison is of
different questions); and the knee file must say the rule it was fitted under, and have a knee
the default fit of the same runs has not.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "reference" / "calibration-knee-gain"


def test_the_committed_page_is_what_the_files_give():
    compare = load_script("results/reference/calibration-knee-gain/compare.py")
    regenerate = "PYTHONPATH=. python results/reference/calibration-knee-gain/compare.py"
    assert compare.render() == (FOLDER / "comparison.md").read_text(), f"comparison.md lags: run {regenerate}"


def test_the_fits_share_their_runs_and_only_the_rule_differs():
    knee = json.loads((FOLDER / "cost.json").read_text())
    default = json.loads((ROOT / "results/reference/calibration-by-engine/pooled.json").read_text())
    assert knee["runs"] == default["runs"]
    assert {c["run"] for c in knee["held_out"]} == {c["run"] for c in default["held_out"]}
    assert knee["knee_gain"] == 0.9 and "knee_gain" not in default
    assert knee["knee_batch"] is not None and knee["per_row_above_knee_s"] > 0
    assert default["knee_batch"] is None
