"""Packed run tables (`steps.csv.gz`, `requests.csv.gz`) read as the CSVs they replaced."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import kvbench
from kvbench.calibrate.fit import read_rows
from kvbench.errors import KvbenchError
from kvbench.results.load import read_csv, runs_below
from kvbench.results.packed import pack_table, packed_path, table_bytes, table_path

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "results" / "reproduce" / "opt-13b-h200"  # committed real runs, packed where large


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "paged"
    proc = subprocess.run(
        [sys.executable, "-m", "kvbench", "simulate", "--engine", "paged", "--num-requests", "30",
         "--rate", "4", "--kv-cache-gib", "2", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_packed_run_loads_exactly_as_its_csvs(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for name in ("steps.csv", "requests.csv"):
        assert pack_table(copy / name)
        assert not (copy / name).exists() and packed_path(copy / name).is_file()
    plain, packed = kvbench.load_run(run), kvbench.load_run(copy)
    pd.testing.assert_frame_equal(plain.steps, packed.steps)
    pd.testing.assert_frame_equal(plain.requests, packed.requests)
    assert len(plain.steps) > 5 and len(plain.requests) == 30
    assert runs_below(tmp_path, steps=True) == [copy]


def test_packing_is_byte_exact_and_repeatable(run, tmp_path):
    original = (run / "steps.csv").read_bytes()
    packs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(run / "steps.csv", tmp_path / name / "steps.csv")
        pack_table(tmp_path / name / "steps.csv")
        packs.append((tmp_path / name / "steps.csv.gz").read_bytes())
    assert packs[0] == packs[1]
    assert packs[0][3:8] == bytes(5)  # no name flag, no time stamp: the same bytes whenever packed
    assert gzip.decompress(packs[0]) == original == table_bytes(tmp_path / "a" / "steps.csv")


def test_small_tables_stay_plain_and_a_missing_one_reads_empty(run, tmp_path):
    shutil.copy(run / "requests.csv", tmp_path / "requests.csv")
    size = (tmp_path / "requests.csv").stat().st_size
    assert not pack_table(tmp_path / "requests.csv", min_bytes=size + 1)
    assert table_path(tmp_path / "requests.csv") == tmp_path / "requests.csv"
    assert table_path(tmp_path / "steps.csv") is None and read_csv(tmp_path / "steps.csv").empty


def test_a_cut_packed_table_is_refused_naming_it(run, tmp_path):
    shutil.copy(run / "steps.csv", tmp_path / "steps.csv")
    pack_table(tmp_path / "steps.csv")
    packed = tmp_path / "steps.csv.gz"
    packed.write_bytes(packed.read_bytes()[:-40])
    with pytest.raises(KvbenchError, match=r"steps\.csv\.gz: not a whole gzip file"):
        read_csv(tmp_path / "steps.csv")


def test_the_committed_packed_runs_fit_and_load():
    packed = sorted(REAL.rglob("steps.csv.gz"))
    assert packed, "the committed OPT-13B runs keep their large tables packed"
    rows = read_rows(packed[0].parent)
    run = kvbench.load_run(packed[0].parent)
    assert len(rows.durations) == len(run.steps) > 100
    assert rows.durations.sum() == pytest.approx(run.steps["duration_s"].sum())
