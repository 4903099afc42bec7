"""Figures 12, 18b and 19 of `kvbench reproduce`: sweeps through `kvbench.sweep.run`'s Python API.

Each figure is one or more sweep folders (sweep.json, sweep.csv, sustained.csv, cells/) under
the figure's folder, so `kvbench report` and `kvbench sweep --resume` work on them as on any
sweep. Real runs (`Setting.real`) run in this process, one after the other (each cell builds its
runner and frees it; a process per cell would pay CUDA's start-up each time); a quick real run
uses the `real` grids below, a few points each, and the calibrated simulation fills in between.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.calibrate.fit import calibrate
from kvbench.config import RunConfig
from kvbench.cost_model import CostModel
from kvbench.paper import (
    FIG12_SUSTAINED,
    FIG12_THRESHOLD_S,
    FIG18B_BEST,
    FIG19_RECOMPUTE_MS,
    FIG19_SWAP_MS,
    RATIO_BASELINES,
)
from kvbench.report.figures import PlotSkipped, plot_block_size, plot_latency_vs_rate
from kvbench.report.style import pyplot, save
from kvbench.reproduce.rows import FigureResult, Options, Row
from kvbench.results.load import Run, load_run
from kvbench.sweep.cell import CellRun
from kvbench.sweep.grid import PAPER_ENGINES, Axes, Baseline
from kvbench.sweep.plan import SustainedOptions, SweepPlan
from kvbench.sweep.run import OtherSettings, SweepResult, run_sweep
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
# The real grids (here, in reproduce_engines and reproduce_sharing) are as small as the figures
# stay true at: a run with about half their requests and rates (11 minutes on an H200, not 22)
# lost paged's >90 % token-state share and shrank most capacity ratios, Figure 16's by a third
# or more (results/reference/quick-real-short/README.md).
REAL_BASELINE = Baseline(num_requests=5)  # each request alone: seconds each on a GPU
FIG18B_RATE = {"sharegpt-paper": 1.5, "alpaca-paper": 20.0}  # near vLLM's sustained rate
FIG19_RATE = 2.0  # ShareGPT, on a quarter of the budget: paged preempts
FIG19_BUDGET_SHARE = 0.25


def sweep(options: Options, folder: Path, *, engines, trace, rates, block_sizes, kv, preemption="recompute",
          threshold: float | None = FIG12_THRESHOLD_S, bisect: int = 0,
          requests: tuple[int, int, int] = (200, 2000, 100), model: str | None = None,
          workload: dict | None = None) -> SweepResult:  # fmt: skip
    """One sweep folder of a figure: `engines` x `rates` (the paper's, times the setting's scale)
    x `block_sizes` on `trace`; `workload` sets WorkloadSpec fields every cell keeps (n, beams,
    a shared prefix, chat turns), `model` replaces the setting's."""
    s = options.setting
    count = options.requests(*requests)
    spec = WorkloadSpec(trace, num_requests=count, seed=options.seed, **(workload or {}))
    base = RunConfig(
        engines[0], model=model or s.model, workload=spec, kv_cache_gib=kv, preemption=preemption,
        cost_model=None if s.real else s.cost_model, device=s.device if s.real else "cpu",
    )  # fmt: skip
    axes = Axes(tuple(engines), (trace,), tuple(r * s.rate_scale for r in rates), tuple(block_sizes), (kv,),
                (options.seed,))  # fmt: skip
    sustained = SustainedOptions(threshold, 4.0, bisect, REAL_BASELINE if s.real else Baseline())
    plan = SweepPlan(axes, base, CellRun(real=s.real), sustained)
    if (folder / "sweep.json").is_file():
        try:  # an interrupted figure resumes: finished cells of these settings are kept
            return run_sweep(plan, folder, resume=True)
        except OtherSettings:  # another setting's sweep: replaced
            pass
    return run_sweep(plan, folder, overwrite=True)


@dataclass(frozen=True)
class Rates:
    """What a rate sweep says of each engine.

    `sustained`: the highest rate under the latency threshold (Figure 12's criterion; None when
    no rate is under it, the highest rate swept when every one is: then a lower bound).
    `capacity`: the most requests/s any cell completed, which an overloaded cell reaches: the
    rate at which the paper's hour-long traces see latency explode, so capacity ratios stand
    beside the paper's sustained-rate ratios. A short trace past capacity builds only a short
    queue, so with short outputs (Alpaca, translation) normalized latency may never cross the
    threshold inside the grid while the capacity plateau is plain; the sharing figures compare
    capacities. `unsaturated`: engines that kept up with the highest rate swept (completed at
    least 90 % of it): their capacity is only a lower bound.
    """

    sustained: dict[str, float | None]
    capacity: dict[str, float | None]
    unsaturated: tuple[str, ...] = ()

    def note(self, label: str) -> list[str]:
        """A figure note naming the engines whose capacity is only a lower bound, if any."""
        if not self.unsaturated:
            return []
        return [
            f"{label}: {', '.join(self.unsaturated)} kept up with the highest rate: capacity a lower bound"
        ]


def rate_rows(figure: str, label: str, result: SweepResult, engines: Sequence[str],
              ratios: dict[str, float | None], paper_sustained: dict | None = None,
              numerator: str = "paged") -> tuple[list[Row], Rates]:  # fmt: skip
    """A rate sweep's rows: normalized latency at each rate, each engine's sustained rate and
    capacity, and `numerator`'s over each engine named in `ratios` (the paper's ratio beside)."""
    cells = [r for r in result.rows if r["role"] != "baseline" and r["status"] == "ok"]
    rows = [
        Row(figure, r["engine"], label, f"normalized_latency_s@{r['rate']:g}", r["normalized_latency_s"])
        for r in cells
    ]
    sustained = {r["engine"]: r["sustained_rate"] for r in result.sustained}
    completed = {e: [r["request_throughput"] for r in cells if r["engine"] == e] for e in engines}
    capacity = {e: max(values, default=None) for e, values in completed.items()}
    top = {e: max((r["rate"] for r in cells if r["engine"] == e), default=None) for e in engines}
    unsaturated = tuple(e for e in engines if capacity[e] and top[e] and capacity[e] >= 0.9 * top[e])
    for e in engines:
        paper = (paper_sustained or {}).get(e)
        rows.append(Row(figure, e, label, "sustained_rate_req_s", sustained.get(e), paper))
        rows.append(Row(figure, e, label, "capacity_req_s", capacity[e]))
    for other, paper in ratios.items():
        for metric, by in (("sustained_ratio", sustained), ("capacity_ratio", capacity)):
            ours = ratio_or_none(by.get(numerator), by.get(other))
            rows.append(Row(figure, f"{numerator}/{other}", label, metric, ours, paper))
    return rows, Rates(sustained, capacity, unsaturated)


def threshold_of(options: Options) -> float | None:
    """The sustained criterion: the paper's 0.5 s/token in its setting, else 4x unloaded latency."""
    return FIG12_THRESHOLD_S if options.setting.paper_threshold else None


def threshold_note(options: Options) -> str:
    """The note every rate figure carries: which criterion its sustained rates used."""
    limit = f"{FIG12_THRESHOLD_S} s/token" if threshold_of(options) else "4x the unloaded normalized latency"
    return f"sustained: the highest rate (after bisection) with normalized latency under {limit}"


def plot_into(plot, data, out: Path, notes: list[str], prefix: str = "") -> list[str]:
    try:
        return [prefix + p.name for p in plot(data, out)]
    except PlotSkipped as skipped:
        notes.append(f"{out.name}: {skipped}")
        return []


def fig12(options: Options, folder: Path) -> FigureResult:
    s = options.setting
    rows: list[Row] = []
    verdicts, notes, plots = [], [], []
    for trace, grids in FIG12_RATES.items():
        rates = options.pick(grids["quick"], grids["full"], grids["real"])
        result = sweep(options, folder / trace, engines=PAPER_ENGINES, trace=trace, rates=rates,
                       block_sizes=(16,), kv=s.kv_cache_gib, threshold=threshold_of(options),
                       bisect=options.pick(3, 5, real=0),
                       requests=tuple(FIG12_REQUESTS[k] for k in ("quick", "full", "real")))  # fmt: skip
        paper = FIG12_SUSTAINED[trace]
        comparable = s.rate_scale == 1.0 and not s.real  # the paper's absolute rates: its setting only
        ratios = {other: paper["paged"] / paper[other] for other in RATIO_BASELINES}
        absolute = paper if comparable else None
        found, rates = rate_rows("fig12", trace, result, PAPER_ENGINES, ratios, absolute)
        rows += found
        notes += rates.note(trace)
        verdicts.append(f"{trace}: {_order_verdict(rates.sustained, paper)}")
        plots += plot_into(
            plot_latency_vs_rate, folder / trace, folder / trace / "latency_vs_rate", notes, f"{trace}/"
        )
    notes.append(threshold_note(options))
    ok = all("matches" in v for v in verdicts)
    verdict = ("order of engines matches the paper: " if ok else "differs: ") + "; ".join(verdicts)
    return FigureResult("fig12", "Sustained request rate (normalized latency vs rate)", tuple(rows), verdict,
                        tuple(plots), tuple(notes))  # fmt: skip


def ratio_or_none(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _order_verdict(sustained: dict, paper: dict) -> str:
    found = {e: v for e, v in sustained.items() if v is not None}
    missing = [e for e in PAPER_ENGINES if e not in found]
    ours = sorted(found, key=lambda e: (found[e], PAPER_ENGINES.index(e)))
    expected = [e for e in sorted(paper, key=paper.get) if e in found]
    ratios = ", ".join(
        f"paged/{o} {found['paged'] / found[o]:.2f}x (paper {paper['paged'] / paper[o]:.2f}x)"
        for o in RATIO_BASELINES
        if "paged" in found and found.get(o)
    )
    tied = all(found[a] <= found[b] for a, b in itertools.pairwise(expected))
    head = "order matches" if ours == expected or tied else f"order differs ({' < '.join(ours)})"
    tail = (
        f"; no sustained rate for {', '.join(missing)} (over the threshold at every rate)" if missing else ""
    )
    return f"{head}, {ratios}{tail}"


def fig18b(options: Options, folder: Path) -> FigureResult:
    s = options.setting
    rows: list[Row] = []
    verdicts, notes, plots = [], [], []
    sizes = options.pick((1, 4, 16, 32, 64, 128, 256), POWERS, real=(1, 4, 16, 64, 256))
    for trace, rate in FIG18B_RATE.items():
        result = sweep(options, folder / trace, engines=("paged",), trace=trace, rates=(rate,),
                       block_sizes=sizes, kv=s.kv_cache_gib)  # fmt: skip
        latency = {r["block_size"]: r["normalized_latency_s"] for r in result.rows if r["status"] == "ok"}
        rows += [
            Row("fig18b", "paged", trace, f"normalized_latency_s@bs{bs}", v) for bs, v in latency.items()
        ]
        low, high = FIG18B_BEST[trace]
        best = min(latency, key=latency.get)
        near = sorted(bs for bs, v in latency.items() if v <= 1.05 * latency[best])  # within 5 % of the best
        rows.append(Row("fig18b", "paged", trace, "best_block_size", float(best)))
        inside = low <= best <= high
        verdicts.append(
            f"{trace} @ {rate * s.rate_scale:g} req/s: best {best} (within 5 %: {near[0]}-{near[-1]}), "
            f"paper {low}-{high}: {'matches' if inside else 'differs'}"
        )
        plots += plot_into(plot_block_size, folder / trace, folder / trace / "block_size", notes, f"{trace}/")
    ok = all(v.endswith("matches") for v in verdicts)
    verdict = ("best block size in the paper's range: " if ok else "differs: ") + "; ".join(verdicts)
    return FigureResult("fig18b", "End-to-end normalized latency vs block size (paged)", tuple(rows), verdict,
                        tuple(plots), tuple(notes))  # fmt: skip


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


def fig19(options: Options, folder: Path) -> FigureResult:
    s = options.setting
    trace, kv = "sharegpt-paper", s.kv_cache_gib * FIG19_BUDGET_SHARE
    sizes = options.pick((1, 4, 16, 64, 256), POWERS, real=(1, 16, 256))
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
                        tuple(rows), fig19_verdict(overheads), tuple(plots), tuple(notes))  # fmt: skip


def fig19_verdict(overheads: dict[str, dict[int, float | None]]) -> str:
    swap = {bs: v for bs, v in overheads.get("swap", {}).items() if v is not None}
    recompute = [v for v in overheads.get("recompute", {}).values() if v is not None]
    if len(swap) < 2 or not recompute:
        return "differs: too few block sizes with a measured overhead (raise the load or lower the budget)"
    small, large = swap[min(swap)], swap[max(swap)]
    spread = max(recompute) / min(recompute)
    text = (
        f"swap {_ms(small)} ms at block size {min(swap)} -> {_ms(large)} ms at {max(swap)} "
        "(paper 137 -> 33); "
        f"recompute {_ms(min(recompute))}-{_ms(max(recompute))} ms (paper ~36-39, flat)"
    )
    if small > large and spread < 1.5:
        return "shape matches the paper: " + text
    return "differs: " + text


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


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
