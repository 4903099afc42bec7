"""results/reference/vmm-occupancy-real/seeds.md is what seeds.py makes of the committed runs.

The page carries the figures the folder's README gives over seeds (means, 95 % intervals, the
completed rates paired by seed), so it must not lag the runs it reads: this regenerates it in
memory and fails on any difference. It also checks that a seed missing from one engine leaves the
pairing to the seeds both ran, and that one run shows as one run, not as an interval.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "reference" / "vmm-occupancy-real"
REGENERATE = "PYTHONPATH=. python results/reference/vmm-occupancy-real/seeds.py"


@pytest.fixture(scope="module")
def seeds():
    return load_script("results/reference/vmm-occupancy-real/seeds.py")


def test_the_committed_page_is_what_the_runs_give(seeds):
    committed = (FOLDER / "seeds.md").read_text()
    assert seeds.render() == committed, f"seeds.md lags the runs: run {REGENERATE}"


def test_pairs_only_the_seeds_both_engines_ran(seeds, tmp_path):
    for name in ("alpaca-paper-per-layer", "alpaca-paper-per-request"):
        shutil.copytree(FOLDER / name, tmp_path / name)
    cells = tmp_path / "alpaca-paper-per-request" / "cells"
    for seed in (1, 2):  # runs set aside: seed 0 alone is left
        shutil.move(next(cells.glob(f"*__seed-{seed}__*")), tmp_path / f"aside-{seed}")
    page = seeds.render(tmp_path)
    assert "| alpaca-paper | vmm per-request 2 MiB | 1 (0: 7badcdb) | 78.83 |" in page
    pair = "| alpaca-paper | vmm per-request 2 MiB / paged | 0 | 0.817 | one run | same commit"
    assert pair in page
    assert "| alpaca-paper | vmm per-layer 2 MiB / paged | 0, 1, 2 | 0.553, 0.502, 0.556 |" in page
