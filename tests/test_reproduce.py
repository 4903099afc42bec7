"""`kvbench reproduce`: the quick simulated run end to end, through the CLI as a user runs it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("fig2", "fig13", "fig12", "fig18b", "fig19")


def kvbench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "kvbench.cli", *args], capture_output=True, text=True, env=env
    )


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reproduce") / "out"
    proc = kvbench("reproduce", "--quick", "--mode", "simulate", "--num-requests", "300", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "reproduce.md" in proc.stdout
    return out


def _rows(out: Path, figure: str) -> list[dict]:
    with open(out / figure / "figure.csv", newline="") as f:
        return list(csv.DictReader(f))


def _value(rows, engine, workload, metric) -> float:
    (row,) = [r for r in rows if (r["engine"], r["workload"], r["metric"]) == (engine, workload, metric)]
    return float(row["kvbench"])


def test_every_figure_writes_its_tables_and_plots(quick):
    for figure in FIGURES:
        rows = _rows(quick, figure)
        assert rows and list(rows[0]) == [
            "figure",
            "engine",
            "workload",
            "metric",
            "kvbench",
            "paper",
            "ratio",
        ]
        data = json.loads((quick / figure / "figure.json").read_text())
        assert data["verdict"] and "\n" not in data["verdict"]
        assert data["plots"], data["notes"]
        for plot in data["plots"]:
            assert (quick / figure / plot).is_file()
    assert (quick / "fig12" / "sharegpt-paper" / "sweep.csv").is_file()
    assert (quick / "fig12" / "alpaca-paper" / "sustained.csv").is_file()
    assert (quick / "fig19" / "swap" / "sweep.csv").is_file()
    report = (quick / "reproduce.md").read_text()
    for figure in FIGURES:
        assert f"**{figure}**" in report
    claims = (quick / "claims.md").read_text()
    assert "`kvbench kernels` measures it" in claims and "not measured in this folder" not in claims


def test_engines_relate_as_in_the_paper(quick):
    fig2 = _rows(quick, "fig2")
    assert _value(fig2, "paged", "sharegpt-paper", "token_states_%") > 90
    for engine in ("orca-max", "orca-pow2", "orca-oracle"):
        assert 15 < _value(fig2, engine, "sharegpt-paper", "token_states_%") < 45
    fig13 = _rows(quick, "fig13")
    for trace in ("sharegpt-paper", "alpaca-paper"):
        b = {
            e: _value(fig13, e, trace, "mean_batched_requests")
            for e in ("paged", "orca-oracle", "orca-pow2", "orca-max")
        }
        assert b["paged"] > b["orca-oracle"] > b["orca-pow2"] >= b["orca-max"], (trace, b)
    fig12 = _rows(quick, "fig12")
    assert _value(fig12, "paged/orca-max", "sharegpt-paper", "sustained_ratio") > 1


def test_unknown_figure_is_one_line_naming_the_figures(tmp_path):
    proc = kvbench("reproduce", "fig99", "--mode", "simulate", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "fig99" in lines[0] and "fig2, fig13, fig12, fig18b, fig19, claims" in lines[0]
    assert not (tmp_path / "out").exists()


def test_cost_model_does_not_apply_to_real_runs(tmp_path):
    cost = tmp_path / "cost.json"
    cost.write_text(
        json.dumps({"model": "opt-13b", "fixed_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-8})
    )
    proc = kvbench(
        "reproduce", "fig2", "--mode", "real", "--cost-model", str(cost), "--out", str(tmp_path / "o")
    )
    assert proc.returncode == 2 and "--cost-model" in proc.stderr
