"""results/reference/kernels-flashinfer: its table is what make.py gives from the committed
kernels.csv files; a cell is a win only where the ratio is more than 1 % off 1 and, over seeds,
its 95 % interval excludes 1, or over one seed the two kernels' 10th-90th percentile ranges do
not overlap."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "results" / "reference" / "kernels-flashinfer"


@pytest.fixture(scope="module")
def make():
    return runpy.run_path(str(FOLDER / "make.py"))


def _row(us: float, p10: float, p90: float) -> dict:
    return {"us": str(us), "us_p10": str(p10), "us_p90": str(p90)}


def test_one_run_is_a_win_only_outside_the_other_kernels_spread(make):
    reading = make["one_run_reading"]
    assert reading(0.97, _row(97, 96, 98), _row(100, 99, 101)) == "kvbench faster"
    assert reading(0.99, _row(99, 98, 100), _row(100, 99, 101)) == "tie"  # 99-100 overlaps 99-101
    assert reading(1.0, _row(100, 99, 101), _row(100, 101, 102)) == "tie"  # touching ends overlap
    assert reading(1.03, _row(103, 102, 104), _row(100, 99, 101)) == "FlashInfer faster"
    assert reading(0.995, _row(99.5, 99.4, 99.6), _row(100, 99.9, 100.1)) == "tie"  # under the margin


def test_over_seeds_a_win_needs_the_ratios_interval_clear_of_one(make):
    reading = make["seeds_reading"]
    assert reading([0.96, 0.97, 0.98]) == "kvbench faster"  # [0.945, 0.995]
    assert reading([0.96, 0.98, 1.00]) == "tie"  # the mean is below 1, the interval is not
    assert reading([1.02, 1.03, 1.04]) == "FlashInfer faster"
    assert reading([0.99, 1.0, 1.01]) == "tie"
    assert reading([1.006, 1.007, 1.008]) == "tie"  # clear of 1, but under the 1 % margin
    assert reading([0.985, 0.986, 0.987]) == "kvbench faster"


def test_the_committed_table_is_what_the_runs_give(make, tmp_path, monkeypatch):
    tables = sorted(FOLDER.glob("*/*/seed-*/kernels.csv"))
    assert len(tables) >= 2
    lines, counts, seeds = make["set_table"](FOLDER / "nvidia-h100-80gb-hbm3" / "opt13b-fp16")
    assert sum(counts.values()) == 7 and len(lines) == 2 + 7 and seeds >= 1
    committed = (FOLDER / "table.md").read_text(encoding="utf-8")
    monkeypatch.setitem(make["main"].__globals__, "HERE", tmp_path)
    for table in tables:  # the runs, read from a copy of the folder's layout
        target = tmp_path / table.relative_to(FOLDER)
        target.parent.mkdir(parents=True)
        target.write_bytes(table.read_bytes())
    make["main"]()
    assert (tmp_path / "table.md").read_text(encoding="utf-8") == committed
