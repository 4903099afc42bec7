"""results/reproduce/opt-13b-h200/fig12/panels.md is what fig12_panels.py makes of the committed runs.

The page is the record of Figure 12's progress between device sessions (each panel's bound,
commits, runs and brackets, and paged's ratios per seed), so it must not lag the runs it reads:
this regenerates it in memory and fails on any difference. It also checks that the page follows
the runs: a run set aside (its folder moved out of `cells/`) leaves its panel's count and is
named as set aside, and a panel whose sustained.csv is not written yet is judged from its rows
against the shared bound of its baselines.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "reproduce" / "opt-13b-h200"
REGENERATE = "PYTHONPATH=. python results/reproduce/opt-13b-h200/fig12_panels.py"


@pytest.fixture(scope="module")
def panels():
    return load_script("results/reproduce/opt-13b-h200/fig12_panels.py")


def test_the_committed_page_is_what_the_runs_give(panels):
    committed = (FOLDER / "fig12" / "panels.md").read_text()
    assert panels.render() == committed, f"fig12/panels.md lags the runs: run {REGENERATE}"


def _copy_panel(tmp_path: Path, seed: int, trace: str) -> Path:
    """One committed panel (sweep files and cells) copied into a scratch reproduction folder."""
    source = FOLDER / "fig12" / f"seed-{seed}" / trace
    target = tmp_path / "fig12" / f"seed-{seed}" / trace
    shutil.copytree(source, target)
    return target


def test_a_run_set_aside_leaves_the_count_and_is_named(panels, tmp_path):
    panel = _copy_panel(tmp_path, 0, "sharegpt-paper")
    before = panels.render(tmp_path)
    assert "Runs: 5 baselines and 11 loaded runs" in before and "set aside" not in before
    cell = next((panel / "cells").glob("paged__*rate-8.1__*"))
    shutil.move(cell, tmp_path / "aside")
    after = panels.render(tmp_path)
    assert "Runs: 5 baselines and 10 loaded runs" in after
    assert "1 finished in sweep.csv but set aside" in after
    assert "| paged | 8.1 |" not in after and "| paged | 7.397 |" in after


def test_a_panel_without_sustained_csv_is_judged_against_its_baselines_bound(panels, tmp_path):
    panel = _copy_panel(tmp_path, 0, "sharegpt-paper")
    with_file = panels.render(tmp_path)
    (panel / "sustained.csv").unlink()
    without = panels.render(tmp_path)
    # the same bound (4 x orca-pow2's unloaded latency) and the same brackets, from the rows alone
    assert "Bound **0.0333 s/token**: 4 x 0.008321 s/token" in without
    assert "(sustained.csv not written yet)" in without and "not written yet" not in with_file
    brackets = (
        "static 0.7345/0.8021, orca-max 2.164/2.363, orca-pow2 3.028/3.306, orca-oracle 3.746/4.09, "
        "paged 7.397/8.1"
    )
    assert brackets in with_file and brackets in without
    assert "| paged / orca-oracle | [1.81, 2.16] |" in without
