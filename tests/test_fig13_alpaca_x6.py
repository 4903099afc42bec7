"""results/reference/fig13-alpaca-x6-real: the committed table.md is what make.py reads from the
committed cells, by kvbench's verdict rules as they stand, so a change to those rules or to the
cells that would change the folder's reading fails here instead of leaving the README stale."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "reference" / "fig13-alpaca-x6-real"


@pytest.fixture(scope="module")
def made():
    make = runpy.run_path(str(FOLDER / "make.py"))
    sweep = make["load_sweep"](FOLDER)
    rows = make["by_engine"](sweep.cells)
    return make, rows, make["levels"](rows)


def test_the_levels_verdicts_and_ratios_are_the_committed_tables(made):
    """The tables that need no simulation, remade from the cells, are in table.md line by line."""
    make, rows, measured = made
    table = (FOLDER / "table.md").read_text(encoding="utf-8").splitlines()
    remade = [
        *make["level_table"](rows, measured),
        *make["verdicts"](measured),
        *make["ratio_table"](measured),
        *make["setting_table"](rows),
    ]
    missing = [line for line in remade if line not in table]
    assert not missing, f"table.md lags make.py: {missing[:3]}"


def test_every_engine_ran_every_seed_on_the_same_requests(made):
    """Engines of one seed are compared seed by seed: each seed's five cells must share the draw
    (the same number of requests completed, from one workload seed) and each engine have three."""
    _, rows, measured = made
    assert {engine: len(frame) for engine, frame in rows.items()} == dict.fromkeys(rows, 3)
    for frame in rows.values():
        assert list(frame.seed) == [0, 1, 2] and list(frame.workload_seed) == [0, 1, 2]
        assert set(frame.completed) == {1000} and set(frame.num_requests) == {1000}
    assert all(len(interval.seeds) == 3 for interval in measured.values())
