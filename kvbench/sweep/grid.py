"""A sweep's grid: axes parsed from the command line, cells, their stable ids and configs.

A cell is one run: an engine x trace x request rate x block size x KV budget x seed x repeat.
Its id is built from those values alone, always all of them and in one order, so the same cell
gets the same folder in every invocation (`--resume` finds it however the axes were listed or
extended):

    paged__trace-sharegpt-paper__rate-2__bs-16__kv-12__seed-0__rep-0

Repeats re-run a cell with the workload seed shifted by `REPEAT_SEED_STRIDE` (new lengths and
arrivals), for confidence intervals; the seed axis names the base seed.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from engines import ENGINES
from kvbench.config import RunConfig, unread_at_defaults
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import MAX_REQUESTS, MAX_SEED, MIN_RATE
from kvbench.plugins import EXTERNAL
from workloads.presets import PRESETS
from workloads.spec import file_rows

REPEAT_SEED_STRIDE = 1000  # repeat r of seed s draws its workload with seed s + 1000 r
PAPER_ENGINES = ("static", "orca-max", "orca-pow2", "orca-oracle", "paged")
GRID, BASELINE, BISECT = "grid", "baseline", "bisect"  # why a cell runs


@dataclass(frozen=True)
class Axes:
    """The values a sweep crosses; None in `rates` / `kv_cache_gib` means the single run's default."""

    engines: tuple[str, ...]
    traces: tuple[str, ...]
    rates: tuple[float | None, ...]
    block_sizes: tuple[int, ...]
    kv_cache_gib: tuple[float | None, ...]
    seeds: tuple[int, ...]
    repeats: int = 1
    # an engine's own rates in place of `rates` (engine, rates): a grid placed around each
    # engine's expected sustained rate, so no engine runs far from its knee (`kvbench reproduce
    # --place-with`); `rates` then lists every engine's, for the record
    engine_rates: tuple[tuple[str, tuple[float, ...]], ...] = ()

    @property
    def swept_rates(self) -> tuple[float, ...]:
        return tuple(rate for rate in self.rates if rate is not None)

    def rates_of(self, engine: str) -> tuple[float | None, ...]:
        """The rates `engine`'s grid cells run at."""
        return dict(self.engine_rates).get(engine, self.rates)


@dataclass(frozen=True)
class Cell:
    role: str  # GRID, BASELINE (the unloaded run that sets a default threshold) or BISECT
    engine: str
    trace: str
    rate: float | None  # requests/s; None: the trace's own timestamps (or 1/s for a preset)
    block_size: int
    kv_cache_gib: float | None  # None: derived from --emulate-gpu
    seed: int
    repeat: int = 0

    @property
    def workload_seed(self) -> int:
        return self.seed + REPEAT_SEED_STRIDE * self.repeat

    @property
    def group(self) -> tuple:
        """What the sustained rate is found over: everything but the rate and the repeat."""
        return (self.engine, self.trace, self.block_size, self.kv_cache_gib, self.seed)

    @property
    def id(self) -> str:
        rate = "unloaded" if self.role == BASELINE else number_token(self.rate)
        kv = number_token(self.kv_cache_gib) if self.kv_cache_gib is not None else "gpu"
        return (
            f"{self.engine}__trace-{trace_token(self.trace)}__rate-{rate}__bs-{self.block_size}"
            f"__kv-{kv}__seed-{self.seed}__rep-{self.repeat}"
        )


def number_token(value: float | None) -> str:
    """`2`, `2.5`, `0.001`: the shortest text that reads back as the same float."""
    if value is None:
        return "trace"
    text = repr(float(value))
    return text.removesuffix(".0")


def trace_token(spec: str) -> str:
    """A folder-safe name for a trace spec; a spec that had to be shortened or cleaned gets a hash."""
    slug = re.sub(r"[^A-Za-z0-9.+-]+", "-", spec).strip("-.")
    if slug == spec and len(slug) <= 40:
        return slug
    return f"{slug[:40].rstrip('-.')}-{hashlib.sha1(spec.encode()).hexdigest()[:8]}"


def grid_cells(axes: Axes) -> list[Cell]:
    """Every grid cell, setup by setup (trace, budget, block size, seed), then engine, rate, repeat."""
    return [
        Cell(GRID, engine, trace, rate, bs, kv, seed, repeat)
        for trace in axes.traces
        for kv in axes.kv_cache_gib
        for bs in axes.block_sizes
        for seed in axes.seeds
        for engine in axes.engines
        for rate in axes.rates_of(engine)
        for repeat in range(axes.repeats)
    ]


@dataclass(frozen=True)
class Baseline:
    """How the unloaded per-token latency is measured: a few requests, far apart."""

    rate: float = 0.001  # requests/s, evenly spaced: 1000 s apart, so each runs alone
    num_requests: int = 50


DURATION_MIN_REQUESTS = 20  # a duration's trace at a low rate: still a few requests to average


def cell_config(
    base: RunConfig, cell: Cell, baseline: Baseline = Baseline(), duration_s: float | None = None
) -> RunConfig:
    """`base` with the cell's axis values; a baseline cell gets constant, sparse arrivals.

    `duration_s`: a loaded cell's trace lasts that long at its rate (rate x duration requests,
    at least `DURATION_MIN_REQUESTS`), as the paper's 1-hour traces did at every rate, rather
    than a fixed count: past an engine's capacity the queue, and so the normalized latency,
    grows with the time the overload lasts, so a fixed count judges a fast engine on a few
    seconds of overload and a slow one on minutes."""
    workload = replace(base.workload, source=cell.trace, seed=cell.workload_seed, rate=cell.rate)
    if duration_s is not None and cell.rate is not None and cell.role != BASELINE:
        count = max(DURATION_MIN_REQUESTS, math.ceil(cell.rate * duration_s))
        if count > MAX_REQUESTS:  # else refused later as a --num-requests the user never typed
            raise KvbenchError(
                f"--duration {duration_s:g} at {cell.rate:g} req/s (--rates): {count:,} requests (rate x "
                f"duration), more than a trace may hold ({MAX_REQUESTS:,}); give a shorter --duration or "
                "lower --rates"
            )
        rows = file_rows(workload)
        if rows is not None and count > rows:  # fewer would shorten the overload the rate is judged on
            raise KvbenchError(
                f"--duration {duration_s:g} at {cell.rate:g} req/s: {count:,} requests (rate x duration, at "
                f"least {DURATION_MIN_REQUESTS}), and {cell.trace} gives {rows:,}; give a shorter --duration "
                "or lower --rates"
            )
        workload = replace(workload, num_requests=count)
    if cell.role == BASELINE:
        count = min(baseline.num_requests, base.workload.num_requests or baseline.num_requests)
        workload = replace(workload, rate=baseline.rate, arrivals="constant")
        # a few requests far apart: a file of fewer rows gives them all
        count = min(count, file_rows(workload) or count)
        workload = replace(workload, num_requests=count)
    elif workload.rate is None and workload.arrivals is None and workload.source in PRESETS:
        workload = replace(workload, rate=1.0)  # as `simulate` does: presets have no timestamps
    config = replace(
        base,
        engine=cell.engine,
        block_size=cell.block_size,
        kv_cache_gib=cell.kv_cache_gib,
        workload=workload,
    )
    return unread_at_defaults(config)  # an engine beside the --block-sizes axis runs its own


# --- parsing the axes ------------------------------------------------------------------------


def _items(flag: str, text: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise KvbenchError(f"{flag}: empty value in {text!r} (a comma-separated list)")
    return list(dict.fromkeys(items))  # repeats dropped, order kept


def _each(flag: str, text: str, convert: Callable[[str], object]) -> tuple:
    return tuple(convert(item) for item in _items(flag, text))


def parse_engines(text: str, real: bool) -> tuple[str, ...]:
    """Engine names; `all`: every kvbench engine (external ones only when asked by name)."""
    if text.strip() == "all":
        return tuple(ENGINES)
    names = (*ENGINES, *EXTERNAL)

    def known(name: str) -> str:
        if name not in names:
            raise KvbenchError(f"--engines: unknown engine {name!r}; choose from {', '.join(names)} or all")
        if name in EXTERNAL and not real:
            raise KvbenchError(f"--engines: {name} is an external engine, it only runs for real (--real)")
        return name

    return _each("--engines", text, known)


def _number(flag: str, kind: type, what: str, ok: Callable[[float], bool]):
    def convert(item: str):
        try:
            value = kind(item)
        except ValueError:
            raise KvbenchError(f"{flag}: {item!r} is not {what}") from None
        if not ok(value):
            raise KvbenchError(f"{flag}: {item!r} is not {what}")
        return value

    return convert


def parse_rates(text: str | None) -> tuple[float | None, ...]:
    if text is None:
        return (None,)
    what = f"a positive number of requests/s (at least {MIN_RATE:g})"  # flag_ranges.MIN_RATE says why
    ok = _number("--rates", float, what, lambda v: math.isfinite(v) and v >= MIN_RATE)
    return tuple(sorted(_each("--rates", text, ok)))


def parse_block_sizes(text: str) -> tuple[int, ...]:
    ok = _number("--block-sizes", int, "a positive power of two", lambda v: v > 0 and not v & (v - 1))
    return _each("--block-sizes", text, ok)


def parse_budgets(text: str | None) -> tuple[float | None, ...]:
    if text is None:
        return (None,)
    ok = _number("--kv-cache-gib", float, "a positive number of GiB", lambda v: math.isfinite(v) and v > 0)
    return _each("--kv-cache-gib", text, ok)


def parse_seeds(text: str) -> tuple[int, ...]:
    ok = _number("--seeds", int, f"an integer >= 0 (at most {MAX_SEED})", lambda v: 0 <= v <= MAX_SEED)
    return _each("--seeds", text, ok)


def parse_traces(specs: list[str] | None) -> tuple[str, ...]:
    traces = tuple(dict.fromkeys(spec.strip() for spec in specs or ["sharegpt-paper"]))
    if not all(traces):
        raise KvbenchError("--trace: empty trace spec")
    return traces
