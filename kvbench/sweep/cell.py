"""Running one sweep cell: in this process, or in a child `kvbench simulate|run` process.

In-process is fastest (simulations take milliseconds to seconds). `--isolate` starts
`python -m kvbench simulate|run <the cell's flags> --out <cell>` per cell, which a GPU
sweep wants: a cell that crashes, leaks memory or runs out of it takes only its own process
down. Both write the same folder through `kvbench.simulate.write_result`, atomically, so a
cell folder with a summary.json is a finished cell.

The child imports the kvbench this process imported, never one in the current folder: see
`child_env`.

Failures a sweep can record and go on from (`--continue-on-error`): a `KvbenchError` (a cell
the settings make impossible, e.g. a budget below the longest request), running out of memory
(`torch.OutOfMemoryError` is recognised by its type name, so simulations never import torch)
and a child process that exits non-zero. Anything else is a kvbench bug and propagates.
"""

from __future__ import annotations

import gc
import json
import os
import site
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, Field, asdict, dataclass, fields, is_dataclass
from pathlib import Path

from kvbench.config import RunConfig, unread_fields
from kvbench.errors import KvbenchError
from kvbench.flags import RealOptions, group_args
from kvbench.metrics.summary import format_slo

_REAL_FIELDS = {f.name for f in fields(RealOptions)}


@dataclass(frozen=True)
class CellRun:
    """How to run a cell; the same for every cell of a sweep."""

    real: bool = False  # kvbench.real.run.run_real instead of the simulator
    isolate: bool = False  # one child process per cell
    step_by_step: bool = False
    timeout_s: float | None = None  # isolate: kill a child that runs longer
    # steps.csv and requests.csv beside each cell's summary; False for a sweep read only through
    # its summaries (a placement simulation: hundreds of MB of rows nobody reads); in process only
    tables: bool = True


@dataclass(frozen=True)
class Outcome:
    ok: bool
    summary: dict | None  # summary.json of a finished cell
    error: str  # one line; "" when ok
    wall_s: float


def run_cell(config: RunConfig, out: Path, how: CellRun, env: Mapping[str, str] | None = None) -> Outcome:
    """Run `config` into the folder `out`; a recordable failure comes back as `ok=False`.

    `env`: the environment of an isolated cell's process (None: this one's), e.g. the one GPU
    it may see.
    """
    start = time.perf_counter()
    try:
        summary = _isolated(config, out, how, env) if how.isolate else _in_process(config, out, how)
    except KvbenchError as error:
        return Outcome(False, None, str(error), time.perf_counter() - start)
    except MemoryError:
        return Outcome(False, None, "out of host memory", time.perf_counter() - start)
    except Exception as error:
        if type(error).__name__ != "OutOfMemoryError":  # torch's, without importing torch
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
        _release_device_memory()
        return Outcome(False, None, f"OutOfMemoryError: {message}", time.perf_counter() - start)
    return Outcome(True, summary, "", time.perf_counter() - start)


def _in_process(config: RunConfig, out: Path, how: CellRun) -> dict:
    from kvbench.simulate import simulate, write_result

    if how.real:
        from kvbench.real.run import run_real

        result = run_real(config, coalesce=not how.step_by_step)
    else:
        result = simulate(config, coalesce=not how.step_by_step)
    write_result(result, out, tables=how.tables)
    return result.summary


def _release_device_memory() -> None:
    """After an out-of-memory cell, give its tensors back before the next cell starts."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def command(config: RunConfig, out: Path, how: CellRun) -> list[str]:
    """The `kvbench simulate|run` command line that runs `config` into `out`."""
    args = [sys.executable, "-m", "kvbench", "run" if how.real else "simulate"]
    real = RealOptions(**{name: getattr(config, name) for name in _REAL_FIELDS})
    for f in fields(RunConfig):
        value = getattr(config, f.name)
        flag = "--" + f.name.replace("_", "-")
        if f.name in _REAL_FIELDS or value is None:
            continue
        if f.name == "workload":
            args += group_args(value)
        elif f.name == "percentiles":
            args += [flag, ",".join(repr(float(p)) for p in value)]
        elif f.name == "slo":
            args += [flag, format_slo(value)] if value.given() else []
        elif isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        else:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    if how.real:
        args += group_args(real)
    args += ["--step-by-step"] if how.step_by_step else []
    return [*args, "--out", str(out)]


def child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """`env` (None: this process's) for a child that imports this kvbench, not the current folder's.

    `python -m` puts the current folder first on `sys.path`: started from a folder holding a
    clone named `kvbench`, or any `engines/` or `workloads/` package, every cell would import
    that instead (and run its code). `PYTHONSAFEPATH` (Python 3.11+, the `-P` flag) leaves the
    folder out; the folder holding this kvbench goes first on PYTHONPATH instead: an editable
    install's checkout, or a copied tree run with `PYTHONPATH=.`. A site-packages folder is not
    added: the child finds it by itself, and ahead of the standard library it could shadow a
    standard module. The child keeps the current folder as its working directory, so the
    cell's relative paths (--out, trace files) mean what they mean here.
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONSAFEPATH"] = "1"
    root = str(package_root())
    sites = {str(Path(p).resolve()) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if root not in sites:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([root, *rest])
    return env


def package_root() -> Path:
    """The folder holding the `kvbench` package this process imported (and `engines/` beside it)."""
    return Path(__file__).resolve().parents[2]  # <root>/kvbench/sweep/cell.py


def _isolated(config: RunConfig, out: Path, how: CellRun, env: Mapping[str, str] | None) -> dict:
    argv = command(config, out, how)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=how.timeout_s, env=child_env(env))
    except subprocess.TimeoutExpired:
        raise KvbenchError(f"the cell ran longer than {how.timeout_s:g} s and was stopped") from None
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        last = lines[-1] if lines else ""
        if proc.returncode < 0:
            raise KvbenchError(f"the cell's process was killed by signal {-proc.returncode} ({last})")
        if "OutOfMemoryError" in proc.stderr:
            raise KvbenchError(f"OutOfMemoryError: {last}")
        raise KvbenchError(
            last.removeprefix("error: ") or f"the cell's process exited with {proc.returncode}"
        )
    _check_same_config(config, out)
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


def config_differences(config: RunConfig, folder: Path) -> list[str]:
    """The settings in which `folder/config.json` differs from `config`.

    A calibrated cost model is named by its path; the run also recorded the file's digest, so
    a file refitted in place since counts as a difference (`cost_model`) too.
    """
    wrote = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    # a field the cell's engine never reads (a value a sweep gave every cell before cells ran at
    # its default: `unread_at_defaults`) cannot have made the run differ
    differs = _differing_fields(wrote, config) - unread_fields(config)
    if config.cost_model is not None and "cost_model_sha256" in wrote:
        from kvbench.calibrate.fit import cost_file_digest

        if cost_file_digest(config.cost_model) != wrote["cost_model_sha256"]:
            differs.add("cost_model")
    return sorted(differs)


def _differing_fields(wrote: dict, settings: object) -> set[str]:
    """The fields of the dataclass `settings` whose value differs from the recorded `wrote`."""
    return {path[0] for path, _, _ in recorded_differences(wrote, settings)}


def recorded_differences(
    wrote: dict, settings: object, within: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], object, object]]:
    """(field path, recorded value, value now) for each field of the dataclass `settings` that
    differs from the recorded `wrote`, a nested dataclass field by field (values as JSON holds them).

    A field `wrote` lacks was recorded by a kvbench that predates the setting, and every new
    setting's default is the behaviour before it existed: so a missing field differs only when
    `settings` holds something other than its default (then reported as recorded with it).
    Without this, every cell run before a setting was added would count as another setting's
    and be run again; a sweep.json (`kvbench.sweep.saved`) is read by the same rule.
    """
    for f in fields(settings):
        value, path = getattr(settings, f.name), (*within, f.name)
        if f.name not in wrote:
            if _as_json(value) != _default_json(f):
                yield path, _default_json(f), _as_json(value)
        elif is_dataclass(value) and isinstance(wrote[f.name], dict):
            yield from recorded_differences(wrote[f.name], value, path)
        elif wrote[f.name] != _as_json(value):
            yield path, wrote[f.name], _as_json(value)


def _as_json(value: object) -> object:
    """`value` as config.json records it (a dataclass as a dict, a tuple as a list)."""
    return json.loads(json.dumps(asdict(value) if is_dataclass(value) else value))


def _default_json(f: Field) -> object:
    """The field's default as config.json records it; a marker equal to nothing for a required field."""
    if f.default is not MISSING:
        return _as_json(f.default)
    if f.default_factory is not MISSING:
        return _as_json(f.default_factory())
    return object()


def _check_same_config(config: RunConfig, out: Path) -> None:
    """The child must have run exactly `config`: a flag lost on the way would be a silent bug."""
    differs = config_differences(config, out)
    if differs:
        raise RuntimeError(f"{out}: the child process ran other settings ({', '.join(differs)})")
