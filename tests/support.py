"""Helpers shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

from kvbench.cost_model import CostModel
from kvbench.errors import KvbenchError
from workloads.tracefile import read_trace

# Triton kernels on CPU tensors run only in Triton's interpreter (conftest sets it where no GPU is)
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
INTERPRETED = pytest.mark.skipif(not INTERPRETING, reason="CPU tensors need Triton's interpreter")


def examples(ci: int) -> int:
    """A property's example count: `ci` under the CI profile, scaled as the loaded Hypothesis
    profile scales the default (tests/conftest.py), so `thorough` runs 10x every test."""
    return max(1, ci * settings.default.max_examples // settings.get_profile("ci").max_examples)


def steps(ci: int) -> int:
    """A state machine's step count: `ci` under the CI profile, scaled like `examples`."""
    return max(1, ci * settings.default.stateful_step_count // settings.get_profile("ci").stateful_step_count)


def load_script(relative: str):
    """A script of the repository (`tools/x.py`, `benchmarks/x.py`: not packages) as a module."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled_variants() -> int:
    """Triton kernel variants compiled so far in this process, over every kernel of `kernels`
    that a real run launches (0 where nothing is compiled: Triton's interpreter)."""
    import importlib

    from triton.runtime.jit import JITFunction

    total = 0
    for name in ("decode_attention", "extend_attention", "fused", "kv_store", "mla_decode", "split_merge"):
        for fn in vars(importlib.import_module(f"kernels.{name}")).values():
            if isinstance(fn, JITFunction):
                total += sum(len(cache[0]) for cache in getattr(fn, "device_caches", {}).values())
    return total


# The virtual step clock of real runs whose schedule a test checks (`ModelRunner(clock=...)`):
# 5 ms a step, 0.1 ms a token fed, 10 us a token of context. The tiny models' CPU steps take
# about that on a busy 2-core machine, so arrivals 10 ms apart meet running batches and a tight
# arena preempts; with measured times the same test preempted or not with the machine's load.
VIRTUAL_CLOCK = CostModel(fixed_s=5e-3, per_token_s=1e-4, per_kv_token_s=1e-5)


def greedy_tokens_by_engine(
    spec, engines, prepare=None, requests: int = 10, trace=None, **runner_options
) -> dict[str, list[tuple[int, ...]]]:
    """Each engine decodes `tests.test_modeling.small_trace` through the real engine loop on the CPU
    (PyTorch attention unless `runner_options` say otherwise, an arena poisoned with NaN so a slot
    read before it is written shows): every request's greedy tokens, checked to have its full
    output length. `prepare(model)`, if given, changes the model first (how it computes, never
    its weights); `requests`: the trace's first ones, or `trace` instead; `runner_options` go to
    the `ModelRunner`."""
    import torch

    from engines import ENGINES
    from kvbench.engine import Engine
    from kvbench.modeling.arena import KVArena
    from kvbench.modeling.weights import random_model
    from kvbench.real.model_runner import ModelRunner
    from tests.test_modeling import engine_options, small_trace

    cpu = torch.device("cpu")
    model = random_model(spec, torch.float32, cpu, seed=3)
    if prepare is not None:
        prepare(model)
    tokens = {}
    trace = trace or small_trace(requests)
    for engine in engines:
        arena = KVArena(spec, 300, torch.float32, cpu)
        arena.fill(float("nan"))
        sched = ENGINES[engine].build(engine_options(300))
        options = {"attention": "torch", **runner_options}
        runner = ModelRunner(
            model, arena, sched.allocator, max_batch=10, max_len=64, temperature=0.0, seed=5,
            clock=VIRTUAL_CLOCK, **options,
        )  # fmt: skip
        run = Engine(sched, runner).run(trace)
        assert [len(seq.output_ids) for seq in run.sequences] == [r.output_len for r in trace.requests]
        tokens[engine] = [tuple(seq.output_ids) for seq in run.sequences]
    return tokens


def refusal(call, *args, **kwargs) -> str:
    """The one-line KvbenchError `call(*args, **kwargs)` raises."""
    with pytest.raises(KvbenchError) as error:
        call(*args, **kwargs)
    message = str(error.value)
    assert "\n" not in message
    return message


def error_of(path: Path) -> str:
    """The one-line error reading `path` raises; it must start with the path."""
    with pytest.raises(KvbenchError) as error:
        read_trace(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# A sweep that stops itself (SIGSTOP) at its first file rename once a cell of OUT is finished:
# in a local sweep that is before the next cell lands (cells, sweep.csv and every file are
# written beside and renamed into place), through Ray before the driver writes another result.
# An audit hook sees every rename (`os.replace` raises "os.rename") before it happens.
_STOP_AFTER_FIRST_CELL = """
import os, signal, sys
from pathlib import Path

cells = Path(sys.argv.pop(1)) / "cells"

def stop(event, args):
    if event == "os.rename" and any(not f.parent.name.startswith(".") for f in cells.glob("*/summary.json")):
        os.kill(os.getpid(), signal.SIGSTOP)

sys.addaudithook(stop)
from kvbench.cli.app import main
main()
"""


def sweep_stopped_after_its_first_cell(
    args: list[str], out: Path, cwd: Path, timeout_s: float = 600.0
) -> None:
    """Run `kvbench sweep ARGS` (writing to `out`) until it stops itself with exactly one cell
    finished, then SIGKILL it: a sweep killed between two cells, at a point chosen by state, not
    by timing (a fast machine could finish every cell, a loaded one none, before a timed kill).
    `timeout_s` is only a safety net; the sweep is killed whatever happens."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _STOP_AFTER_FIRST_CELL, str(out), *args],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and proc_state(proc.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc_state(proc.pid) == "T", "the sweep never stopped after its first cell"
    finally:
        proc.kill()
        proc.wait()


def proc_state(pid: int) -> str | None:
    """A process's state letter (R, S, T for stopped, Z for a zombie...), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def run_with_steps(
    folder: Path, columns, rows, *, summary: dict | None = None, config: dict | None = None
) -> Path:
    """A simulated run folder (a few ShareGPT requests on paged) whose steps.csv is replaced by
    `rows` under `columns` (a step index first), its summary.json and config.json updated with
    `summary` and `config`: hand-made step tables for the calibration fit's tests."""
    import csv
    import json

    from kvbench.config import RunConfig
    from kvbench.simulate import simulate, write_result
    from workloads.spec import WorkloadSpec

    workload = WorkloadSpec("sharegpt-paper", num_requests=3, rate=4.0, seed=0)
    write_result(simulate(RunConfig(engine="paged", workload=workload, kv_cache_gib=2.0)), folder)
    with (folder / "steps.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("step", *columns))
        writer.writerows((i, *row) for i, row in enumerate(rows))
    for name, changes in (("summary.json", summary), ("config.json", config)):
        if changes:
            data = json.loads((folder / name).read_text())
            (folder / name).write_text(json.dumps({**data, **changes}))
    return folder
