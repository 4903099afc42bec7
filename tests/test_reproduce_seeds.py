"""`kvbench reproduce --repeats N`: one folder per seed, numbers as means with 95 % intervals,
a seed's earlier runs reused (a single-seed run moved into its seed folder included)."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.reproduce.engines import fig2 as reproduce_fig2
from kvbench.reproduce.rows import Options, Setting
from kvbench.sweep.stats import mean_ci95

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("static", "orca-max", "orca-pow2", "orca-oracle", "paged")
REQUESTS = "40"


def kvbench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kvbench", *args], capture_output=True, text=True, env=env)


def fig2(out: Path, *args: str) -> None:
    proc = kvbench("reproduce", "fig2", "--quick", "--mode", "simulate", "--num-requests", REQUESTS,
                   "--out", str(out), *args)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def _rows(path: Path) -> dict[tuple[str, str], dict]:
    with open(path, newline="") as f:
        return {(r["engine"], r["metric"]): r for r in csv.DictReader(f)}


def test_repeats_run_each_seed_in_its_folder_and_report_means_with_intervals(tmp_path):
    single = tmp_path / "single"
    fig2(single, "--seed", "1")  # today's layout of one seed: <out>/fig2/seed-1/<engine>
    assert (single / "fig2" / "seed-1" / "paged" / "summary.json").is_file()
    out = tmp_path / "out"
    out.mkdir()
    shutil.copytree(single, out, dirs_exist_ok=True)  # seed 1 made earlier, moved in
    stamps = {e: (out / "fig2" / "seed-1" / e / "summary.json").stat().st_mtime_ns for e in ENGINES}
    fig2(out, "--seed", "0", "--repeats", "3")
    for e in ENGINES:  # seed 1 reused, not rerun
        assert (out / "fig2" / "seed-1" / e / "summary.json").stat().st_mtime_ns == stamps[e]
    merged = {
        (r["engine"], r["metric"]): r for r in json.loads((out / "fig2" / "figure.json").read_text())["rows"]
    }
    assert _rows(out / "fig2" / "figure.csv").keys() == merged.keys()
    for e in ENGINES:  # one trace sample and arrivals per seed
        configs = [json.loads((out / "fig2" / f"seed-{s}" / e / "config.json").read_text()) for s in range(3)]
        assert sorted(c["workload"]["seed"] for c in configs) == [0, 1, 2]
    # each seed's figure, read back from its folder's runs (reused, not rerun): the merged row's samples
    values = []
    for s in range(3):
        options = Options(True, Setting(), num_requests=int(REQUESTS), seed=s)
        (row,) = [r for r in reproduce_fig2(options, out / "fig2" / f"seed-{s}").rows
                  if (r.engine, r.metric) == ("orca-max", "token_states_%")]  # fmt: skip
        values.append(row.kvbench)
    for e in ENGINES:
        assert (out / "fig2" / "seed-1" / e / "summary.json").stat().st_mtime_ns == stamps[e]
    row = merged["orca-max", "token_states_%"]  # saturated in every seed (paged keeps up at 40)
    mean, half = mean_ci95(values)
    assert len(set(values)) == 3 and all(math.isfinite(v) for v in values)  # three samples, three values
    assert row["kvbench"] == pytest.approx(statistics.fmean(values)) and mean == statistics.fmean(values)
    assert (row["low"], row["high"]) == pytest.approx((mean - half, mean + half)) and half > 0
    assert row["n"] == 3
    report = (out / "reproduce.md").read_text()
    assert "seeds 0-2 (means with 95 % CIs)" in report
    # the report's row is the mean over the seeds with its interval, not one seed's value
    cells = f"{mean:.3g} [{mean - half:.3g}, {mean + half:.3g}]"
    assert f"| orca-max | sharegpt-paper | token_states_% | {cells} | 3 | 20.4 |" in report
    data = json.loads((out / "fig2" / "figure.json").read_text())
    # the first seed's plots, and the means with their intervals over the seeds
    assert {p for p in data["plots"] if not p.startswith("seed-0/")} == {"intervals.png", "intervals.svg"}
    assert all((out / "fig2" / p).is_file() for p in data["plots"])


def test_repeats_below_one_is_one_line(tmp_path):
    proc = kvbench("reproduce", "fig2", "--mode", "simulate", "--repeats", "0", "--out", str(tmp_path / "o"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--repeats" in lines[0]
    assert not (tmp_path / "o").exists()
