"""results/reference/calibration-by-engine: the OPT-13B cost model on replayed-prefill runs, one
fit of both engines against a fit by engine, both held out on other seeds.

The page is generated from the two cost files and the fitting runs, so it must not lag them; both
fits must fit and hold out the same runs, and hold out only other trace draws (seed 0 fitted,
seeds 1 and 2 held out), or the comparison says nothing; each engine's fit must be of that
engine's runs alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "reference" / "calibration-by-engine"


def _seed(run: str) -> int:
    return int(re.search(r"__seed-(\d+)__", run).group(1))


def test_the_committed_page_is_what_the_cost_files_give():
    compare = load_script("results/reference/calibration-by-engine/compare.py")
    regenerate = "PYTHONPATH=. python results/reference/calibration-by-engine/compare.py"
    assert compare.render() == (FOLDER / "comparison.md").read_text(), f"comparison.md lags: run {regenerate}"


def test_both_fits_fit_seed_0_and_hold_out_the_same_other_seeds():
    by_engine, pooled = (json.loads((FOLDER / name).read_text()) for name in ("cost.json", "pooled.json"))
    assert by_engine["runs"] == pooled["runs"] and {_seed(run) for run in by_engine["runs"]} == {0}
    held = {check["run"] for check in by_engine["held_out"]}
    assert held == {check["run"] for check in pooled["held_out"]}
    assert {_seed(run) for run in held} == {1, 2}
    assert "engines" not in pooled
    for engine, fit in by_engine["engines"].items():
        assert fit["runs"] and all(Path(run).name.startswith(f"{engine}__") for run in fit["runs"])
    assert sorted(run for fit in by_engine["engines"].values() for run in fit["runs"]) == sorted(
        by_engine["runs"]
    )


def test_the_fit_held_out_in_load_fits_only_lower_rates_than_it_checks():
    by_rate = json.loads((FOLDER / "by-rate.json").read_text())

    def rate(run: str) -> float:
        return float(re.search(r"__rate-([0-9.]+)__", run).group(1))

    assert {_seed(run) for run in by_rate["runs"]} == {0} and max(map(rate, by_rate["runs"])) < 100
    held = {check["run"] for check in by_rate["held_out"]}
    assert {_seed(run) for run in held} == {1, 2} and min(map(rate, held)) > 100
    assert sorted(by_rate["engines"]) == ["orca-oracle", "paged"]
