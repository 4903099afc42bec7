"""results/reference/kernels-flashinfer: its table is what make.py gives from the committed
kernels.csv files; a cell is a win only where the ratio is more than 1 % off 1 and, over seeds,
its 95 % interval excludes 1, or over one seed the two kernels' 10th-90th percentile ranges do
not overlap."""

from __future__ import annotations

import csv
import runpy
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "results" / "reference" / "kernels-flashinfer"


@pytest.fixture(scope="module")
def make():
    return runpy.run_path(str(FOLDER / "make.py"))


def _row(us: float, p10: float, p90: float) -> dict:
    return {"us": us, "us_p10": p10, "us_p90": p90}


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
    names = ("virtual faster", "paged faster")  # virtual / paged, read by the same rule
    assert reading([0.985, 0.986, 0.987], names) == "virtual faster"
    assert reading([1.02, 1.03, 1.04], names) == "paged faster"
    assert reading([0.991, 0.991, 0.992], names) == "tie"  # clear of 1, under the margin


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


def test_a_virtual_memory_set_shows_the_virtual_arena_and_a_backend_not_run_as_a_dash(make, tmp_path):
    """A set run with `kvbench-virtual` (the contiguous kernel over mapped pages) gets its column
    and its time over the paged kernel's (vAttention's comparison); a backend the set did not run
    (SDPA) reads "-", not an error."""
    shape = {"batch": 8, "context": 4096, "block_size": 16, "q_heads": 32, "kv_heads": 8, "gqa": 4,
             "head_dim": 128, "copies": 1, "ragged": False, "status": "ok"}  # fmt: skip
    columns = [*shape, "backend", "us", "us_p10", "us_p90", "gbps", "bw_fraction", "vs_contiguous",
               "max_abs_err", "atol"]  # fmt: skip
    rows = [
        ("kvbench-paged", 100.0), ("kvbench-contiguous", 99.0), ("kvbench-virtual", 98.0),
        ("flashinfer-cuda-cores", 104.0), ("flashinfer-tensor-cores", 110.0),
    ]  # fmt: skip
    for seed, shift in ((0, 0.0), (1, 1.0)):
        (tmp_path / f"seed-{seed}").mkdir()
        with (tmp_path / f"seed-{seed}" / "kernels.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, columns, restval="")
            writer.writeheader()
            for name, us in rows:
                writer.writerow({**shape, "backend": name, "us": us + shift, "us_p10": us + shift - 0.5,
                                 "us_p90": us + shift + 0.5})  # fmt: skip
    lines, counts, seeds = make["set_table"](tmp_path)
    assert seeds == 2 and counts == {"kvbench faster": 1}
    assert lines[0].startswith(
        "| batch x context | kvbench paged | kvbench contiguous | kvbench virtual | virtual / paged "
        "| FlashInfer"
    )
    assert lines[2] == (
        # virtual / paged: 98 / 100 and 99 / 101, mean 0.9801, +-0.0013 (t over two seeds);
        # paged / FlashInfer: 100 / 104 and 101 / 105: mean 0.9617, +-0.0023
        "| 8 x 4,096 | 100.5 | 99.5 | 98.5 | 0.980 [0.979, 0.981] virtual faster | 104.5 (cuda-cores) | - "
        "| 0.962 [0.959, 0.964] | kvbench faster |"
    )
