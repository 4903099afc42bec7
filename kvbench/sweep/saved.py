"""What `kvbench sweep --resume` holds a folder's sweep.json to: the command must continue that sweep.

A resume rewrites sweep.json, sweep.csv and sustained.csv for the sweep it is given, while the
cells already in cells/ stay: so that sweep must still be the one those cells belong to. The
finished cells a resume meets are checked one by one against their config.json
(`kvbench.sweep.run`), but that sees only the cells both grids hold: a command with other
seeds or other engines (or a folder with no finished cell yet) would pass it, and the tables
would then describe a grid the folder's cells are not, which `kvbench compare` mixes. So the
settings sweep.json saved are compared with the new command's as well. A resume may change:

- an axis, by adding values (their cells join the grid; finished cells keep their ids);
- the bisection, by taking it further (`--bisect` up, `--bracket` narrower: the midpoints
  before are the same, and found finished);
- how and where cells run: `--isolate`, `--cell-timeout`, `--executor`, `--parallel-gpus`,
  `--continue-on-error`, `--deadline-s`.

Everything else must match: what a cell measures (the base settings, real or simulated, step by
step or coalesced, `--duration`) and the bound the search judges rates against (with the
baselines that set it). A key an older sweep.json lacks counts as its setting's default, as in
a cell's config.json (`recorded_differences`), so a sweep made before the setting existed
resumes with its original command.
"""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.flags import REAL_FLAGS, WORKLOAD_FLAGS
from kvbench.results.files import read_json
from kvbench.sweep.cell import recorded_differences
from kvbench.sweep.grid import REPEAT_SEED_STRIDE, number_token
from kvbench.sweep.plan import SustainedOptions, SweepPlan

# the base settings each cell replaces with its axis values: what the base holds there is no setting
PER_CELL = ("engine", "block_size", "kv_cache_gib")
PER_CELL_WORKLOAD = ("source", "seed", "rate")
AXES = (  # Axes field, its flag; rates are compared engine by engine (`_rates`)
    ("engines", "--engines"), ("traces", "--trace"), ("block_sizes", "--block-sizes"),
    ("kv_cache_gib", "--kv-cache-gib"), ("seeds", "--seeds"),
)  # fmt: skip
ADDED_ONLY = "a resume may add values, not drop them"
FURTHER_ONLY = "a resumed bisection may go further, not stop sooner"
_WORKLOAD_OPTIONS = {flag.field: flag.option for flag in WORKLOAD_FLAGS}
_REAL_OPTIONS = {flag.field: flag.option for flag in REAL_FLAGS}


def resume_difference(plan: SweepPlan, path: Path) -> str | None:
    """The first setting in which `plan` departs from the sweep saved in `path` (a sweep.json)
    further than a resume may, as `--flag: <saved> there, <plan's> now`; None where `plan`
    continues that sweep, or where there is no sweep.json (a resume into an empty folder)."""
    if not Path(path).is_file():
        return None
    saved = read_json(path)
    for check in (_measured, _axes, _base, _search):
        found = check(plan, saved, path)
        if found is not None:
            return found
    return None


def _measured(plan: SweepPlan, saved: dict, path: Path) -> str | None:
    """What every cell measures beside its config: real or simulated, step by step or
    coalesced (a real step-by-step run syncs every step), the trace's length per rate."""
    mode = "real" if plan.run.real else "simulated"
    if saved.get("mode", mode) != mode:
        return _said("--real/--simulate", saved.get("mode"), mode)
    for where, there, now in recorded_differences(_section(saved, "cell_run", path), plan.run):
        if where == ("step_by_step",):
            return _said("--step-by-step", there, now)
    if saved.get("duration_s") != plan.duration_s:  # absent before --duration: None, as now
        return _said("--duration", saved.get("duration_s"), plan.duration_s)
    if saved.get("repeat_seed_stride", REPEAT_SEED_STRIDE) != REPEAT_SEED_STRIDE:
        return _said("the repeats' seed stride", saved["repeat_seed_stride"], REPEAT_SEED_STRIDE)
    return None


def _axes(plan: SweepPlan, saved: dict, path: Path) -> str | None:
    """An axis value the saved grid has and `plan`'s lacks: its cells would stay in cells/ with
    no row in the tables that describe the folder."""
    there, now = _section(saved, "axes", path), _as_json(plan.axes)
    for name, flag in AXES:
        values = _list(there, name, path)
        if any(value not in now[name] for value in values):
            return _said(flag, values, now[name], ADDED_ONLY)
    if there.get("repeats", 1) > plan.axes.repeats:
        return _said("--repeats", there["repeats"], plan.axes.repeats, ADDED_ONLY)
    return _rates(plan, there, path)


def _rates(plan: SweepPlan, there: dict, path: Path) -> str | None:
    """A saved rate an engine's grid no longer runs at (an engine's own rates, where `kvbench
    reproduce` placed them, else the sweep's)."""
    try:
        placed = {engine: rates for engine, rates in _list(there, "engine_rates", path)}
    except (TypeError, ValueError):
        raise KvbenchError(f"{path}: axes.engine_rates is not a list of [engine, rates] pairs") from None
    rates = _list(there, "rates", path)
    for engine in _list(there, "engines", path):
        old, new = placed.get(engine, rates), _as_json(plan.axes.rates_of(engine))
        if any(rate not in new for rate in old):
            flag = f"--rates of {engine}" if placed or plan.axes.engine_rates else "--rates"
            return _said(flag, old, new, ADDED_ONLY)
    return None


def _base(plan: SweepPlan, saved: dict, path: Path) -> str | None:
    """A setting every cell shares (`--model`, `--num-requests`, `--preemption`, ...)."""
    recorded = dict(_section(saved, "base_config", path))
    now = _as_json(plan.base)
    recorded.update({name: now[name] for name in PER_CELL})
    workload = _section(recorded, "workload", path)
    recorded["workload"] = {**workload, **{name: now["workload"][name] for name in PER_CELL_WORKLOAD}}
    for where, there, here in recorded_differences(recorded, plan.base):
        return _said(_base_flag(where), there, here)
    return None


def _search(plan: SweepPlan, saved: dict, path: Path) -> str | None:
    """The sustained-rate search: the bound (and the baselines that set it) must be the same; the
    bisection may only go further along the same midpoints."""
    there, options, default = _section(saved, "sustained", path), plan.sustained, SustainedOptions()
    flags = {("threshold_s",): "--latency-threshold", ("extend",): "steps past the grid (reproduce's)"}
    if options.threshold_s is None:  # the bound is a multiple of the baselines' latency
        flags |= {
            ("multiple",): "--threshold-multiple", ("baseline", "rate"): "--baseline-rate",
            ("baseline", "num_requests"): "--baseline-requests",
        }  # fmt: skip
    for where, was, now in recorded_differences(there, options):
        if where in flags:
            return _said(flags[where], was, now)
    before = SustainedOptions(bisect=there.get("bisect", default.bisect), bracket=there.get("bracket"))
    # where the saved search bisected, the new one must not stop at a wider bracket
    narrower = options.bracket is None or (before.bracket is not None and options.bracket <= before.bracket)
    if options.extend:  # each step past the grid is a bracket wide: another bracket, other steps
        narrower = options.bracket == before.bracket
    if options.max_rounds < before.max_rounds or not (narrower or before.max_rounds == 0):
        return _said("the bisection", _depth(before), _depth(options), FURTHER_ONLY)
    return None


def _depth(options: SustainedOptions) -> str:
    """How far a search bisects, as its flags: `--bisect 3 --bracket 0.1`."""
    bracket = f" --bracket {number_token(options.bracket)}" if options.bracket is not None else ""
    return f"--bisect {options.bisect}{bracket}"


def _base_flag(where: tuple[str, ...]) -> str:
    """The flag of a base setting: `("workload", "window_start_s")` is `--window-start`."""
    if where[0] == "workload" and len(where) > 1:
        return _WORKLOAD_OPTIONS.get(where[1], where[1])
    flag = _REAL_OPTIONS.get(where[0]) or "--" + where[0].replace("_", "-")
    return flag + (f" ({'.'.join(where[1:])})" if len(where) > 1 else "")


def _said(setting: str, there: object, now: object, note: str = "") -> str:
    return f"{setting}: {_shown(there)} there, {_shown(now)} now" + (f"; {note}" if note else "")


def _shown(value: object) -> str:
    """A saved or current value as a command line would give it: `1,2`, `0.5`, `on`, `none`."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return number_token(value)
    if isinstance(value, list | tuple):
        return ",".join(_shown(item) for item in value) or "none"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _as_json(value: object) -> object:
    """`value` (a dataclass as a dict) as sweep.json records it: tuples as lists."""
    return json.loads(json.dumps(asdict(value) if is_dataclass(value) else value))


def _section(saved: dict, name: str, path: Path) -> dict:
    """One object of sweep.json (absent: {}, every setting in it its default)."""
    value = saved.get(name, {})
    if not isinstance(value, dict):
        raise KvbenchError(f"{path}: {name} is not a JSON object: not a sweep.json kvbench wrote")
    return value


def _list(section: dict, name: str, path: Path) -> list:
    """One axis' values from sweep.json's `axes` (absent: none)."""
    value = section.get(name, [])
    if not isinstance(value, list):
        raise KvbenchError(f"{path}: axes.{name} is not a JSON list: not a sweep.json kvbench wrote")
    return value
