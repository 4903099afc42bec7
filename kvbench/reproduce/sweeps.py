"""Figures 12, 18b and 19 of `kvbench reproduce`: sweeps through `kvbench.sweep.run`'s Python API.

Each figure is one or more sweep folders (sweep.json, sweep.csv, sustained.csv, cells/) under
the figure's folder, so `kvbench report` and `kvbench sweep --resume` work on them as on any
sweep. Real runs (`Setting.real`) run in this process, one after the other (each cell builds its
runner and frees it; a process per cell would pay CUDA's start-up each time); a quick real run
uses the `real` grids below, a few points each, and the calibrated simulation fills in between.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvbench.calibrate.fit import calibrate
from kvbench.config import RunConfig
from kvbench.cost_model import CostModel
from kvbench.errors import KvbenchError
from kvbench.paper import (
    FIG12_SUSTAINED,
    FIG12_THRESHOLD_S,
    FIG18B_BEST,
    FIG19_COMPARABLE_BLOCK_SIZES,
    FIG19_RECOMPUTE_MS,
    FIG19_SWAP_MS,
    RATIO_BASELINES,
)
from kvbench.report.figures import PlotSkipped, plot_block_size, plot_latency_vs_rate
from kvbench.report.style import pyplot, save
from kvbench.reproduce.rows import SET_ASIDE, FigureResult, Options, Row, find
from kvbench.reproduce.verdicts import (
    DIFFERS,
    INCONCLUSIVE,
    MATCHES,
    NOT_MEASURED,
    Interval,
    Verdict,
    assumed_terms,
    figure_verdict,
    missing,
    order_verdict,
    range_verdict,
    unmeasured,
    value_verdict,
)
from kvbench.results.load import Run, load_run
from kvbench.sweep.cell import CellRun
from kvbench.sweep.grid import PAPER_ENGINES, Axes, Baseline
from kvbench.sweep.plan import SustainedOptions, SweepPlan
from kvbench.sweep.run import OtherSettings, SweepResult, run_sweep
from kvbench.sweep.stats import rate_latency, ratio_interval, sustained_rate
from workloads.spec import WorkloadSpec, build_trace

POWERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# the paper's rates (req/s) around each engine's sustained rate; times Setting.rate_scale
FIG12_RATES = {
    "sharegpt-paper": {
        "quick": (0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0),
        "real": (0.125, 0.5, 1.0, 2.0, 4.0),
        "full": (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0),
    },
    "alpaca-paper": {
        "quick": (4.0, 8.0, 16.0, 32.0, 64.0, 96.0, 128.0),
        "real": (0.5, 2.0, 8.0),
        "full": (2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0),
    },
}
FIG12_REQUESTS = {"quick": 600, "full": 3000, "real": 120}  # a short trace never queues long enough
FIG12_COUNTS = tuple(FIG12_REQUESTS[k] for k in ("quick", "full", "real"))
# The real grids (here, in reproduce_engines and reproduce_sharing) are as small as the figures
# stay true at: a run with about half their requests and rates (11 minutes on an H200, not 22)
# lost paged's >90 % token-state share and shrank most capacity ratios, Figure 16's by a third
# or more (results/reference/quick-real-short/README.md).
REAL_BASELINE = Baseline(num_requests=5)  # each request alone: seconds each on a GPU
FIG18B_RATE = {"sharegpt-paper": 1.5, "alpaca-paper": 20.0}  # near vLLM's sustained rate
FIG19_RATE = 2.0  # ShareGPT, on a quarter of the budget: paged preempts
FIG19_BUDGET_SHARE = 0.25
THRESHOLD_MULTIPLE = 4.0  # off the paper's setting: the bound is this x the lowest unloaded latency
# placed real runs: every loaded cell's trace lasts 60 s at its rate (the paper's: 1 hour). Simulated
# at OPT-13B on the H200's fitted costs, paged's ShareGPT ratios at 60 s are within 12 % of those at
# 300 s, at 120 s within 4 % (results/reference/fig12-duration-sim); 60 s makes one seed's real
# ShareGPT panel about 15 H200-minutes
FIG12_PLACED_DURATION_S = 60.0
FIG12_BRACKET = 0.10  # Figure 12's sustained rates bisected to brackets at most 10 % wide
# Figure 12's ratios again at these multiples of the bound. 0.75 and 1.25 because real cells are
# placed around the bound, so only nearby bounds still bracket a rate: OPT-13B's Alpaca panel with
# replayed prefills turns from "paper above" to "paper inside" between 1 and 1.1 x
# (results/reference/fig12-alpaca-prefill-graphs); 0.5, 2 and 4 for the wide simulated grids
SENSITIVITY = (0.5, 0.75, 1.0, 1.25, 2.0, 4.0)


def sweep(options: Options, folder: Path, *, engines, trace, rates, block_sizes, kv, preemption="recompute",
          threshold: float | None = FIG12_THRESHOLD_S, bisect: int = 0, bracket: float | None = None,
          requests: tuple[int, int, int] = (200, 2000, 100), model: str | None = None,
          workload: dict | None = None, duration: float | None = None,
          tables: bool = True) -> SweepResult:  # fmt: skip
    """One sweep folder of a figure: `engines` x `rates` (the paper's, times the setting's scale)
    x `block_sizes` on `trace`; `workload` sets WorkloadSpec fields every cell keeps (n, beams,
    a shared prefix, chat turns), `model` replaces the setting's. `bracket`: bisect each sustained
    rate until its bracket is at most that wide (`bisect` then caps the rounds; 0: no cap).
    `duration`: each loaded cell's trace lasts that many seconds at its rate, not `requests`.
    `tables`: False keeps only each cell's summary (a placement simulation's cells).

    Real runs with `Setting.placement` and a `bracket` run each engine at two rates either side of
    the sustained rate the calibrated simulator finds for the same cells (`placed_rates`; its sweep
    in `<folder>.placement/`), stepping past them where the real runs disagree, and bisecting."""
    s = options.setting
    count = options.requests(*requests)
    spec = WorkloadSpec(trace, num_requests=count, seed=options.seed, **(workload or {}))
    base = RunConfig(
        engines[0], model=model or s.model, workload=spec, kv_cache_gib=kv, preemption=preemption,
        **s.run_fields(),
    )  # fmt: skip
    axes = Axes(tuple(engines), (trace,), tuple(r * s.rate_scale for r in rates), tuple(block_sizes), (kv,),
                (options.seed,))  # fmt: skip
    extend = 0
    places = s.real and s.placement and bracket is not None and len(rates) > 1 and len(block_sizes) == 1
    if s.place_only and not places:
        raise KvbenchError(f"--place-only: {folder} is not a sweep of placed real runs")
    if places:
        placed = already_placed(folder, engines) or placed_rates(
            options, folder.with_name(f"{folder.name}.placement"), engines=engines, trace=trace, rates=rates,
            block_sizes=block_sizes, kv=kv, preemption=preemption, threshold=threshold, count=count,
            model=model, workload=workload, duration=duration,
        )  # fmt: skip
        if s.place_only:  # the placement alone: no real cell runs
            pairs = ", ".join(f"{engine} {low:g} and {high:g}" for engine, (low, high) in placed.items())
            print(f"{folder}: placed {pairs}")
            return SweepResult([], [], 0, 0, 0)
        every = tuple(sorted({r for pair in placed.values() for r in pair}))
        axes = replace(axes, rates=every, engine_rates=tuple(placed.items()))
        extend = PLACED_STEPS
    baseline = REAL_BASELINE if s.real or s.placement else Baseline()
    sustained = SustainedOptions(threshold, THRESHOLD_MULTIPLE, bisect, baseline, bracket, extend)
    plan = SweepPlan(axes, base, CellRun(real=s.real, tables=tables), sustained, duration_s=duration)
    if (folder / "sweep.json").is_file():
        try:  # an interrupted figure resumes: finished cells of these settings are kept
            return run_sweep(plan, folder, resume=True, deadline=options.deadline)
        except OtherSettings as other:  # another setting's sweep: set aside or replaced, and said so
            kept = set_aside(folder) if s.real else None
            where = f"set aside in {kept}" if kept else "replaced"
            said = f"{other.folder} ran {other.settings}: its runs {where}, the figure's start again"
            print(f"reproduce: {said}", file=sys.stderr)
    return run_sweep(plan, folder, overwrite=True, deadline=options.deadline)


def set_aside(folder: Path) -> Path:
    """Move a sweep of real runs made with other settings to `<seed folder>/earlier/<sweep>[-n]/`
    rather than deleting it: its runs cost GPU time, and the other settings may have been the
    right ones. Runs there are no figure's (`rows.SET_ASIDE`)."""
    target = folder.parent / SET_ASIDE / folder.name
    n = 1
    while target.exists():
        n += 1
        target = folder.parent / SET_ASIDE / f"{folder.name}-{n}"
    target.parent.mkdir(parents=True, exist_ok=True)
    folder.rename(target)
    return target


PLACEMENT_BRACKET = 0.02  # the calibrated simulation bisects each sustained rate this fine
PLACED_SPREAD = 1.045  # real runs at r / 1.045 and r x 1.045: 9.2 % apart, inside FIG12_BRACKET
PLACED_STEPS = 4  # real runs past a placed pair at most, where the simulation was off by more


def placed_rates(options: Options, folder: Path, *, count: int, **cells) -> dict[str, tuple[float, float]]:
    """Each engine's two real rates, either side of its sustained rate in a simulation of the
    same cells (trace draw, arrivals, requests, budget, block size, bound rule, baselines) by the
    cost model fitted on this model's real runs (`Setting.placement`).

    The simulation bisects to `PLACEMENT_BRACKET`; the real runs go to its midpoint r divided and
    multiplied by `PLACED_SPREAD`, so where the simulation is right within 4.5 % two real runs
    bracket the sustained rate narrower than Figure 12 asks, and where it is not, the sweep
    steps past them (`SustainedOptions.extend`). An engine the simulation never saw fail is
    placed at the highest rate it passed (a lower bound: the steps go up from there).
    """
    s = options.setting
    # `placement` kept: the simulated cells take the real ones' baselines (`sweep`); not being
    # real, they place nothing themselves
    simulated = replace(s, real=False, cost_model=s.placement, place_only=False)
    result = sweep(replace(options, setting=simulated), folder, bracket=PLACEMENT_BRACKET,
                   requests=(count, count, count), tables=False, **cells)  # fmt: skip
    placed = {}
    for row in result.sustained:
        low, high = row["last_pass_rate"], row["first_fail_rate"]
        if low is None and high is None:
            raise KvbenchError(f"{folder}: the simulation found no sustained rate for {row['engine']}")
        centre = (low + high) / 2 if low is not None and high is not None else (low or high / PLACED_SPREAD)
        placed[row["engine"]] = (_digits(centre / PLACED_SPREAD), _digits(centre * PLACED_SPREAD))
    return placed


def already_placed(folder: Path, engines) -> dict[str, tuple[float, float]] | None:
    """The rates a real sweep in `folder` was placed at, if it was (its sweep.json's axes), so
    a resumed figure keeps them: a cost file refitted since (a real reproduction refits after
    every invocation) would place new rates and strand the real runs already made."""
    from kvbench.results.files import read_json

    recorded = read_json(folder / "sweep.json").get("axes", {}).get("engine_rates") or []
    placed = {engine: (float(low), float(high)) for engine, (low, high) in recorded}
    return placed if placed and set(placed) == set(engines) else None


def _digits(rate: float) -> float:
    """4 significant digits: readable cell names, a rate moved by at most 0.05 %."""
    return float(f"{rate:.4g}")


@dataclass(frozen=True)
class Rates:
    """What a rate sweep says of each engine.

    `sustained`: the highest rate under the latency bound (Figure 12's criterion; None when
    no rate is under it, the highest rate swept when every one is: then a lower bound), with
    its bracket [last pass, first fail) in `brackets` (first fail inf: no rate failed).
    `capacity`: the most requests/s any cell completed, which an overloaded cell reaches: the
    rate at which the paper's hour-long traces see latency explode; it stands beside the
    paper's sustained-rate ratios, labelled, never in their place. A short trace past capacity
    builds only a short queue, so with short outputs (Alpaca, translation) normalized latency
    may never cross the bound inside the grid while the capacity plateau is plain.
    `unsaturated`: engines that kept up with the highest rate swept (completed at least 90 % of
    it): their capacity is only a lower bound.
    """

    sustained: dict[str, float | None]
    capacity: dict[str, float | None]
    unsaturated: tuple[str, ...] = ()
    brackets: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    bound: float | None = None  # the normalized-latency bound (s/token) shared by every engine

    def note(self, label: str) -> list[str]:
        """A figure note naming the engines whose capacity is only a lower bound, if any."""
        if not self.unsaturated:
            return []
        return [
            f"{label}: {', '.join(self.unsaturated)} kept up with the highest rate: capacity a lower bound"
        ]


BOUND = "latency_bound_s_per_token"  # the row holding a rate sweep's shared bound


def _bracket(row: dict | None) -> tuple[float, float] | None:
    """sustained.csv's [last pass, first fail) of one engine (None: no rate passed)."""
    if row is None or row.get("last_pass_rate") is None:
        return None
    fail = row.get("first_fail_rate")
    return row["last_pass_rate"], math.inf if fail is None else fail


def rate_rows(figure: str, label: str, result: SweepResult, engines: Sequence[str],
              ratios: dict[str, float | None], paper_sustained: dict | None = None,
              numerator: str = "paged") -> tuple[list[Row], Rates]:  # fmt: skip
    """A rate sweep's rows: normalized latency at each rate, the bound every engine is held
    to, each engine's sustained rate (its bracket) and capacity, and `numerator`'s over each
    engine named in `ratios`: the sustained-rate ratio's interval with the paper's ratio beside
    it, and the capacity ratio, labelled apart."""
    cells = [r for r in result.rows if r["role"] != "baseline" and r["status"] == "ok"]
    rows = [
        Row(figure, r["engine"], label, f"normalized_latency_s@{r['rate']:g}", r["normalized_latency_s"])
        for r in cells
    ]
    found = {r["engine"]: r for r in result.sustained}
    bounds = [r["latency_threshold_s"] for r in result.sustained if r.get("latency_threshold_s")]
    bound = bounds[0] if bounds else None
    rows.append(Row(figure, "all", label, BOUND, bound))
    brackets = {e: _bracket(found.get(e)) for e in engines}
    sustained = {e: b[0] if b else None for e, b in brackets.items()}
    completed = {e: [r["request_throughput"] for r in cells if r["engine"] == e] for e in engines}
    capacity = {e: max(values, default=None) for e, values in completed.items()}
    top = {e: max((r["rate"] for r in cells if r["engine"] == e), default=None) for e in engines}
    unsaturated = tuple(e for e in engines if capacity[e] and top[e] and capacity[e] >= 0.9 * top[e])
    for e in engines:
        paper = (paper_sustained or {}).get(e)
        b = brackets[e]
        low, high = b or (None, None)
        rows.append(Row(figure, e, label, "sustained_rate_req_s", sustained[e], paper, low, high))
        rows.append(Row(figure, e, label, "capacity_req_s", capacity[e]))
    for other, paper in ratios.items():
        rows.append(ratio_row(figure, f"{numerator}/{other}", label, "sustained_ratio",
                              brackets.get(numerator), brackets.get(other), paper))  # fmt: skip
        ours = ratio_or_none(capacity.get(numerator), capacity.get(other))
        rows.append(Row(figure, f"{numerator}/{other}", label, "capacity_ratio", ours))
    return rows, Rates(sustained, capacity, unsaturated, brackets, bound)


def ratio_row(figure: str, engine: str, label: str, metric: str, a, b, paper) -> Row:
    """A ratio of two brackets: the ratio of their passes, inside `ratio_interval`."""
    if a is None or b is None or not b[0]:
        return Row(figure, engine, label, metric, None, paper)
    low, high = ratio_interval(a, b)
    return Row(figure, engine, label, metric, a[0] / b[0], paper, low, high)


def bound_text(rows: Sequence[Row], figure: str, label: str) -> str:
    """How a rate figure's sustained rates were read, for its verdicts' metric names."""
    row = find(rows, figure, "all", label, BOUND)
    bound = f"{row.kvbench:.3g} s/token" if row and row.kvbench else "a bound never set"
    return f"sustained rate, normalized latency <= {bound}"


def sustained_ratio_verdict(rows: Sequence[Row], figure: str, label: str, pair: str, paper: float,
                            assumed: str | None = None) -> Verdict:  # fmt: skip
    """`pair`'s sustained-rate ratio interval against the paper's ratio; the capacity ratio
    (most completed req/s) beside it in the evidence, labelled."""
    metric = f"{label} {pair} {bound_text(rows, figure, label)}"
    row = find(rows, figure, pair, label, "sustained_ratio")
    capacity = find(rows, figure, pair, label, "capacity_ratio")
    beside = f"; capacity ratio {capacity.kvbench:.3g}" if capacity and capacity.kvbench else ""
    if row is None or row.interval is None:
        return missing(metric, f"an engine sustained no rate swept{beside}")
    verdict = value_verdict(metric, row.interval, paper, assumed=assumed)
    return replace(verdict, evidence=verdict.evidence + beside)


def threshold_of(options: Options) -> float | None:
    """The sustained criterion: the paper's 0.5 s/token in its setting, else (None) the sweep's
    shared rule, `THRESHOLD_MULTIPLE` x the lowest unloaded latency of the compared engines."""
    return FIG12_THRESHOLD_S if options.setting.paper_threshold else None


def threshold_note(options: Options) -> str:
    """The note every rate figure carries: which bound its sustained rates used, one for every
    engine, and how it maps from the paper's A100 to the machine that ran it."""
    if threshold_of(options):
        how = (
            f"the paper's {FIG12_THRESHOLD_S:g} s/token, unchanged: the simulation models the paper's "
            "A100-40GB, so its bound applies as written"
        )
    else:
        machine = "this GPU" if options.setting.real else "the simulated machine"
        how = (
            f"{THRESHOLD_MULTIPLE:g} x the lowest unloaded normalized latency of the compared engines on "
            f"{machine} (the shared-multiple rule; the paper's {FIG12_THRESHOLD_S:g} s/token is an A100 "
            "number and does not carry to another machine's step times)"
        )
    return (
        f"sustained: the highest rate with normalized latency under one bound shared by every engine "
        f"(row {BOUND}): {how}; brackets [last pass, first fail) after bisection"
    )


def ratio_note(numerator: str = "paged") -> str:
    """How every rate figure's ratios read (Figures 12, 14, 16, 17): sustained rates bisected to
    brackets at most `FIG12_BRACKET` wide, their ratio an interval, capacity beside it, labelled."""
    return (
        f"sustained rates bisected to brackets at most {100 * FIG12_BRACKET:g} % wide; sustained_ratio: "
        f"{numerator}'s sustained rate over the other's, inside [pass / fail, fail / pass] of their "
        "brackets; capacity_ratio: the most completed req/s, beside it, not the paper's measure"
    )


def plot_into(plot, data, out: Path, notes: list[str], prefix: str = "") -> list[str]:
    try:
        return [prefix + p.name for p in plot(data, out)]
    except PlotSkipped as skipped:
        notes.append(f"{out.name}: {skipped}")
        return []


def fig12_sweeps(options: Options, folder: Path) -> Iterator[tuple[str, SweepResult]]:
    """Figure 12's sweep of each trace, in turn. Under `Setting.place_only` each stops once its
    real runs are placed (`sweep`), which is all `kvbench reproduce --place-only` asks of them."""
    s = options.setting
    for trace, grids in FIG12_RATES.items():
        rates = options.pick(grids["quick"], grids["full"], grids["real"])
        yield trace, sweep(options, folder / trace, engines=PAPER_ENGINES, trace=trace, rates=rates,
                           block_sizes=(16,), kv=s.kv_cache_gib, threshold=threshold_of(options),
                           bracket=FIG12_BRACKET, requests=FIG12_COUNTS,
                           duration=FIG12_PLACED_DURATION_S if s.real and s.placement else None)  # fmt: skip


def fig12(options: Options, folder: Path) -> FigureResult:
    s = options.setting
    rows: list[Row] = []
    notes, plots = [], []
    for trace, result in fig12_sweeps(options, folder):
        paper = FIG12_SUSTAINED[trace]
        comparable = s.rate_scale == 1.0 and not s.real  # the paper's absolute rates: its setting only
        ratios = {other: paper["paged"] / paper[other] for other in RATIO_BASELINES}
        absolute = paper if comparable else None
        found, by = rate_rows("fig12", trace, result, PAPER_ENGINES, ratios, absolute)
        rows += found + sensitivity_rows("fig12", trace, result, by.bound, ratios)
        notes += by.note(trace)
        plots += plot_into(
            plot_latency_vs_rate, folder / trace, folder / trace / "latency_vs_rate", notes, f"{trace}/"
        )
    notes.append(threshold_note(options))
    notes.append(
        ratio_note() + "; sustained_ratio@bound x m: the same ratios read at m x the bound "
        f"({', '.join(map(str, SENSITIVITY))}) from the cells already run (a bound away from the bisected "
        "one has grid-wide brackets)"
    )
    return FigureResult("fig12", "Sustained request rate (normalized latency vs rate)", tuple(rows),
                        fig12_verdict(rows, options), tuple(plots), tuple(notes))  # fmt: skip


def fig12_verdict(rows: Sequence[Row], options: Options) -> str:
    """Per trace: paged's sustained-rate ratio over each baseline against the paper's, the
    engines' order, and each engine's rate where the setting is the paper's (rates unscaled)."""
    verdicts = []
    for trace, paper in FIG12_SUSTAINED.items():
        for other in RATIO_BASELINES:
            verdicts.append(
                sustained_ratio_verdict(rows, "fig12", trace, f"paged/{other}", paper["paged"] / paper[other])
            )
        metric = f"{trace} {bound_text(rows, 'fig12', trace)}"
        found = {e: find(rows, "fig12", e, trace, "sustained_rate_req_s") for e in PAPER_ENGINES}
        measured = {e: r.interval for e, r in found.items() if r is not None and r.interval is not None}
        verdicts.append(order_verdict(metric, measured, paper))
        verdicts += [
            value_verdict(f"{metric}, {e}", measured[e], r.paper)
            for e, r in found.items()
            if r is not None and r.paper is not None and e in measured
        ]
    return figure_verdict(verdicts)


def rate_latencies(cells: Sequence[dict], engine: str) -> dict[float, float | None]:
    """`engine`'s normalized latency at each rate of sweep rows already run (`rate`, `status`,
    `normalized_latency_s`), as the sweep's own search reads it (`rate_latency`: the mean of
    the rate's repeats, None, over any bound, where any of them failed or has no latency)."""
    by_rate: dict[float, list] = {}
    for r in cells:
        if r["engine"] == engine:
            ok = r["status"] == "ok" and r["normalized_latency_s"] is not None
            by_rate.setdefault(r["rate"], []).append(r["normalized_latency_s"] if ok else None)
    return {rate: rate_latency(values) for rate, values in by_rate.items()}


def bracket_at(cells: Sequence[dict], engine: str, bound: float) -> tuple[float, float] | None:
    """`engine`'s sustained rate under `bound` read from sweep rows already run (the baselines
    left out by the caller): (last pass, first fail; inf where every rate passed), None where
    none passed, each rate's latency as `rate_latencies` reads it."""
    read = sustained_rate(list(rate_latencies(cells, engine).items()), bound)
    return None if read.last_pass is None else (read.last_pass, read.first_fail or math.inf)


def sensitivity_rows(figure: str, label: str, result: SweepResult, bound: float | None,
                     ratios: dict[str, float]) -> list[Row]:  # fmt: skip
    """paged's sustained-rate ratios read again at `SENSITIVITY` multiples of the bound, from
    the cells already run: how much the verdict rests on where the bound was drawn."""
    if not bound:
        return []
    cells = [r for r in result.rows if r["role"] != "baseline"]
    rows = []
    for multiple in SENSITIVITY:
        brackets = {engine: bracket_at(cells, engine, multiple * bound) for engine in {"paged", *ratios}}
        for other, paper in ratios.items():
            metric = f"sustained_ratio@bound x {multiple:g} ({multiple * bound:.3g} s/token)"
            rows.append(ratio_row(figure, f"paged/{other}", label, metric, brackets["paged"],
                                  brackets[other], paper))  # fmt: skip
    return rows


def ratio_or_none(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


FIG18B_METRIC = "best block size (lowest normalized latency, mean over requests)"


def fig18b_block_sizes(options: Options) -> tuple[int, ...]:
    """The block sizes Figure 18b runs at: the paper's powers of two, fewer in a quick run, fewest
    in a quick real one (each size a real run), always its ends and its default 16."""
    return options.pick((1, 4, 16, 32, 64, 128, 256), POWERS, real=(1, 4, 16, 64, 256))


def fig18b(options: Options, folder: Path) -> FigureResult:
    s = options.setting
    rows: list[Row] = []
    notes, plots = [], []
    sizes = fig18b_block_sizes(options)
    for trace, rate in FIG18B_RATE.items():
        result = sweep(options, folder / trace, engines=("paged",), trace=trace, rates=(rate,),
                       block_sizes=sizes, kv=s.kv_cache_gib)  # fmt: skip
        latency = {r["block_size"]: r["normalized_latency_s"] for r in result.rows if r["status"] == "ok"}
        rows += [
            Row("fig18b", "paged", trace, f"normalized_latency_s@bs{bs}", v) for bs, v in latency.items()
        ]
        rows.append(Row("fig18b", "paged", trace, "best_block_size", float(min(latency, key=latency.get))))
        notes.append(f"{trace} at {rate * s.rate_scale:g} req/s")
        plots += plot_into(plot_block_size, folder / trace, folder / trace / "block_size", notes, f"{trace}/")
    return FigureResult("fig18b", "End-to-end normalized latency vs block size (paged)", tuple(rows),
                        fig18b_verdict(rows, options), tuple(plots), tuple(notes))  # fmt: skip


def fig18b_verdict(rows: Sequence[Row], options: Options) -> str:
    """Per trace: the block sizes whose latency cannot be told from the best's (their intervals
    overlap; one seed: exact ties only) against the paper's best range; every size within 5 %
    of the best listed by name in the evidence. Sizes outside the range tied with the best
    differ (not inconclusive, as a confidence interval across a range's end would be): the
    paper's curve rises outside its range, and a tie where it shows a gap is not its shape."""
    verdicts = []
    for trace, paper in FIG18B_BEST.items():
        metric = f"{trace} {FIG18B_METRIC}"
        latency = {
            int(r.metric.split("@bs")[1]): r.interval for r in rows
            if r.figure == "fig18b" and r.workload == trace and r.metric.startswith("normalized_latency_s@bs")
            and r.interval is not None
        }  # fmt: skip
        if not latency:
            verdicts.append(missing(metric, "no block size finished"))
            continue
        best = min(latency, key=lambda bs: latency[bs].value)
        tied = sorted(bs for bs, i in latency.items() if i.overlaps(latency[best]))
        near = sorted(bs for bs, i in latency.items() if i.value <= 1.05 * latency[best].value)
        tie = Interval(best, tied[0], tied[-1])
        verdict = range_verdict(metric, tie, paper)
        if verdict.outcome == INCONCLUSIVE:  # sizes the paper finds slower tie with the best: a gap lost
            outside = ", ".join(str(bs) for bs in tied if not paper[0] <= bs <= paper[1])
            gap = f"a tie where the paper shows a gap: {outside} tie with the best"
            verdict = Verdict(DIFFERS, metric, f"kvbench {tie}, paper {paper[0]:g}-{paper[1]:g}; {gap}")
        within = ", ".join(f"{bs} ({latency[bs].value / latency[best].value - 1:+.1%})" for bs in near)
        verdicts.append(replace(verdict, evidence=f"{verdict.evidence}; within 5 % of the best: {within}"))
    return figure_verdict(verdicts)


def preemption_overhead_ms(cell: Path, preemption: str) -> float | None:
    """Time per preemption: swap in + out of its blocks, or recomputing its tokens.

    Swap: blocks copied (steps.csv `swapped_blocks`) x `per_swap_block_s`. Recompute: prefill
    tokens beyond the requests' prompts (the tokens fed again) x the prefill token cost. The constants
    are the cost model's for a simulated cell; for a real cell they are fitted to the cell's
    own measured step times (`kvbench calibrate` on that one run), so the overhead is the
    measured cost of the copies or of the tokens fed again. None when the cell never preempted,
    or when the fit left its constant at zero (the cell's step times do not resolve it).
    """
    run = load_run(cell)
    count = run.summary.get("num_preemptions") or 0
    if not count:
        return None
    if run.summary.get("mode") == "real":
        cost = calibrate([cell]).cost
    else:
        cost = CostModel(**run.config["cost_model_constants"])
    steps = run.steps
    if preemption == "swap":
        units, constant = float(steps["swapped_blocks"].sum()), cost.per_swap_block_s
    else:
        prefill = float(steps.loc[steps["kind"] == "prefill", "num_tokens"].sum())
        units = max(prefill - prompt_tokens(run), 0.0)
        constant = cost.per_token(prefill=True)  # recomputed tokens are prefilled
    if constant <= 0:
        return None
    return 1e3 * units * constant / count


def prompt_tokens(run: Run | Path) -> float:
    """The prompt tokens of a run's requests: requests.csv's, or, where that file was left out
    (committed results keep summaries and steps), the run's trace rebuilt from its config."""
    run = run if isinstance(run, Run) else load_run(run)
    if "prompt_len" in run.requests:
        return float(run.requests["prompt_len"].sum())
    from kvbench.calibrate.check import read_config

    return float(sum(r.prompt_len for r in build_trace(read_config(run.path).workload).requests))


FIG19_METRIC = "ms per preemption ({}; blocks swapped or tokens recomputed x the cost per unit)"
RECOMPUTE_TERMS = ("per_prefill_token_s", "per_token_s")  # what a recomputed token costs
# what a run's latency rests on beyond them: the steps a recompute's prefill and the decodes take
STEP_TERMS = ("fixed_s", "per_prefill_s", "per_kv_token_s")


def fig19_block_sizes(options: Options) -> tuple[int, ...]:
    """The block sizes Figure 19 runs at (and its verdicts expect)."""
    return options.pick((1, 4, 16, 64, 256), POWERS, real=(1, 16, 256))


def fig19(options: Options, folder: Path) -> FigureResult:
    s = options.setting
    trace, kv = "sharegpt-paper", s.kv_cache_gib * FIG19_BUDGET_SHARE
    sizes = fig19_block_sizes(options)
    rows: list[Row] = []
    overheads: dict[str, dict[int, float | None]] = {}
    notes, plots = [], []
    for how in ("recompute", "swap"):
        result = sweep(options, folder / how, engines=("paged",), trace=trace, rates=(FIG19_RATE,),
                       block_sizes=sizes, kv=kv, preemption=how)  # fmt: skip
        overheads[how] = {}
        for r in result.rows:
            if r["status"] != "ok":
                continue
            bs = r["block_size"]
            ms = preemption_overhead_ms(folder / how / "cells" / r["cell_id"], how)
            overheads[how][bs] = ms
            paper = FIG19_SWAP_MS.get(bs) if how == "swap" else FIG19_RECOMPUTE_MS
            rows += [
                Row("fig19", f"paged-{how}", trace, f"overhead_ms_per_preemption@bs{bs}", ms, paper),
                Row("fig19", f"paged-{how}", trace, f"preemptions@bs{bs}", float(r["num_preemptions"] or 0)),
                Row(
                    "fig19", f"paged-{how}", trace, f"normalized_latency_s@bs{bs}", r["normalized_latency_s"]
                ),
            ]
        plots += plot_into(plot_block_size, folder / how, folder / how / "block_size", notes, f"{how}/")
    plots += plot_into(_plot_overheads, overheads, folder / "overhead", notes)
    notes.append(
        f"{kv:g} GiB of KV ({FIG19_BUDGET_SHARE:g} of the setting's) at {FIG19_RATE * s.rate_scale:g} "
        "req/s so that paged preempts; overheads: the blocks swapped / tokens recomputed times the cost "
        "model's constants (simulated) or constants fitted to the cell's own step times (real)"
    )
    return FigureResult("fig19", "Preemption: recompute vs swap, overhead per preemption vs block size",
                        tuple(rows), fig19_verdict(rows, options), tuple(plots), tuple(notes))  # fmt: skip


def fig19_verdict(rows: Sequence[Row], options: Options) -> str:
    """Figure 19 judged twice: the overheads per preemption (`_fig19_overheads`) and the two
    modes end to end (`_fig19_end_to_end`). A term the setting's cost rests on without data behind
    it (the roofline's swap link, a cost file's "assumed") makes its verdicts "not measured"."""
    assumed = assumed_terms(options.setting.cost_model, options.setting.real)
    either = next((t for t in ("per_swap_block_s", *RECOMPUTE_TERMS, *STEP_TERMS) if t in assumed), None)
    overheads = _fig19_overheads(rows, assumed, options.setting.real)
    sizes = fig19_block_sizes(options)
    return figure_verdict(overheads + _fig19_end_to_end(rows, sizes, either and f"cost term {either}"))


def _fig19_overheads(rows: Sequence[Row], assumed: frozenset[str], real: bool) -> list[Verdict]:
    """Each mode's overhead per preemption at the block sizes the paper gives.

    Simulated (the paper's A100 modelled), against the paper's milliseconds: swap's 137 -> 33,
    recompute's flat ~37.5. Real, on whatever GPU ran it, the milliseconds follow that GPU's link
    and FLOPs, so a verdict on them could not come out "matches" on another GPU: what carries over
    is the shape, each mode's overhead over its own at block size 16 (swap 137 / 40 at block size
    1, 33 / 40 at 256; recompute 1) and recompute's over swap's at 16 (37.5 / 40), seed by seed
    where there are seeds."""
    found: dict[tuple[str, int], Interval] = {}
    verdicts = []
    for how, terms in (("swap", ("per_swap_block_s",)), ("recompute", RECOMPUTE_TERMS)):
        rested = next((t for t in terms if t in assumed), None)
        cost = f"cost term {rested}" if rested else None
        for bs in sorted(FIG19_SWAP_MS):
            row = find(rows, "fig19", f"paged-{how}", "sharegpt-paper", f"overhead_ms_per_preemption@bs{bs}")
            label = f"{FIG19_METRIC.format(how)} at block size {bs}"
            paper = FIG19_SWAP_MS[bs] if how == "swap" else FIG19_RECOMPUTE_MS
            if row is None or row.interval is None:
                verdicts.append(missing(label, "no preemption measured at this block size"))
            elif real:
                found[how, bs] = row.interval
            else:
                verdicts.append(value_verdict(label, row.interval, paper, assumed=cost))
    if not real:
        return verdicts
    paper_ms = {("swap", bs): ms for bs, ms in FIG19_SWAP_MS.items()}
    paper_ms |= {("recompute", bs): FIG19_RECOMPUTE_MS for bs in FIG19_SWAP_MS}
    mid = 16  # the paper's default block size
    pairs = [
        ((how, bs), (how, mid)) for how in ("swap", "recompute") for bs in sorted(FIG19_SWAP_MS) if bs != mid
    ]
    pairs.append((("recompute", mid), ("swap", mid)))
    for top, bottom in pairs:
        if top in found and bottom in found:
            label = (
                f"ms per preemption, {top[0]} at block size {top[1]} over {bottom[0]} at {bottom[1]} "
                "(blocks swapped or tokens recomputed x a cost per unit fitted to the cell's steps)"
            )
            verdicts.append(_over(label, found[top], found[bottom], paper_ms[top] / paper_ms[bottom]))
    return verdicts


def _over(
    label: str, numerator: Interval, denominator: Interval, paper: float, assumed: str | None = None
) -> Verdict:
    """`numerator` over `denominator` (`_ratio`) against the paper's ratio."""
    ratio = _ratio(label, numerator, denominator)
    if isinstance(ratio, Verdict):
        return ratio
    label, interval = ratio
    return value_verdict(label, interval, paper, assumed=assumed)


def _ratio(label: str, numerator: Interval, denominator: Interval) -> tuple[str, Interval] | Verdict:
    """(`label` saying how, the interval of `numerator` over `denominator`): seed by seed where
    both hold the same seeds (each seed's two runs share its requests: `Interval.paired_ratio`);
    one run each: the ratio of the two. Sides merged over seeds that share fewer than two are "not
    measured": a ratio of means over different seeds would mix their requests."""
    paired = denominator.paired_ratio(numerator)
    if paired is not None:
        return f"{label}, seed by seed", paired
    if numerator.seeds or denominator.seeds:
        return unmeasured(label, "fewer than two seeds measured on both sides")
    return f"{label}, one run", Interval.ratio(numerator, denominator)


FIG19_E2E_METRIC = "normalized latency (s/token, mean over requests), swap / recompute"


def _fig19_end_to_end(rows: Sequence[Row], sizes: Sequence[int], assumed: str | None) -> list[Verdict]:
    """The two preemption modes on the same requests, by their normalized latency: what a
    preemption's cost does to the run, without a fitted constant between.

    Swap over recompute, seed by seed where there are seeds (both modes ran each seed's requests:
    `_over`). Where the paper finds the modes comparable (block sizes 16-64 of the figure's grid
    `sizes`: a quick grid runs 16 alone), it is judged against 1. At block size 1, where the
    paper's swaps cost 3.7 times a recompute (137 against ~37.5 ms a preemption), by the paper's
    order alone: swap slower, its ratio's interval wholly above 1.
    """

    def latency(how: str, bs: int) -> Interval | None:
        row = find(rows, "fig19", f"paged-{how}", "sharegpt-paper", f"normalized_latency_s@bs{bs}")
        return None if row is None else row.interval

    comparable = [bs for bs in FIG19_COMPARABLE_BLOCK_SIZES if bs in sizes]  # every grid runs 16
    verdicts = []
    for bs in (min(FIG19_SWAP_MS), *comparable):
        label = f"{FIG19_E2E_METRIC} at block size {bs}"
        swap, recompute = latency("swap", bs), latency("recompute", bs)
        if swap is None or recompute is None:
            verdicts.append(missing(label, "a mode without a finished run at this block size"))
        elif bs in comparable:
            verdicts.append(_over(label, swap, recompute, 1.0, assumed))
        else:
            verdicts.append(_slower(label, swap, recompute, assumed))
    return verdicts


def _slower(label: str, swap: Interval, recompute: Interval, assumed: str | None) -> Verdict:
    """The paper's order at block size 1: swap slower than recompute, the interval of their ratio
    (`_ratio`) wholly above 1."""
    ratio = _ratio(label, swap, recompute)
    if isinstance(ratio, Verdict):
        return replace(ratio, order_only=True)
    label, interval = ratio
    evidence = (f"kvbench {interval}, paper's order: swap slower (its ms a preemption, "
                f"{FIG19_SWAP_MS[min(FIG19_SWAP_MS)]:g} against {FIG19_RECOMPUTE_MS:g})")  # fmt: skip
    verdict = Verdict(MATCHES if interval.low > 1 else DIFFERS, label, evidence, order_only=True)
    return _rested(verdict, assumed)


def _rested(verdict: Verdict, assumed: str | None) -> Verdict:
    """An order verdict on runs whose cost rests on an assumed term: "not measured"."""
    if assumed is None:
        return verdict
    evidence = f"{verdict.evidence}; rests on an assumed {assumed}"
    return replace(verdict, outcome=NOT_MEASURED, evidence=evidence)


def _plot_overheads(overheads: dict[str, dict[int, float | None]], out: Path) -> list[Path]:
    series = {how: {bs: v for bs, v in by.items() if v is not None} for how, by in overheads.items()}
    if not any(len(v) >= 2 for v in series.values()):
        raise PlotSkipped("fewer than two block sizes preempted")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    for how, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=f"{how} (kvbench)")
    ax.plot(sorted(FIG19_SWAP_MS), [FIG19_SWAP_MS[k] for k in sorted(FIG19_SWAP_MS)], "k--", marker="x",
            label="swap (paper)")  # fmt: skip
    ax.axhline(FIG19_RECOMPUTE_MS, color="grey", linestyle=":", label="recompute (paper)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="block size", ylabel="ms per preemption", title="Preemption overhead (Figure 19)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save(fig, out)
