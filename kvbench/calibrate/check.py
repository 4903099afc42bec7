"""How far a calibrated simulation is from the GPU: held-out real runs replayed by the simulator.

A cost model fitted to some runs' step rows can look perfect on those rows and still predict
whole runs badly: queueing amplifies a small per-step bias into a large latency error. So the
check replays each held-out real run (its config.json: same engine, trace, seed, budget and
scheduler settings) through the simulator with the fitted constants, and compares what a user
reads: output-token throughput, normalized latency and mean TTFT.

Two things made an earlier count of "runs within 10 %" say more than it measured, and both are
now kept apart:

- A held-out run must be another draw of requests. A workload's lengths and arrival times are
  drawn from its seed, and the first k requests of a trace are the k-request trace of the same
  seed, so a run of the fitting runs' trace and seed at another rate or request count replays
  the fitted requests (or a prefix of them). Such a run shares the fitting runs' trace draw: it
  is dropped, and said so, never counted as held out (`shared_draw`).
- A run that never queued predicts its own throughput: completed throughput then equals the
  arrival rate whatever the step times. A held-out run is *loaded* when a request waited for
  admission (`saturated_s` > 0) or its completed throughput is below 0.95 x the arrival rate;
  errors are summarised for loaded and unloaded runs apart, and the loaded runs' count within
  10 % is the headline (`summarize`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from kvbench.calibrate.fit import Calibration, replays_prefills
from kvbench.config import RunConfig
from kvbench.errors import KvbenchError
from kvbench.metrics.summary import Slo
from kvbench.results.files import read_json
from kvbench.results.load import runs_below
from kvbench.results.shape import check_summary
from workloads.spec import WorkloadSpec

METRICS = ("output_token_throughput", "normalized_latency_s", "mean_ttft_s")  # TTFT where the summary has it
LOADED_THROUGHPUT = 0.95  # completed throughput below this share of the arrival rate: the run is loaded


@dataclass(frozen=True)
class Check:
    run: str
    engine: str
    metric: str
    real: float
    simulated: float
    loaded: bool | None = None  # the real run queued (see `is_loaded`); None: not known

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
    """The run folders `paths` name (`runs_below` each); a path holding no run, or a run named
    twice (the same folder twice, or a folder and one holding it), is a one-line error naming
    `flag`: dropping the repeat silently would fit other runs than the command line reads."""
    found: list[Path] = []
    named: dict[Path, Path] = {}  # each run found, resolved -> the path that named it
    for path in map(Path, paths):
        below = runs_below(path, steps=steps)
        if not below:
            need = "steps.csv, summary.json and config.json" if steps else "summary.json and config.json"
            raise KvbenchError(f"{flag} {path}: no kvbench run folder ({need}) there or below")
        for run in below:
            first = named.setdefault(run.resolve(), path)
            if first is not path:
                by = "twice" if first.resolve() == path.resolve() else f"by {first} and by {path}"
                raise KvbenchError(f"{flag}: run folder {run} is named {by}")
        found += below
    return found


def trace_draw(config: RunConfig) -> tuple[str, int]:
    """What fixes a run's requests: its trace and seed. Runs at other rates or request counts
    with the same two share their lengths (the shorter's are the longer's first ones)."""
    return config.workload.source, config.workload.seed


def workload_identity(config: RunConfig) -> dict:
    """A run's workload as a report names it: trace, seed, request count, rate."""
    w = config.workload
    return {"trace": w.source, "seed": w.seed, "num_requests": w.num_requests, "rate": w.rate}


def shared_draw(fit: list[Path], held_out: list[Path]) -> list[tuple[Path, Path]]:
    """(held-out run, a fitted run it shares its trace draw with) for every held-out run whose
    trace and seed a fitted run has: its requests are fitted ones, so it is not held out."""
    drawn: dict[tuple[str, int], Path] = {}
    for run in fit:
        drawn.setdefault(trace_draw(read_config(run)), run)
    shared = []
    for run in held_out:
        twin = drawn.get(trace_draw(read_config(run)))
        if twin is not None:
            shared.append((run, twin))
    return shared


def is_loaded(run: Path, summary: dict, config: RunConfig) -> bool:
    """A queue formed (some request waited for admission: `saturated_s` > 0), or the run
    completed requests slower than they arrived (below `LOADED_THROUGHPUT` x the arrival
    rate: the `--rate` asked for, else the rate the trace's arrival times make)."""
    if float(summary.get("saturated_s") or 0.0) > 0:
        return True
    rate = config.workload.rate
    if rate is None:
        from kvbench.results.load import read_csv  # pandas: only for runs replaying timestamps

        arrivals = read_csv(run / "requests.csv").get("arrival_s")
        span = float(arrivals.max() - arrivals.min()) if arrivals is not None and len(arrivals) > 1 else 0.0
        if span <= 0:
            return False  # every request at once: no rate to fall behind
        rate = (len(arrivals) - 1) / span
    return float(summary["request_throughput"]) < LOADED_THROUGHPUT * rate


def check(cost_model: Path, runs: list[Path]) -> list[Check]:
    """Each real run beside its simulation with `cost_model`, metric by metric (a metric the
    real summary lacks, such as an older run's TTFT, is left out)."""
    from kvbench.simulate import simulate

    checks = []
    for run in runs:
        real = _real_summary(run)
        recorded = read_config(run)
        loaded = is_loaded(run, real, recorded)
        simulated = simulate(replay_config(recorded, str(cost_model))).summary
        checks += [
            Check(str(run), real["engine"], m, float(real[m]), float(simulated[m]), loaded)
            for m in METRICS if real.get(m) is not None
        ]  # fmt: skip
    return checks


def replay_config(recorded: RunConfig, cost_model: str | None) -> RunConfig:
    """A real run's config as its simulation replays it with `cost_model`. The fit prices every
    step: the run's own cost flags (a simulated run's) do not. No kernel runs in the replay, so
    the attention a GPU run recorded (--attention triton, refused on the replay's cpu device) is
    set back to the default."""
    return replace(
        recorded, cost_model=cost_model, device="cpu", attention="auto",
        cost_fixed_s=None, cost_per_token_s=None, cost_per_kv_token_s=None,
    )  # fmt: skip


def check_replayable(run: Path) -> None:
    """Refuse, before anything is fitted or written, a held-out run whose config.json a replay
    could not run (an engine, size or workload kvbench refuses, a value of the wrong type), in
    one line naming the file: the flags kvbench's message names were never typed here."""
    from kvbench.config import prepare

    where = run / "config.json"
    try:
        prepare(replay_config(read_config(run), None))
    except KvbenchError as error:
        raise KvbenchError(f"--held-out {where}: {error}") from None
    except (TypeError, ValueError) as error:  # a value of the wrong type where a number belongs
        raise KvbenchError(f"--held-out {where}: not a kvbench run config ({error})") from None


def _real_summary(run: Path) -> dict:
    """A held-out run's summary.json, which must be a real run's."""
    summary = check_summary(run / "summary.json", read_json(run / "summary.json"))
    if summary.get("mode") != "real":
        raise KvbenchError(f"--held-out {run}: not a real run (mode {summary.get('mode')!r})")
    return summary


TARGET = 0.10  # the target: within 10 % of the real run


LOADS = ("loaded", "unloaded")


def _spread(errors: list[float]) -> dict:
    """The count, median and largest absolute error, and how many are within `TARGET`."""
    errors = sorted(errors)
    if not errors:
        return {"runs": 0, "median_abs_error": None, "max_abs_error": None, "within_target": 0}
    return {"runs": len(errors), "median_abs_error": errors[len(errors) // 2], "max_abs_error": errors[-1],
            "within_target": sum(e <= TARGET for e in errors)}  # fmt: skip


def summarize(checks: list[Check]) -> dict:
    """Per metric: the spread of absolute relative errors over all runs (`runs`,
    `median_abs_error`, `max_abs_error`, `within_target`), and the same for the `loaded` and
    the `unloaded` runs apart (a run of unknown load counts in neither)."""
    out = {}
    for metric in METRICS:
        mine = [c for c in checks if c.metric == metric]
        if mine:
            out[metric] = _spread([abs(c.error) for c in mine]) | {
                load: _spread([abs(c.error) for c in mine if c.loaded is (load == "loaded")])
                for load in LOADS
            }
    return out


def by_load(summary: dict) -> list[tuple[str, str, dict]]:
    """(load, metric, spread) for each metric of a `summarize` result, every loaded row before
    any unloaded one: the loaded runs test the fit, so they are read first. A summary written
    before the split gives no run for either load, never the pooled spread under a load's name."""
    return [(load, metric, m.get(load, {"runs": 0})) for load in LOADS for metric, m in summary.items()]


def format_summary(checks: list[Check]) -> str:
    """The opening of a held-out report: the headline (`headline`), then per load and metric
    the runs, how many are within `TARGET`, and the median and largest absolute error, so that
    no reader has to count rows, nor reads an unloaded run's free match as the fit's."""
    target = f"{100 * TARGET:.0f} %"
    lines = [
        f"Headline: {headline(checks)}.",
        "",
        f"Loaded: a request waited for admission, or the run completed below {LOADED_THROUGHPUT} x its "
        "arrival rate. Unloaded: its throughput is the arrival rate whatever the step times, so its "
        "error says little of the fit.",
        "",
        f"| load | metric | runs | within {target} | median abs. error | largest abs. error |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {load} | {metric} | {s['runs']} | {s.get('within_target', 0)} "
        f"| {_percent(s.get('median_abs_error'))} | {_percent(s.get('max_abs_error'))} |"
        for load, metric, s in by_load(summarize(checks))
    ]
    unknown = len({c.run for c in checks if c.loaded is None})
    if unknown:
        lines += ["", f"{unknown} runs of unknown load are counted in neither row."]
    return "\n".join(lines)


def _percent(error: float | None) -> str:
    return "-" if error is None else f"{100 * error:.1f} %"


def headline(checks: list[Check]) -> str:
    """One line: per metric, the loaded runs within `TARGET` (what a held-out check measures),
    then the unloaded ones."""
    parts = []
    for metric, m in summarize(checks).items():
        loaded, unloaded = m.get("loaded", {}), m.get("unloaded", {})
        parts.append(
            f"{metric} {loaded.get('within_target', 0)} of {loaded.get('runs', 0)} loaded runs within "
            f"{100 * TARGET:.0f} % ({unloaded.get('within_target', 0)} of {unloaded.get('runs', 0)} unloaded)"
        )
    return "; ".join(parts)


def named(result: Calibration, name: Callable[[str], str]) -> Calibration:
    """A calibration (and its fits by engine) with its runs named by `name`."""
    engines = {engine: named(fit, name) for engine, fit in result.engines.items()}
    return replace(result, runs=tuple(name(run) for run in result.runs), engines=engines)


@dataclass(frozen=True)
class FitCheck:
    calibration: Calibration
    checks: list[Check]
    # held-out runs dropped, each with a fitted run of the same trace draw (`shared_draw`;
    # a copy of a fitted run is one)
    dropped: list[tuple[Path, Path]]


def fit_and_check(
    fit: list[Path], held_out: list[Path], out: Path, base: Path | None = None, objective: str | None = None,
    by_engine: bool = False, knee_gain: float | None = None,
) -> FitCheck:  # fmt: skip
    """Fit the cost model to `fit`, write it to `out`, replay `held_out` with it, and write the
    file again with their errors (`held_out`, `held_out_summary`): what `kvbench calibrate`
    and a real `kvbench reproduce` write. A held-out run that shares a fitted run's trace draw
    (`shared_draw`: a reproduction copies runs between figures, and reruns one trace and seed at
    other rates) is dropped and listed (`held_out_dropped`): its error would be the fit's own.
    Runs are named relative to `base` when given (a reproduction's folder, so that its files
    name its own runs wherever it is moved). `objective`: the fit's (`OBJECTIVES`; None: the
    default); `by_engine`: also fit each engine's runs alone (`calibrate`), which then price that
    engine's held-out runs; `knee_gain`: the knee's rule (`KNEE_GAIN`; None: the default)."""
    from kvbench.calibrate.fit import DEFAULT_OBJECTIVE, KNEE_GAIN, calibrate
    from kvbench.results.files import write_json

    fitted = {run.resolve() for run in fit}
    both = [run for run in held_out if run.resolve() in fitted]
    if both:
        raise KvbenchError(f"--held-out {both[0]}: a run cannot be both fitted and held out")
    for run in held_out:  # before fitting: a bad held-out run fails fast, writing nothing
        _real_summary(run)
        check_replayable(run)
    _same_prefills(fit, held_out)
    _same_model(fit, held_out)
    dropped = shared_draw(fit, held_out)
    held_out = [run for run in held_out if run not in {run for run, _ in dropped}]

    def name(run: Path | str) -> str:
        return str(Path(run).relative_to(base)) if base is not None else str(run)

    gain = KNEE_GAIN if knee_gain is None else knee_gain
    fitted = calibrate(fit, objective=objective or DEFAULT_OBJECTIVE, by_engine=by_engine, knee_gain=gain)
    result = named(fitted, name)
    _refuse_free_steps(result)
    notes = {"held_out_dropped": [
        {"run": name(run), "shares_draw_with": name(twin), **workload_identity(read_config(run))}
        for run, twin in dropped
    ]} if dropped else {}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result.to_dict() | notes)
    if not held_out:
        return FitCheck(result, [], dropped)
    checks = [replace(c, run=name(c.run)) for c in check(out, held_out)]
    write_json(out, result.to_dict() | notes | {"held_out": [c.to_dict() for c in checks],
                                                "held_out_summary": summarize(checks)})  # fmt: skip
    return FitCheck(result, checks, dropped)


def _refuse_free_steps(result: Calibration) -> None:
    """Refuse, before anything is written, a fit (of every run, or of one engine's) whose step
    costs nothing: steps whose measured time does not grow with the batch or the context, and
    a fixed cost clamped to 0 by the other terms, leave a file every simulation would refuse to
    price (`CostModel.takes_time`). Written, it would replace a good fit at the same path."""
    fits = [("the fit of every run", result), *((f"the fit of {e}", f) for e, f in result.engines.items())]
    for label, fit in fits:
        if not fit.cost.takes_time():
            raise KvbenchError(
                f"the cost model: {label} ({fit.rows} step rows) prices a step at 0 s (fixed, per "
                "decode row and per context token all 0): its steps' measured time does not grow with "
                "their batch or context; fit longer or more loaded runs. Nothing written"
            )


def _same_prefills(fit: list[Path], held_out: list[Path]) -> None:
    """Refuse a held-out run whose short prefills ran another way than the fitted runs' (CUDA
    graphs or eager, `replays_prefills`): the fit prices one kind, so the other's error would be
    the prefill mode's, not the model's."""
    fitted = {replays_prefills(_config(run)) for run in fit}
    for run in held_out:
        replayed = replays_prefills(_config(run))
        if fitted == {not replayed}:
            ran, fit_ran = ("as CUDA graphs", "eagerly") if replayed else ("eagerly", "as CUDA graphs")
            raise KvbenchError(
                f"--held-out {run}: its short prefills ran {ran} and the fitted runs' {fit_ran} "
                "(--prefill-graphs); hold out runs of the fit's kind"
            )


def _same_model(fit: list[Path], held_out: list[Path]) -> None:
    """Refuse, before the fit is written, a held-out run of another model than the fitted runs':
    its replay would refuse the fitted file later, naming a --cost-model the user never typed."""
    fitted = {_config(run).get("model") for run in fit}
    if len(fitted) != 1:
        return  # several models (or none named): the fit itself says so
    (model,) = fitted
    for run in held_out:
        held = _config(run).get("model")
        if held != model:
            raise KvbenchError(f"--held-out {run}: a run of {held}, and the fitted runs are of {model}")


def _config(run: Path) -> dict:
    """A run's config.json, empty where it has none (as the fit reads it: `read_rows`)."""
    return read_json(run / "config.json") if (run / "config.json").is_file() else {}


def dropped_note(dropped: list[tuple[Path, Path]], name=str) -> str:
    """One line naming the held-out runs dropped for sharing a fitted run's trace draw."""
    runs = ", ".join(f"{name(run)} (as {name(twin)})" for run, twin in dropped)
    return f"dropped {len(dropped)} held-out runs with a fitted run's trace and seed, so its requests: {runs}"


def format_checks(checks: list[Check]) -> str:
    """Every check, loaded runs first (the ones that test the fit), then unloaded ones."""
    lines = ["| run | engine | load | metric | real | simulated | error |"]
    lines.append("|---|---|---|---|---:|---:|---:|")
    order = sorted(checks, key=lambda c: {True: 0, False: 1, None: 2}[c.loaded])  # stable: run order kept
    lines += [
        f"| {_name(c.run)} | {c.engine} | {_load(c.loaded)} | {c.metric} | {c.real:.4g} | {c.simulated:.4g} "
        f"| {100 * c.error:+.1f} % |"
        for c in order
    ]
    return "\n".join(lines)


def _load(loaded: bool | None) -> str:
    return "?" if loaded is None else LOADS[not loaded]


def _name(run: str) -> str:
    """A relative name as it is (a reproduction's own runs); an absolute path's last two parts
    (cells/<id>, fig13/<engine>: the folder alone is ambiguous)."""
    return run if not Path(run).is_absolute() else "/".join(Path(run).parts[-2:])
