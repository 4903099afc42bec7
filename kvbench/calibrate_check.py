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

from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.metrics import Slo
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
        data = json.loads((run / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise KvbenchError(f"{run}: cannot read config.json ({error.__class__.__name__})") from None
    known = {f.name for f in fields(RunConfig)}
    values = {key: value for key, value in data.items() if key in known}
    try:
        values["workload"] = WorkloadSpec(**values["workload"])
        values["slo"] = Slo(**values.get("slo", {}))
        values["percentiles"] = tuple(values.get("percentiles", ()))
        return RunConfig(**values)
    except (KeyError, TypeError) as error:
        raise KvbenchError(f"{run}/config.json: not a kvbench run config ({error})") from None


def check(cost_model: Path, runs: list[Path]) -> list[Check]:
    """Each real run beside its simulation with `cost_model`, metric by metric."""
    from kvbench.simulate import simulate

    checks = []
    for run in runs:
        real = json.loads((run / "summary.json").read_text())
        if real.get("mode") != "real":
            raise KvbenchError(f"--held-out {run}: not a real run (mode {real.get('mode')!r})")
        config = replace(read_config(run), cost_model=str(cost_model), device="cpu")
        simulated = simulate(config).summary
        checks += [Check(str(run), real["engine"], m, float(real[m]), float(simulated[m])) for m in METRICS]
    return checks


def summarize(checks: list[Check]) -> dict:
    """Per metric: the median and largest absolute relative error, and the count."""
    out = {}
    for metric in METRICS:
        errors = sorted(abs(c.error) for c in checks if c.metric == metric)
        if errors:
            out[metric] = {"runs": len(errors), "median_abs_error": errors[len(errors) // 2],
                           "max_abs_error": errors[-1]}  # fmt: skip
    return out


def format_checks(checks: list[Check]) -> str:
    lines = ["| run | engine | metric | real | simulated | error |", "|---|---|---|---:|---:|---:|"]
    lines += [
        f"| {_name(c.run)} | {c.engine} | {c.metric} | {c.real:.4g} | {c.simulated:.4g} "
        f"| {100 * c.error:+.1f} % |"
        for c in checks
    ]
    return "\n".join(lines)


def _name(run: str) -> str:
    return "/".join(Path(run).parts[-2:])  # cells/<id>, fig13/<engine>: the folder alone is ambiguous
