"""`kvbench reproduce --prefill-graphs`: every real run of the figures replays its short
prefills (config.json's `prefill_graphs`), Figure 2's engine runs and a rate figure's cells
alike, and the report says so; a simulation has no prefills to replay, so the flag is refused
there in one line. The real path runs on a CPU with a tiny model (static prefill buffers, no
graphs there), which checks the setting's way into every run, not the GPU's graphs
(`tests/test_prefill_graphs.py` checks those on the GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("orca-oracle", "paged")  # two engines, three requests: the real path's smallest grid


def test_the_flag_reaches_every_real_run_and_the_report(tmp_path, monkeypatch):
    from kvbench.reproduce import calibration, engines, sweeps
    from kvbench.reproduce.rows import Options, Setting
    from kvbench.reproduce.run import run_reproduce

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for module in (engines, calibration):
        monkeypatch.setattr(module, "DEMO_ENGINES", ENGINES)
    setting = Setting(
        "tiny-opt", 0.01, 1.0, real=True, paper_threshold=False, device="cpu", prefill_graphs=True
    )
    out = tmp_path / "rep"
    run_reproduce(("fig2",), Options(True, setting, num_requests=3, seed=4), out, echo=lambda line: None)
    configs = [json.loads(p.read_text()) for p in (out / "fig2" / "seed-4").glob("*/config.json")]
    assert sorted(c["engine"] for c in configs) == sorted(ENGINES)
    assert all(c["prefill_graphs"] is True and c["device"] == "cpu" for c in configs)
    assert "short prefills replayed as CUDA graphs (--prefill-graphs)" in (out / "reproduce.md").read_text()
    # a rate figure's cells: the sweep's base config carries it too
    options = Options(True, setting, num_requests=3, seed=4)
    sweep = sweeps.sweep(options, tmp_path / "rates", engines=ENGINES, trace="alpaca-paper", rates=(4.0,),
                         block_sizes=(16,), kv=0.01, threshold=None)  # fmt: skip
    cells = list((tmp_path / "rates" / "cells").glob("*/config.json"))
    assert cells and sweep.rows
    assert all(json.loads(p.read_text())["prefill_graphs"] is True for p in cells)
    eager = Setting("tiny-opt", 0.01, 1.0, real=True, device="cpu")
    assert eager.run_fields() == {"device": "cpu", "prefill_graphs": False}
    assert Setting(cost_model="c.json").run_fields() == {"device": "cpu", "cost_model": "c.json"}


def test_a_simulation_refuses_the_flag_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "reproduce", "fig2", "--mode", "simulate", "--prefill-graphs",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert (
        lines[0]
        == "error: --prefill-graphs replays real runs' prefills: use it with --mode real (or auto on a GPU)"
    )
    assert not (tmp_path / "out").exists()
