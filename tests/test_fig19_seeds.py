"""results/reproduce/opt-13b-h200/fig19/seeds.md is what fig19_seeds.py makes of the committed runs.

The page is the record of Figure 19's progress between device sessions (every seed's cells, and
the figure's verdicts over the seeds complete so far), so it must not lag the runs it reads: this
regenerates it in memory and fails on any difference. It also checks that the verdicts are
judged over complete seeds alone, and that a missing cell shows as one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "reproduce" / "opt-13b-h200"
REGENERATE = "PYTHONPATH=. python results/reproduce/opt-13b-h200/fig19_seeds.py"


@pytest.fixture(scope="module")
def seeds():
    return load_script("results/reproduce/opt-13b-h200/fig19_seeds.py")


def test_the_committed_page_is_what_the_runs_give(seeds):
    committed = (FOLDER / "fig19" / "seeds.md").read_text()
    assert seeds.render() == committed, f"fig19/seeds.md lags the runs: run {REGENERATE}"


def test_verdicts_are_over_complete_seeds_and_a_missing_cell_shows(seeds, tmp_path):
    shutil.copytree(FOLDER / "fig19" / "seed-1", tmp_path / "fig19" / "seed-1")
    whole = seeds.render(tmp_path)
    assert "## Seed 1 (complete)" in whole and "## Verdicts over the complete seed: differs" in whole
    assert "| 16 | 117 / 121 | 0.0500 / 0.0497 | 0.995 | 4.0 / 8.2 |" in whole
    swap = tmp_path / "fig19" / "seed-1" / "swap" / "cells"
    shutil.move(next(swap.glob("*__bs-16__*")), tmp_path / "aside")  # a run set aside
    cut = seeds.render(tmp_path)
    assert "## Seed 1 (17 of 18 cells)" in cut and "Verdicts" not in cut
    assert "| 16 | 117 / - | 0.0500 / - | - | 4.0 / - |" in cut
