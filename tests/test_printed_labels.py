"""What `simulate`, `compare` and `report` print about saved runs: labelled, in the order asked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ("--model", "tiny-opt", "--kv-cache-gib", "0.002", "--trace", "uniform:prompt=4..30,output=2..12")


def kvbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """A paged run and an orca-max run (which kvbench's engine order puts first)."""
    root = tmp_path_factory.mktemp("runs")
    for engine in ("paged", "orca-max"):
        proc = kvbench("simulate", "--engine", engine, *TINY, "--num-requests", "20", "--rate", "50",
                       "--out", str(root / engine))  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "occupancy, busy-weighted: token_states" in proc.stdout
        assert "occupancy, saturated-weighted (while requests wait for memory):" in proc.stdout
    return root / "paged", root / "orca-max"


def test_compare_prints_the_runs_in_the_order_given(runs):
    paged, orca = runs
    for first, second in ((paged, orca), (orca, paged)):
        proc = kvbench("compare", str(first), str(second))
        assert proc.returncode == 0, proc.stderr
        header = proc.stdout.splitlines()[0].split()
        assert header[-2:] == [first.name, second.name]
        engines = next(line for line in proc.stdout.splitlines() if line.startswith("engine")).split()
        assert engines[-2:] == [first.name, second.name]  # the folders are named after their engines
        assert any(line.split()[:2] == ["occupancy", "over"] for line in proc.stdout.splitlines())


def test_a_simulated_runs_settings_omit_real_run_settings(runs, tmp_path):
    paged, _ = runs
    proc = kvbench("report", str(paged), "--out", str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "report" / "report.html").read_text()
    assert "block_size" in html and "kv_cache_gib" in html  # the settings table is there
    for real_only in ("weights_seed", "cuda_graphs", "hf_batch_size", "tensor_parallel", "collectors"):
        assert real_only not in html, real_only
