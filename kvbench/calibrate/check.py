"""How far a calibrated simulation is from the GPU: held-out real runs replayed by the simulator.

A cost model fitted to some runs' step rows can look perfect on those rows and still predict
whole runs badly: queueing amplifies a small per-step bias into a large latency error. So the
check replays each held-out real run (its config.json: same engine, trace, seed, budget and
scheduler settings) through the simulator with the fitted constants, and compares what a user
reads: output-token throughput and normalized latency. The held-out runs should be of other
traces or rates than the fitted ones, or the check says little.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from kvbench.calibrate.fit import Calibration
from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.metrics.summary import Slo
from kvbench.results.files import read_json
from kvbench.results.load import runs_below
from kvbench.results.shape import check_summary
from workloads.spec import WorkloadSpec

METRICS = ("output_token_throughput", "normalized_latency_s")


@dataclass(frozen=True)
class Check:
    run: str
    engine: str
    metric: str
    real: float
    simulated: float

    @property
    def error(self) -> float:
        """Relative error of the simulation, signed: positive when it overestimates."""
        return self.simulated / self.real - 1 if self.real else float("nan")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"error": self.error}


def read_config(run: Path) -> RunConfig:
    """The RunConfig a run folder's config.json was written from."""
    try:
        data = json.loads((run / "config.json").read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise KvbenchError(f"{run}: cannot read config.json ({error.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise KvbenchError(f"{run}/config.json: not a kvbench run config (not a JSON object)")
    known = {f.name for f in fields(RunConfig)}
    values = {key: value for key, value in data.items() if key in known}
    try:
        values["workload"] = WorkloadSpec(**values["workload"])
        values["slo"] = Slo(**values.get("slo", {}))
        values["percentiles"] = tuple(values.get("percentiles", ()))
        return RunConfig(**values)
    except (KeyError, TypeError) as error:
        raise KvbenchError(f"{run}/config.json: not a kvbench run config ({error})") from None


def find_runs(paths: list[Path], *, steps: bool, flag: str) -> list[Path]:
    """The run folders `paths` name (`runs_below` each); a path holding no run is a one-line
    error naming `flag`."""
    found: list[Path] = []
    for path in map(Path, paths):
        below = runs_below(path, steps=steps)
        if not below:
            need = "steps.csv, summary.json and config.json" if steps else "summary.json and config.json"
            raise KvbenchError(f"{flag} {path}: no kvbench run folder ({need}) there or below")
        found += below
    return list(dict.fromkeys(found))  # a run named twice counts once


def check(cost_model: Path, runs: list[Path]) -> list[Check]:
    """Each real run beside its simulation with `cost_model`, metric by metric."""
    from kvbench.simulate import simulate

    checks = []
    for run in runs:
        real = _real_summary(run)
        config = replace(  # the fit prices every step: the run's own cost flags (a simulated run's) do not
            read_config(run), cost_model=str(cost_model), device="cpu",
            cost_fixed_s=None, cost_per_token_s=None, cost_per_kv_token_s=None,
        )  # fmt: skip
        simulated = simulate(config).summary
        checks += [Check(str(run), real["engine"], m, float(real[m]), float(simulated[m])) for m in METRICS]
    return checks


def _real_summary(run: Path) -> dict:
    """A held-out run's summary.json, which must be a real run's."""
    summary = check_summary(run / "summary.json", read_json(run / "summary.json"))
    if summary.get("mode") != "real":
        raise KvbenchError(f"--held-out {run}: not a real run (mode {summary.get('mode')!r})")
    return summary


TARGET = 0.10  # the target: within 10 % of the real run


def summarize(checks: list[Check]) -> dict:
    """Per metric: the median and largest absolute relative error, the count, and how many are
    within `TARGET`."""
    out = {}
    for metric in METRICS:
        errors = sorted(abs(c.error) for c in checks if c.metric == metric)
        if errors:
            out[metric] = {"runs": len(errors), "median_abs_error": errors[len(errors) // 2],
                           "max_abs_error": errors[-1],
                           "within_target": sum(e <= TARGET for e in errors)}  # fmt: skip
    return out


@dataclass(frozen=True)
class FitCheck:
    calibration: Calibration
    checks: list[Check]
    copies: list[Path]  # held-out runs skipped: the same config as a fitted run (a copy of it)


def fit_and_check(fit: list[Path], held_out: list[Path], out: Path, base: Path | None = None) -> FitCheck:
    """Fit the cost model to `fit`, write it to `out`, replay `held_out` with it, and write the
    file again with their errors (`held_out`, `held_out_summary`): what `kvbench calibrate`
    and a real `kvbench reproduce` write. A held-out run whose config.json is a fitted run's (a
    reproduction copies runs between figures) is skipped: its error would be the fit's own.
    Runs are named relative to `base` when given (a reproduction's folder, so that its files
    name its own runs wherever it is moved)."""
    from kvbench.calibrate.fit import calibrate
    from kvbench.results.files import write_json

    fitted = {run.resolve() for run in fit}
    both = [run for run in held_out if run.resolve() in fitted]
    if both:
        raise KvbenchError(f"--held-out {both[0]}: a run cannot be both fitted and held out")
    for run in held_out:  # before fitting: a bad held-out run fails fast, writing nothing
        _real_summary(run)
    configs = {(run / "config.json").read_bytes() for run in fit}
    copies = [run for run in held_out if (run / "config.json").read_bytes() in configs]
    held_out = [run for run in held_out if run not in copies]

    def name(run: Path | str) -> str:
        return str(Path(run).relative_to(base)) if base is not None else str(run)

    result = replace(calibrate(fit), runs=tuple(name(run) for run in fit))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result.to_dict())
    if not held_out:
        return FitCheck(result, [], copies)
    checks = [replace(c, run=name(c.run)) for c in check(out, held_out)]
    write_json(out, result.to_dict() | {"held_out": [c.to_dict() for c in checks],
                                        "held_out_summary": summarize(checks)})  # fmt: skip
    return FitCheck(result, checks, copies)


def format_checks(checks: list[Check]) -> str:
    lines = ["| run | engine | metric | real | simulated | error |", "|---|---|---|---:|---:|---:|"]
    lines += [
        f"| {_name(c.run)} | {c.engine} | {c.metric} | {c.real:.4g} | {c.simulated:.4g} "
        f"| {100 * c.error:+.1f} % |"
        for c in checks
    ]
    return "\n".join(lines)


def _name(run: str) -> str:
    """A relative name as it is (a reproduction's own runs); an absolute path's last two parts
    (cells/<id>, fig13/<engine>: the folder alone is ambiguous)."""
    return run if not Path(run).is_absolute() else "/".join(Path(run).parts[-2:])
