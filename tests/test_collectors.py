"""Collectors: the roofline arithmetic, the wrapper's bookkeeping, CSV columns, and (on a GPU)
a real run with every collector on."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines.scheduler import Batch
from kvbench.cost_model import CostModel, CostModelRunner
from kvbench.errors import KvbenchError
from kvbench.real.collectors import CollectingRunner, Roofline, parse_collectors
from kvbench.requests import Request
from kvbench.runner import StepResult
from kvbench.sequence import Sequence

ROOT = Path(__file__).resolve().parents[1]


def decoding(prompt: int) -> Sequence:
    seq = Sequence(Request(prompt, 0.0, prompt, 50))
    seq.advance(1, end_s=0.0)  # prefilled: prompt + 1 tokens known
    return seq


def test_roofline_counts_weights_once_per_step_and_the_kv_each_step_moves():
    seqs = (decoding(9), decoding(19))  # 10 and 20 tokens before the segment
    batch = Batch(seqs, is_prefill=False, num_tokens=2, num_context=30, steps_to_finish=49)
    roofline = Roofline(weight_bytes=1000, kv_bytes_per_token=10, read_bandwidth=100.0)
    row = roofline.row(batch, [10, 20], StepResult(np.array([1.0, 1.0, 1.0])))
    # steps read 28, 30, 32 earlier positions and write 2 new ones each
    assert row["roofline_s"] == (3 * 1000 + (28 + 30 + 32 + 6) * 10) / 100.0
    prefill = Batch(seqs, is_prefill=True, num_tokens=30, num_context=30)
    assert math.isnan(roofline.row(prefill, [10, 20], StepResult(np.array([1.0])))["roofline_s"])
    summary = roofline.finish([row, {"roofline_s": math.nan}], [(0.0, 40.0), (40.0, 41.0)])
    assert summary["roofline_efficiency"] == pytest.approx(row["roofline_s"] / 40.0)


class Counting:
    """A collector that numbers the rows it saw: proves the wrapper calls every collector."""

    def row(self, batch, contexts, result):
        return {"batch_seen": len(contexts), "steps_seen": len(result.durations)}

    def finish(self, rows, spans):
        assert len(rows) == len(spans) and all(end >= start for start, end in spans)
        return {"rows": len(rows)}


def test_collecting_runner_sees_every_engine_call_and_columns_reach_steps_csv(tmp_path):
    from kvbench.config import RunConfig, prepare
    from kvbench.simulate import execute, write_result
    from workloads.spec import WorkloadSpec

    config = RunConfig(
        engine="paged", model="opt-13b", workload=WorkloadSpec("sharegpt-paper", num_requests=40, rate=8.0)
    )
    prepared = prepare(config)
    wrapped = []

    def make_runner(_):
        wrapped.append(CollectingRunner(CostModelRunner(CostModel(0.02, 1e-4, 5e-7)), [Counting()]))
        return wrapped[0]

    result = execute(config, make_runner, mode="simulated", coalesce=True, prepared=prepared)
    runner = wrapped[0]
    assert runner.finish() == {"rows": len(result.run.steps)}
    assert [row["steps_seen"] for row in runner.rows] == [step.num_steps for step in result.run.steps]
    assert [row["batch_seen"] for row in runner.rows] == [step.batch_size for step in result.run.steps]
    from dataclasses import replace

    write_result(replace(result, step_columns=tuple(runner.rows)), tmp_path / "run")
    with open(tmp_path / "run" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result.run.steps)
    assert [int(row["steps_seen"]) for row in rows] == [step.num_steps for step in result.run.steps]


def test_unknown_collector_is_a_one_line_error():
    with pytest.raises(KvbenchError, match="--collectors: unknown collector 'gpu'"):
        parse_collectors("torch,gpu")
    assert parse_collectors("none") == ()
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "run", "--engine", "paged", "--model", "tiny-llama",
         "--device", "cpu", "--collectors", "bogus", "--out", "/tmp/never"],
        capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --collectors: unknown collector 'bogus'; "
                                                "choose from torch, nvml, roofline or none"]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device")
def test_a_real_run_with_every_collector(tmp_path):
    from kvbench.config import RunConfig
    from kvbench.real.run import run_real
    from kvbench.simulate import write_result
    from workloads.spec import WorkloadSpec

    workload = WorkloadSpec("uniform:prompt=8..64,output=8..64", num_requests=32, rate=50.0)
    config = RunConfig(
        engine="paged", model="tiny-llama", workload=workload, kv_cache_gib=0.05, device="cuda"
    )
    result = run_real(config)
    write_result(result, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["torch_peak_allocated_bytes"] > summary["arena_bytes"]
    assert 0 < summary["roofline_efficiency"] < 1.5 and summary["read_bandwidth_Bps"] > 1e11
    with open(tmp_path / "run" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["torch_allocated_bytes"]) >= summary["arena_bytes"]
    if "nvml_samples" in summary:  # NVML present on the machine
        assert summary["nvml_samples"] > 0 and float(rows[0]["nvml_used_bytes"]) > summary["arena_bytes"]
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["gpu"] and env["packages"]["torch"]
