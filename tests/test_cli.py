"""The CLI as a user runs it: a real subprocess, real files, one-line errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def kvbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )  # a safety net only: a resumed Ray sweep took over 120 s on the 2-core CI box at load 15


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_simulate_writes_every_result_file(tmp_path):
    out = tmp_path / "run"
    proc = kvbench(
        "simulate", "--engine", "paged", "--num-requests", "60", "--rate", "5",
        "--kv-cache-gib", "2", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "60/60 requests" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "env.json", "requests.csv", "steps.csv", "summary.json",
    ]  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "engine", "model", "num_requests", "completed", "makespan_s", "request_throughput",
        "output_token_throughput", "mean_batched_requests", "normalized_latency_s", "num_preemptions",
        "occupancy",
    ):  # fmt: skip
        assert key in summary, key
    assert summary["engine"] == "paged" and summary["completed"] == 60
    assert sum(summary["occupancy"].values()) == pytest.approx(1.0)
    config = json.loads((out / "config.json").read_text())
    assert config["kv_cache_gib"] == 2.0 and config["block_size"] == 16 and "cost_model_constants" in config
    requests = read_csv(out / "requests.csv")
    assert [int(r["request_id"]) for r in requests] == list(range(60))
    steps = read_csv(out / "steps.csv")
    slots = summary["num_slots"]
    for row in steps:
        cats = ("token_states", "outside_window", "reservation", "internal_frag", "allocator_overhead")
        cats += ("external_frag", "free")
        assert sum(int(row[c]) for c in cats) == slots
    assert sum(int(r["num_steps"]) for r in steps) == summary["num_steps"]
    env = json.loads((out / "env.json").read_text())
    assert env["command"][0].endswith("kvbench/__main__.py") and env["python"]


def test_same_seed_same_results_and_another_seed_differs(tmp_path):
    def run(seed: str, name: str) -> str:
        out = tmp_path / name
        args = ("--engine", "orca-oracle", "--num-requests", "40", "--rate", "3", "--seed", seed)
        assert kvbench("simulate", *args, "--out", str(out), "--overwrite").returncode == 0
        return (out / "requests.csv").read_text()

    assert run("7", "a") == run("7", "b")
    assert run("7", "a") != run("8", "c")


def test_rerun_replaces_the_results_folder_whole(tmp_path):
    out = tmp_path / "run"
    base = ("simulate", "--engine", "static", "--kv-cache-gib", "12", "--out", str(out))
    assert kvbench(*base, "--num-requests", "30").returncode == 0
    assert kvbench(*base, "--num-requests", "10", "--overwrite").returncode == 0  # a run is kept unless told
    assert len(read_csv(out / "requests.csv")) == 10
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no temporary folders left behind


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--engine", "vllm"), "unknown --engine 'vllm'"),
        (("--engine", "paged", "--model", "gpt-5"), "unknown --model 'gpt-5'"),
        (("--engine", "paged", "--block-size", "12"), "--block-size must be a positive power of two, got 12"),
        (("--engine", "paged", "--block-size", "0"), "--block-size must be a positive power of two, got 0"),
        (("--engine", "paged", "--block-size", "-16"), "--block-size must be a positive power of two"),
        (("--engine", "paged", "--rate", "-1"), "--rate must be a finite number >= 1e-06 (or inf), got -1"),
        (("--engine", "paged", "--num-requests", "0"), "--num-requests"),
        (("--engine", "paged", "--kv-cache-gib", "0"), "--kv-cache-gib must be a positive number"),
        (("--engine", "orca-max", "--kv-cache-gib", "1"), "cannot fit the KV arena of 1310 slots"),
        (("--engine", "paged", "--emulate-gpu", "tpu"), "unknown --emulate-gpu 'tpu'"),
        (("--engine", "paged", "--model", "opt-66b"), "--emulate-gpu a100-40gb leaves"),
        (("--engine", "paged", "--trace", "lmsys"), "unknown --trace 'lmsys'"),
        (("--engine", "paged", "--max-num-batched-tokens", "512"), "--max-num-batched-tokens 512 is below"),
        (("--engine", "paged", "--max-num-seqs", "0"), "--max-num-seqs must be a positive integer"),
        (("--engine", "orca-max", "--contiguous-fit", "best"), "unknown --contiguous-fit 'best'"),
    ],
)
def test_bad_input_is_one_line_naming_the_parameter(tmp_path, args, message):
    # a small trace unless the case sets its own (the last occurrence of a flag wins)
    proc = kvbench("simulate", "--num-requests", "5", *args, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert not (tmp_path / "x").exists()


def test_help_lists_engines_and_models():
    proc = kvbench("simulate", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "orca-pow2" in text and "opt-13b" in text and "sharegpt-paper" in text


def test_demo_prints_the_side_by_side_table(tmp_path):
    proc = kvbench("demo", "--mode", "simulate", "--num-requests", "150", "--out", str(tmp_path / "demo"))
    assert proc.returncode == 0, proc.stderr
    for name in ("Orca (Max)", "Orca (Pow2)", "Orca (Oracle)", "vLLM", "FasterTransformer"):
        assert name in proc.stdout
    for engine in ("static", "orca-max", "orca-pow2", "orca-oracle", "paged"):
        assert json.loads((tmp_path / "demo" / engine / "summary.json").read_text())["completed"] == 150
    assert "| paged | vLLM |" in (tmp_path / "demo" / "demo.md").read_text()
    assert (tmp_path / "demo" / "report" / "report.html").is_file()  # the demo ends with the report
    assert "report.html" in proc.stdout.splitlines()[-1]


def test_demo_mode_is_checked(tmp_path):
    proc = kvbench("demo", "--mode", "gpu", "--out", str(tmp_path / "demo"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --mode 'gpu': choose auto, simulate or real"


def test_run_decodes_for_real_on_the_cpu(tmp_path):
    out = tmp_path / "real"
    proc = kvbench(
        "run", "--engine", "paged", "--model", "tiny-opt", "--device", "cpu", "--kv-cache-gib", "0.002",
        "--trace", "uniform:prompt=4..30,output=2..12", "--num-requests", "8", "--rate", "20",
        "--attention", "torch",  # a CPU's default outside this suite (which interprets Triton)
        "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["mode"], summary["device"], summary["dtype"], summary["completed"]) == (
        "real",
        "cpu",
        "float32",
        8,
    )
    assert summary["arena_bytes"] > 0 and summary["weight_bytes"] > 0
    config = json.loads((out / "config.json").read_text())
    assert config["device"] == "cpu" and config["model"] == "tiny-opt"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--device", "tpu"), "--device 'tpu' is not a device"),
        (("--device", "cpu", "--dtype", "int8"), "unknown --dtype 'int8'"),
        (("--device", "cpu", "--model", "/nonexistent/ckpt"), "unknown --model '/nonexistent/ckpt'"),
    ],
)
def test_run_bad_input_is_one_line(tmp_path, args, message):
    proc = kvbench(
        "run",
        "--engine",
        "paged",
        "--model",
        "tiny-opt",
        "--num-requests",
        "2",
        *args,
        "--out",
        str(tmp_path / "x"),
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error: ") and message in proc.stderr, proc.stderr


def test_run_refuses_a_missing_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = kvbench("run", "--engine", "paged", "--device", "cuda", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --device cuda: no CUDA device is available here"
