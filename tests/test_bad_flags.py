"""Every bad flag and every corrupted saved result: one `error:` line naming it, exit code 2.

Cases run through `kvbench.cli.app.main`, the `kvbench` script's entry point, in this process
(`sys.argv` set, SystemExit caught): hundreds of subprocesses would cost minutes on a loaded
2-core machine, and a traceback here fails the test as surely as in a subprocess. A few cases
also run as a real subprocess, to hold the process-level contract (stderr, exit code).
Corrupted files are made from a real tiny simulated run's folder.
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from kvbench.budget import GIB, KVBudget, check_device_memory, host_available_bytes
from kvbench.cli.app import app, main
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import CHECKED_ELSEWHERE, RANGES

ROOT = Path(__file__).resolve().parent.parent
TINY = ("--model", "tiny-opt", "--kv-cache-gib", "0.002", "--trace", "fixed:prompt=4,output=4")
SIMULATE = ("simulate", "--engine", "paged", *TINY, "--num-requests", "5", "--rate", "5")
RUN = ("run", "--engine", "paged", *TINY, "--num-requests", "2", "--rate", "5", "--device", "cpu")
COST_FLAGS = ("--cost-fixed-s", "--cost-per-token-s", "--cost-per-kv-token-s")
SWEEP = ("sweep", "--engines", "paged", *TINY, "--rates", "1", "--num-requests", "5")


def kvbench(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `kvbench ARGS`."""
    monkeypatch.setattr(sys, "argv", ["kvbench", *args])
    with pytest.raises(SystemExit) as done:
        main()
    out, err = capsys.readouterr()
    return done.value.code, out, err


def assert_one_error(code: int, out: str, err: str, *names: str) -> str:
    """Exit code 2 and exactly one line, `error: ...`, naming each of `names`; returns it."""
    lines = [line for line in (out + err).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    assert len(errors) == 1 and err.strip() == errors[0], (out, err)
    for name in names:
        assert name in errors[0], (name, errors[0])
    return errors[0]


BAD_FLAGS = [
    # the workload, through simulate
    *[(SIMULATE, ("--seed", v), "--seed") for v in ("-1", "4294967296", "abc")],
    *[(SIMULATE, ("--num-requests", v), "--num-requests") for v in ("0", "-5", "10000000000", "1e10")],
    *[(SIMULATE, ("--rate", v), "--rate") for v in ("nan", "-1", "0", "-inf", "1e-15", "1e-320")],
    (SIMULATE, ("--rate", "1e-6", "--num-requests", "5000"), "--num-requests 5000 at --rate 1e-06"),
    (SIMULATE, ("--arrivals", "all", "--rate", "5"), "--rate 5 and --arrivals all"),
    (SIMULATE, ("--arrivals", "replay", "--rate", "5"), "--arrivals replay"),
    (SIMULATE, ("--burstiness", "0.5"), "--burstiness"),
    (SIMULATE, ("--arrivals", "gamma", "--burstiness", "nan"), "--burstiness"),
    *[(SIMULATE, ("--time-scale", v), "--time-scale") for v in ("inf", "1e-4")],
    (SIMULATE, ("--window-start", "-1"), "--window-start"),
    (SIMULATE, ("--window-duration", "0"), "--window-duration"),
    (SIMULATE, ("--max-total-len", "1"), "--max-total-len"),
    *[(SIMULATE, (flag, v), flag) for flag in ("--n", "--beam-width") for v in ("0", "5000")],
    (SIMULATE, ("--prefix-groups", "0"), "--prefix-groups"),
    (SIMULATE, ("--prefix-groups", "5"), "--prefix-groups 5"),  # without --prefix: ignored
    (SIMULATE, ("--max-history", "5"), "--max-history 5"),  # without --chat-turns: ignored
    (SIMULATE, ("--chat-turns", "0"), "--chat-turns"),
    (SIMULATE, ("--chat-turns", "2", "--max-history", "0"), "--max-history"),
    # the budget, scheduler and cost model
    *[(SIMULATE, ("--kv-cache-gib", v), "--kv-cache-gib") for v in ("nan", "inf", "-1", "0", "1e30", "1e5")],
    *[(SIMULATE, ("--gpu-memory-utilization", v), "--gpu-memory-utilization") for v in ("0", "1.5", "nan")],
    *[(SIMULATE, ("--block-size", v), "--block-size") for v in ("0", "12", "-16")],
    (SIMULATE, ("--max-num-seqs", "0"), "--max-num-seqs"),
    (SIMULATE, ("--max-num-seqs", "3000000000"), "--max-num-seqs"),
    (SIMULATE, ("--max-num-batched-tokens", "0"), "--max-num-batched-tokens"),
    *[(SIMULATE, ("--watermark", v), "--watermark") for v in ("1", "nan", "-0.1")],
    *[(SIMULATE, ("--swap-space-gib", v), "--swap-space-gib") for v in ("-1", "nan")],
    (SIMULATE, ("--preemption", "swap", "--swap-space-gib", "1e9"), "--swap-space-gib"),
    *[(SIMULATE, (flag, v), flag) for flag in COST_FLAGS for v in ("nan", "-1", "inf", "3601", "1e200")],
    (SIMULATE, ("--bogus", "3"), "--bogus"),
    (("simulate", "--out", "x"), (), "--engine"),
    # real runs (refused before a model is loaded)
    *[(RUN, ("--temperature", v), "--temperature") for v in ("nan", "-1", "inf", "1e-300", "101")],
    (RUN, ("--weights-seed", "-1"), "--weights-seed"),
    (RUN, ("--tensor-parallel", "0"), "--tensor-parallel"),
    (RUN, ("--expert-dispatch", "sparse"), "--expert-dispatch"),
    (RUN, ("--expert-dispatch", "grouped"), "--expert-dispatch grouped: tiny-opt has no experts"),
    (RUN, ("--engine", "vmm", "--model", "deepseek-v2-lite"), "--engine vmm --model deepseek-v2-lite"),
    (RUN, ("--hf-batch-size", "0"), "--hf-batch-size"),
    (RUN, ("--hf-memory", "2"), "--hf-memory"),
    (RUN, ("--hf-block-size", "2"), "--hf-block-size"),
    *[(RUN, (flag, v), f"{flag} {v}") for flag, v in (  # kvbench's own engine ignores them
        ("--hf-attn", "foo"), ("--hf-batch-size", "4"), ("--hf-memory", "0.5"), ("--hf-block-size", "64"))],
    (RUN, ("--kv-cache-gib", "1000"), "--kv-cache-gib"),
    # demo, kernels, sweep, trace make, reproduce
    (("demo", "--mode", "simulate"), ("--num-requests", "0"), "--num-requests"),
    (("demo", "--mode", "simulate"), ("--seed", "-1"), "--seed"),
    *[(("kernels",), (flag, v), flag) for flag, v in (
        ("--max-gib", "nan"), ("--max-gib", "-1"), ("--repeats", "0"), ("--warmup", "-1"),
        ("--kv-heads", "0"), ("--seed", "-3"), ("--batch", "²"), ("--context", "8,²"), ("--block-size", "²"),
        ("--gqa", "²"), ("--window", "0,²"), ("--cells", "8x²"))],
    *[(SWEEP, (flag, v), flag) for flag, v in (
        ("--cell-timeout", "nan"), ("--cell-timeout", "-1"), ("--cell-timeout", "0"), ("--bisect", "1000"),
        ("--baseline-rate", "nan"), ("--latency-threshold", "-1"), ("--threshold-multiple", "nan"),
        ("--parallel-gpus", "0"), ("--ray-retries", "-1"), ("--repeats", "0"), ("--num-requests", "0"),
        ("--threshold-multiple", "1"), ("--threshold-multiple", "0.5"), ("--rates", "1e-300"),
        ("--baseline-rate", "1e-9"), ("--duration", "1e12"), ("--seeds", "1,4294967296"))],
    (SWEEP, ("--seeds", "4294967295", "--repeats", "2"), "--seeds 4294967295 and --repeats 2"),
    (("trace", "make", "fixed:prompt=4,output=4"), ("--arrivals", "all", "--rate", "3"), "--arrivals all"),
    (("trace", "make", "fixed:prompt=4,output=4"), ("--rate", "nan"), "--rate"),
    (("reproduce", "--quick"), ("--num-requests", "0"), "--num-requests"),
    (("reproduce", "--quick"), ("--seed", "-1"), "--seed"),
    (("reproduce", "fig2", "--quick", "--mode", "simulate", "--num-requests", "5"),
     ("--seed", "4294967295", "--repeats", "2"), "--seed 4294967295 and --repeats 2"),
    *[(("reproduce", "--quick"), ("--rate-scale", v), "--rate-scale")
      for v in ("0", "-2", "nan", "inf", "1e-9")],
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "args", "name"), BAD_FLAGS, ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_a_bad_flag_is_one_line_naming_it(tmp_path, capsys, monkeypatch, command, args, name):
    out = tmp_path / "out"
    argv = [*command, *args]
    if "--out" not in argv:
        argv += ["--out", str(out / "trace.jsonl" if command[0] == "trace" else out)]
    assert_one_error(*kvbench(capsys, monkeypatch, *argv), name)
    assert not out.exists()  # refused before anything was written


IGNORED = [  # sweep flags another flag or the mode would drop: (extra flags, what the line names)
    (("--cell-timeout", "5"), ("--cell-timeout 5", "--isolate")),
    (("--latency-threshold", "1", "--threshold-multiple", "3"), ("threshold 1", "threshold-multiple 3")),
    (("--duration", "10"), ("--num-requests 5", "--duration 10", "--baseline-requests")),
    (("--temperature", "0.7"), ("--temperature 0.7", "--real")),
    (("--device", "cpu"), ("--device cpu", "--real")),
    (("--hf-batch-size", "4"), ("--hf-batch-size 4", "--real")),
    (("--no-cuda-graphs",), ("--no-cuda-graphs", "--real")),
]  # fmt: skip


@pytest.mark.parametrize(("args", "names"), IGNORED, ids=lambda v: " ".join(v))
def test_a_sweep_flag_that_would_be_ignored_is_refused(tmp_path, capsys, monkeypatch, args, names):
    """Each would have run a sweep whose cells record something else than the flag asked for: the
    timeout never stops an in-process cell, a given threshold overrides the multiple, --duration
    sets every loaded cell's count, and simulated cells decode nothing (their config records
    temperature 0 whatever was given)."""
    out = tmp_path / "out"
    assert_one_error(*kvbench(capsys, monkeypatch, *SWEEP, *args, "--out", str(out)), *names)
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ("--isolate", "--cell-timeout", "300", "--latency-threshold", "1"),
        ("--parallel-gpus", "2", "--cell-timeout", "300", "--latency-threshold", "1"),  # children: isolated
        ("--threshold-multiple", "1.5"),
    ],
    ids=" ".join,
)
def test_the_same_sweep_flags_in_their_own_setting_still_run(tmp_path, capsys, monkeypatch, args):
    code, out, err = kvbench(capsys, monkeypatch, *SWEEP, *args, "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert "failed)" in out and "0 failed" in out


def test_triton_attention_needs_cuda(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # conftest interprets Triton on CPU-only boxes
    done = kvbench(capsys, monkeypatch, *RUN, "--attention", "triton", "--out", str(tmp_path / "x"))
    assert_one_error(*done, "--attention triton", "--device")


def test_every_numeric_flag_of_every_command_has_a_range():
    """A new numeric flag without a range would accept NaN, inf and negatives unnoticed."""
    seen = set()

    def walk(typer_app):
        for info in typer_app.registered_commands:
            for p in inspect.signature(info.callback, eval_str=True).parameters.values():
                kind = typing.get_args(p.annotation)[0] if typing.get_origin(p.annotation) else p.annotation
                if kind in (int, float, int | None, float | None):
                    seen.add(p.name)
        for group in typer_app.registered_groups:
            walk(group.typer_instance)

    walk(app)
    assert seen - set(RANGES) - set(CHECKED_ELSEWHERE) == set()
    assert set(RANGES) | set(CHECKED_ELSEWHERE) <= seen  # no range for a flag that is gone


def test_a_few_cases_as_a_real_process(tmp_path):
    for args, name in ((("--seed", "-1"), "--seed"), (("--seed", "x"), "--seed"), (("--nope",), "--nope")):
        proc = subprocess.run(
            [sys.executable, "-m", "kvbench", *SIMULATE, *args, "--out", str(tmp_path / "x")],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert_one_error(proc.returncode, proc.stdout, proc.stderr, name)


GOOD = [
    ("--rate", "5", "--seed", "4294967295"),
    ("--rate", "5", "--seed", "0", "--num-requests", "1"),
    ("--rate", "inf"),
    ("--arrivals", "all"),
    ("--rate", "5", "--arrivals", "gamma", "--burstiness", "0.5"),
    (
        "--rate",
        "5",
        "--watermark",
        "0",
        "--preemption",
        "swap",
        "--swap-space-gib",
        "0",
        "--cost-fixed-s",
        "0",
    ),
    ("--rate", "5", "--preemption", "swap", "--swap-space-gib", "0.001"),
    ("--rate", "5", "--chat-turns", "2", "--max-history", "1"),
    ("--rate", "5", "--prefix", "16", "--prefix-groups", "2"),
    ("--rate", "5", "--n", "2", "--max-num-seqs", "2"),
    ("--rate", "5", "--max-num-seqs", "1", "--max-total-len", "2048"),
    ("--rate", "5", "--gpu-memory-utilization", "1.0"),
]


@pytest.mark.parametrize("args", GOOD, ids=" ".join)
def test_valid_edge_values_still_run(tmp_path, capsys, monkeypatch, args):
    base = SIMULATE[: SIMULATE.index("--rate")]  # each case gives its own arrivals
    code, out, err = kvbench(capsys, monkeypatch, *base, *args, "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed"] >= 1
    assert "occupancy, busy-weighted:" in out and "occupancy, saturated-weighted" in out


def test_the_arena_is_checked_against_the_host_memory():
    """Before a real run allocates it (CUDA: free device memory; CPU: the host's available)."""
    import torch

    available = host_available_bytes()
    assert available is not None and available > 0
    big = KVBudget(available + GIB, (available + GIB) // 512, "--kv-cache-gib 1000")
    with pytest.raises(KvbenchError, match=r"^the KV budget \(--kv-cache-gib 1000\) needs .* GiB available"):
        check_device_memory(big, torch.device("cpu"))
    check_device_memory(
        KVBudget(GIB // 1024, GIB // 1024 // 512, "--kv-cache-gib 0.001"), torch.device("cpu")
    )
    check_device_memory(
        big, torch.device("cpu"), ranks=1 + (available + GIB) // (GIB // 1024)
    )  # a share fits


# ---- corrupted saved results ---------------------------------------------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real tiny simulated run's folder (every file a run writes)."""
    out = tmp_path_factory.mktemp("run") / "a"
    proc = subprocess.run(
        [sys.executable, "-m", "kvbench", *SIMULATE, "--trace", "uniform:prompt=4..30,output=2..12",
         "--num-requests", "20", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


def _append(name: str, data: bytes):
    def corrupt(run: Path) -> Path:
        with open(run / name, "ab") as f:
            f.write(data)
        return run / name

    return corrupt


def _cut(name: str, keep: float):
    def corrupt(run: Path) -> Path:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[: int(len(data) * keep)])
        return run / name

    return corrupt


def _json(name: str, change):
    def corrupt(run: Path) -> Path:
        path = run / name
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
        return path

    return corrupt


def _cell(name: str, line: int, column: int, value: str):
    def corrupt(run: Path) -> Path:
        lines = (run / name).read_text().splitlines()
        cells = lines[line - 1].split(",")
        cells[column] = value
        lines[line - 1] = ",".join(cells)
        (run / name).write_text("\n".join(lines) + "\n")
        return run / name

    return corrupt


CORRUPTIONS = {
    "steps not utf-8": (_append("steps.csv", b"\xff\xfe garbage\n"), "not UTF-8"),
    "steps truncated": (_cut("steps.csv", 0.6), "cells, the header"),
    "steps a NUL": (_append("steps.csv", b"1,\x00\n"), "steps.csv"),
    "steps a word": (_cell("steps.csv", 3, 3, "fast"), "column 'duration_s', line 3"),
    "requests truncated": (_cut("requests.csv", 0.5), "requests.csv"),
    "summary truncated": (_cut("summary.json", 0.5), "not valid JSON"),
    "summary a list": (
        lambda run: (run / "summary.json").write_text("[1, 2]") and run / "summary.json",
        "expected a JSON object, got a JSON list",
    ),
    "summary not utf-8": (_append("summary.json", b"\xff"), "not UTF-8"),
    "summary a word count": (_json("summary.json", lambda d: d | {"completed": "many"}), "'completed'"),
    "summary a string metric": (_json("summary.json", lambda d: d | {"makespan_s": "1 s"}), "'makespan_s'"),
    "summary occupancy": (_json("summary.json", lambda d: d | {"occupancy": 5}), "'occupancy'"),
    "summary engine": (_json("summary.json", lambda d: d | {"engine": [1]}), "'engine'"),
    "config workload": (_json("config.json", lambda d: d | {"workload": "x"}), "'workload'"),
    "config rate": (
        _json("config.json", lambda d: d | {"workload": d["workload"] | {"rate": "fast"}}),
        "'rate'",
    ),
}


@pytest.mark.parametrize("command", ["compare", "report"])
@pytest.mark.parametrize("case", CORRUPTIONS)
def test_a_corrupted_result_is_one_line_naming_the_file(
    tmp_path, capsys, monkeypatch, run_dir, command, case
):
    corrupt, message = CORRUPTIONS[case]
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    path = corrupt(run)
    line = assert_one_error(*kvbench(capsys, monkeypatch, command, str(run)), message)
    assert line.startswith(f"error: {path}")
    assert not (run / "report").exists()


CALIBRATE_CORRUPTIONS = (
    "steps not utf-8",
    "steps truncated",
    "steps a word",
    "summary truncated",
    "summary a list",
)


@pytest.mark.parametrize("case", CALIBRATE_CORRUPTIONS)
def test_calibrate_names_a_corrupted_file(tmp_path, capsys, monkeypatch, run_dir, case):
    corrupt, message = CORRUPTIONS[case]
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    _json("summary.json", lambda d: d | {"mode": "real"})(run)  # as if measured: the fit takes real runs only
    path = corrupt(run)
    line = assert_one_error(
        *kvbench(capsys, monkeypatch, "calibrate", str(run), "--out", str(tmp_path / "c.json"))
    )
    assert line.startswith(f"error: {path}") and message in line
    assert not (tmp_path / "c.json").exists()


def test_calibrate_refuses_a_simulated_run_and_a_nan_row(tmp_path, capsys, monkeypatch, run_dir):
    cost = tmp_path / "cost.json"
    done = kvbench(capsys, monkeypatch, "calibrate", str(run_dir), "--out", str(cost))
    assert assert_one_error(*done, "a simulated run").startswith(f"error: {run_dir}: ")
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    _json("summary.json", lambda d: d | {"mode": "real"})(run)
    _cell("steps.csv", 4, 3, "nan")(run)
    line = assert_one_error(*kvbench(capsys, monkeypatch, "calibrate", str(run), "--out", str(cost)))
    assert line == f"error: {run}/steps.csv: line 4, column 'duration_s': nan is not a finite number >= 0"
    assert not cost.exists()
    (run / "steps.csv").write_text((run_dir / "steps.csv").read_text())  # the same run, intact, fits
    code, _, err = kvbench(capsys, monkeypatch, "calibrate", str(run), "--out", str(cost))
    assert code == 0, err
    assert all(json.loads(cost.read_text())[key] >= 0 for key in ("fixed_s", "per_token_s", "per_kv_token_s"))


COST_FILES = {  # each a file of SIMULATE's model but for what is wrong with it
    "nan": (
        '{"model": "tiny-opt", "fixed_s": NaN, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}',
        "'fixed_s' must be a finite number",
    ),
    "inf": (
        '{"model": "tiny-opt", "fixed_s": 0.01, "per_token_s": Infinity, "per_kv_token_s": 1e-8}',
        "'per_token_s'",
    ),
    "negative": (
        '{"model": "tiny-opt", "fixed_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": -1e-8}',
        "'per_kv_token_s'",
    ),
    "string": (
        '{"model": "tiny-opt", "fixed_s": "1", "per_token_s": 1e-5, "per_kv_token_s": 1e-8}',
        "'fixed_s'",
    ),
    "swap nan": (
        '{"model": "tiny-opt", "fixed_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": 1e-8, '
        '"per_swap_block_s": NaN}',
        "'per_swap_block_s'",
    ),
    "no model": ('{"fixed_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}', "names no model"),
    "null model": (
        '{"model": null, "fixed_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}',
        "names no model",
    ),
    "other model": (
        '{"model": "opt-13b", "fixed_s": 0.01, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}',
        "fitted on opt-13b, not on --model tiny-opt",
    ),
    "a list": ("[0.01, 1e-5, 1e-8]", "expected a JSON object"),
    "missing": ('{"fixed_s": 0.01}', "no 'per_token_s'"),
    "truncated": ('{"fixed_s": 0.01, "per_tok', "not valid JSON"),
    "no file": (None, "no such file"),
    "a folder": ("FOLDER", "is a folder, not a kvbench calibrate file"),
}


@pytest.mark.parametrize("case", COST_FILES)
def test_a_bad_cost_model_file_is_one_line(tmp_path, capsys, monkeypatch, case):
    text, message = COST_FILES[case]
    path = tmp_path / "cost.json"
    if text == "FOLDER":
        path.mkdir()
    elif text is not None:
        path.write_text(text)
    done = kvbench(capsys, monkeypatch, *SIMULATE, "--cost-model", str(path), "--out", str(tmp_path / "x"))
    assert assert_one_error(*done, message).startswith(f"error: --cost-model {path}: ")
    assert not (tmp_path / "x").exists()


def test_a_valid_cost_model_file_still_prices_steps(tmp_path, capsys, monkeypatch):
    path = tmp_path / "cost.json"
    path.write_text(
        '{"model": "tiny-opt", "fixed_s": 0.01, "per_token_s": 0, "per_kv_token_s": 1e-8, '
        '"per_prefill_token_s": null}'
    )
    code, _, err = kvbench(
        capsys, monkeypatch, *SIMULATE, "--cost-model", str(path), "--out", str(tmp_path / "x")
    )
    assert code == 0, err
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["makespan_s"] > 0 and summary["normalized_latency_s"] > 0


GARBAGE_SWEEPS = {
    "random bytes": (bytes(range(256)), "not UTF-8"),
    "no status": (b"engine\nfoo\n", "no status column"),
    "a word for a rate": (b"engine,status,rate\npaged,ok,fast\n", "column 'rate', line 2"),
    "a short line": (b"engine,status,rate\npaged,ok\n", "line 2 has 2 cells"),
    "no cells": (b"engine,status,rate\npaged,ok,1\n", "no run folder to compare"),
}


@pytest.mark.parametrize("case", GARBAGE_SWEEPS)
def test_compare_refuses_a_garbage_sweep_csv(tmp_path, capsys, monkeypatch, case):
    data, message = GARBAGE_SWEEPS[case]
    (tmp_path / "sweep.csv").write_bytes(data)
    line = assert_one_error(*kvbench(capsys, monkeypatch, "compare", str(tmp_path)), message)
    assert line.startswith(f"error: {tmp_path}")


def test_a_broken_model_is_blamed_not_the_budget():
    """A checkpoint with negative layers (refused first where checkpoints are read) must not
    surface as a --kv-cache-gib problem if it gets this far."""
    from dataclasses import replace

    from kvbench.budget import budget_from_gib
    from kvbench.models import get_model

    broken = replace(get_model("tiny-opt"), num_layers=-2)
    with pytest.raises(KvbenchError, match=r"^--model tiny-opt: -\d+ bytes of K/V per token"):
        budget_from_gib(1.0, broken)


REPEATS = [  # a list flag naming a value twice, and the line that must name the flag and the value
    (SWEEP, ("--rates", "1,1"), "--rates: 1 is given twice"),
    (SWEEP, ("--rates", "2,1,2.0"), "--rates: 2.0 (the same as 2) is given twice"),
    (SWEEP, ("--engines", "paged, paged"), "--engines: paged is given twice"),
    (SWEEP, ("--block-sizes", "16,16"), "--block-sizes: 16 is given twice"),
    (SWEEP, ("--seeds", "0,1,0"), "--seeds: 0 is given twice"),
    (SWEEP, ("--kv-cache-gib", "0.002,0.002"), "--kv-cache-gib: 0.002 is given twice"),
    (SWEEP, ("--trace", "fixed:prompt=4,output=4", "--trace", "fixed:prompt=4,output=4"), "--trace: fixed:"),
    (SWEEP, ("--engines", "paged,,"), "--engines: empty value in 'paged,,'"),
    (("reproduce", "fig2", "--quick", "--mode", "simulate"), ("fig2",), "figures: fig2 is given twice"),
    (SWEEP, ("--percentiles", "50,90,50"), "--percentiles: 50 is given twice"),
    (SIMULATE, ("--percentiles", "99,99.0"), "--percentiles: 99.0 (the same as 99) is given twice"),
    # two percentiles that one column name would hold: the second's values would overwrite the first's
    (SWEEP, ("--percentiles", "50,99.99991,99.99992"), "--percentiles: 99.99991 and 99.99992 both name the "
     "p99.9999 columns"),
    (RUN, ("--collectors", "host,host"), "--collectors: host is given twice"),
    *[(("kernels",), (flag, v), f"{flag}: {v.split(',')[0]} is given twice") for flag, v in (
        ("--batch", "8,8"), ("--context", "1024,1024"), ("--block-size", "16,16"), ("--gqa", "4,4"),
        ("--window", "0,0"), ("--cells", "8x1024,8x1024"), ("--backends", "torch-sdpa,torch-sdpa"))],
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "args", "message"), REPEATS, ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_a_value_given_twice_is_refused_naming_flag_and_value(
    tmp_path, capsys, monkeypatch, command, args, message
):
    """Dropping a repeat silently runs fewer cells (or keeping it, one twice) than the line reads."""
    out = tmp_path / "out"
    assert_one_error(*kvbench(capsys, monkeypatch, *command, *args, "--out", str(out)), message)
    assert not out.exists()


def test_calibrate_refuses_a_run_named_twice(tmp_path, capsys, monkeypatch, run_dir):
    """The same run folder twice (however spelled), or inside a folder also named, would be
    fitted twice or silently once: either way not what the command line reads."""
    cost = tmp_path / "cost.json"
    monkeypatch.chdir(run_dir.parent)
    for twice in ([str(run_dir), str(run_dir)], [str(run_dir), run_dir.name]):
        done = kvbench(capsys, monkeypatch, "calibrate", *twice, "--out", str(cost))
        assert assert_one_error(*done) == f"error: kvbench calibrate: run folder {twice[1]} is named twice"
    done = kvbench(capsys, monkeypatch, "calibrate", str(run_dir.parent), str(run_dir), "--out", str(cost))
    assert assert_one_error(*done).endswith(f"is named by {run_dir.parent} and by {run_dir}")
    done = kvbench(capsys, monkeypatch, "calibrate", str(run_dir), "--held-out", str(run_dir), "--held-out",
                   str(run_dir), "--out", str(cost))  # fmt: skip
    assert assert_one_error(*done, "--held-out: run folder", "is named twice")
    assert not cost.exists()


def test_kernels_refuses_grid_flags_beside_cells(tmp_path, capsys, monkeypatch):
    """--cells names the exact (batch, context) pairs, so a --batch or --context beside it would
    be ignored: refused, naming both. --cells alone passes that check (stopped here by a bad
    --backends, which is checked next and needs no GPU)."""
    out = tmp_path / "out"
    for flags, drop in (
        (("--batch", "8"), "drop --batch"),
        (("--context", "512", "--batch", "8"), "--batch and --context"),
    ):
        done = kvbench(capsys, monkeypatch, "kernels", "--cells", "8x1024", *flags, "--out", str(out))
        assert_one_error(*done, "--cells gives the exact BATCHxCONTEXT pairs", drop)
    done = kvbench(
        capsys, monkeypatch, "kernels", "--cells", "8x1024", "--backends", "bogus", "--out", str(out)
    )
    assert "--cells" not in assert_one_error(*done, "--backends: unknown backend 'bogus'")
    assert not out.exists()


@pytest.mark.parametrize("gain", ["0", "1.5", "-0.2"])
def test_calibrate_refuses_a_knee_gain_outside_0_to_1(tmp_path, capsys, monkeypatch, run_dir, gain):
    """A share of the linear fit's error: 0 would keep no knee, above 1 one that fits worse."""
    cost = tmp_path / "cost.json"
    done = kvbench(capsys, monkeypatch, "calibrate", str(run_dir), "--knee-gain", gain, "--out", str(cost))
    assert assert_one_error(*done, "--knee-gain must be a finite number in (0, 1]")
    assert not cost.exists()
