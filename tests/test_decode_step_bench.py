"""The decode-step benchmarks size their arenas for what a step addresses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.decode_step import BLOCK, gpu_step_s, step_slots
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import get_model

ROOT = Path(__file__).resolve().parent.parent


def test_step_slots_round_every_sequence_up_to_whole_blocks():
    assert step_slots(3, 2048 + 8) == 3 * (2048 + BLOCK)
    assert step_slots(1, BLOCK) == BLOCK
    assert step_slots(2, BLOCK + 1) == 4 * BLOCK


def test_an_arena_smaller_than_the_step_addresses_is_refused_before_any_kernel_runs():
    spec = get_model("tiny-llama")
    model = random_model(spec, torch.float32, torch.device("cpu"), seed=0)
    short = KVArena(spec, step_slots(2, 40) - 1, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="addresses"):
        gpu_step_s(model, short, batch=2, context=32, paged=False, max_len=40)


def test_the_mla_benchmark_runs_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "benchmarks/mla_vs_dense.py", "--device", "cpu", "--models", "tiny-llama,tiny-opt",
           "--kv-cache-gib", "0.001", "--contexts", "64", "--max-batch", "8", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert [r["model"] for r in rows] == ["tiny-llama", "tiny-opt"]
    assert all(1 <= r["batch"] <= 8 and r["batch"] == min(r["slots"] // 64, 8) for r in rows)
