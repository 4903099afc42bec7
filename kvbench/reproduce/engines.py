"""Figures 2 and 13 of `kvbench reproduce`: every engine on one trace, saturated, as the demo.

Each engine runs through `kvbench.demo.run_engine` (the demo's own run and row), at the
paper's Figure 13 rate times the setting's rate scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.demo import DEMO_ENGINES, DemoRow, format_table, run_engine
from kvbench.paper import FIG2_OCCUPANCY, FIG13_BATCHED, FIG13_RATE
from kvbench.report.figures import PlotSkipped, plot_batched_bars, plot_occupancy_bars
from kvbench.reproduce.rows import SEED_PREFIX, FigureResult, Options, Row, find
from kvbench.reproduce.verdicts import (
    Interval,
    Verdict,
    figure_verdict,
    missing,
    order_verdict,
    ratio_verdict,
    unmeasured,
    value_verdict,
)
from kvbench.results.files import write_text
from workloads.spec import WorkloadSpec

CATEGORIES = ("token_states", "reservation", "internal_frag", "other")
CONTIGUOUS = ("orca-max", "orca-pow2", "orca-oracle")


def run_engines(options: Options, trace: str, folder: Path, shared: Path | None = None) -> list[DemoRow]:
    """Every engine on `trace`; runs already finished in `folder` or `shared` with the same
    settings are read instead (Figure 13's ShareGPT runs are Figure 2's)."""
    s = options.setting
    workload = WorkloadSpec(
        trace,
        num_requests=options.requests(300, 2000, real=200),
        seed=options.seed,
        rate=FIG13_RATE[trace] * s.rate_scale,
    )
    rows = []
    for engine in DEMO_ENGINES:
        config = RunConfig(
            engine=engine, model=s.model, workload=workload, kv_cache_gib=s.kv_cache_gib, **s.run_fields()
        )  # fmt: skip
        reuse = [folder / engine] + ([shared / engine] if shared else [])
        rows.append(run_engine(config, folder / engine, s.real, reuse))
    write_text(folder / "demo.md", format_table(rows, trace) + "\n")
    return rows


def _plot(plot, runs: list[Path], out: Path, notes: list[str]) -> tuple[str, ...]:
    try:
        return tuple(p.name for p in plot(runs, out))
    except PlotSkipped as skipped:
        notes.append(f"{out.name}: {skipped}")
        return ()


FIG2_METRIC = "token states (% of the KV cache), time-weighted while requests wait"
FIG13_METRIC = "mean batched requests, busy-weighted"
# why a finished run has no Figure 2 share (`kvbench.demo`: NaN, never the busy-weighted one)
NO_WAIT = "no request waited for memory in the run, and the share is weighted by the time requests wait"


def fig2(options: Options, folder: Path) -> FigureResult:
    trace = "sharegpt-paper"
    demo = run_engines(options, trace, folder)
    rows = tuple(
        Row("fig2", r.engine, trace, f"{cat}_%", r.occupancy[cat], FIG2_OCCUPANCY.get(r.engine, {}).get(cat))
        for r in demo
        for cat in CATEGORIES
    )
    notes: list[str] = []
    plots = _plot(plot_occupancy_bars, [folder / e for e in DEMO_ENGINES], folder / "occupancy", notes)
    return FigureResult("fig2", "KV memory breakdown (%), time-weighted while requests wait", rows,
                        fig2_verdict(rows, options), plots, tuple(notes))  # fmt: skip


def fig2_verdict(rows: Sequence[Row], options: Options) -> str:
    """Each engine's token-state share against the paper's, and the engines' order."""
    measured = _intervals(rows, "fig2", "sharegpt-paper", "token_states_%", FIG2_OCCUPANCY)
    blank = _blank(rows, "fig2", "sharegpt-paper", "token_states_%", FIG2_OCCUPANCY)
    paper = {e: FIG2_OCCUPANCY[e]["token_states"] for e in FIG2_OCCUPANCY}
    return figure_verdict(
        [
            _order(FIG2_METRIC, measured, paper, blank),
            *_values(FIG2_METRIC, measured, paper, blank=blank, why=NO_WAIT),
        ]
    )


def _intervals(rows, figure: str, trace: str, metric: str, engines) -> dict[str, Interval]:
    found = {e: find(rows, figure, e, trace, metric) for e in engines}
    return {e: row.interval for e, row in found.items() if row is not None and row.interval is not None}


def _blank(rows, figure: str, trace: str, metric: str, engines) -> frozenset[str]:
    """The engines whose run finished without a value (a row whose number is NaN): not measured,
    where an engine without a row (its run did not finish) is a missing measurement."""
    found = {e: find(rows, figure, e, trace, metric) for e in engines}
    return frozenset(e for e, row in found.items() if row is not None and row.interval is None)


def _order(
    metric: str, measured: dict[str, Interval], paper: dict[str, float], blank: frozenset[str]
) -> Verdict:
    """The engines' order, over those whose runs gave a value: a run without one cannot be
    ranked (its own verdict says not measured), and fewer than two such engines rank nothing."""
    ranked = {e: value for e, value in paper.items() if e not in blank}
    if len(ranked) < 2:
        return unmeasured(
            metric, f"fewer than two engines have a value to rank; none from {', '.join(sorted(blank))}"
        )
    return order_verdict(metric, measured, ranked)


def _values(
    metric: str,
    measured: dict[str, Interval],
    paper: dict[str, float],
    label: str = "",
    blank: frozenset[str] = frozenset(),
    why: str = "the run finished without a value",
) -> list:
    return [
        value_verdict(f"{label}{e} {metric}", measured[e], paper[e]) if e in measured
        else unmeasured(f"{label}{e} {metric}", why) if e in blank
        else missing(f"{label}{e} {metric}", "the run did not finish")
        for e in paper
    ]  # fmt: skip


def fig13(options: Options, folder: Path) -> FigureResult:
    rows, notes, plots = [], [], []
    for trace in FIG13_BATCHED:
        demo = run_engines(options, trace, folder / trace, shared=shared_fig2(folder))
        paper = FIG13_BATCHED[trace]
        rows += [
            Row("fig13", r.engine, trace, "mean_batched_requests", r.batched, paper.get(r.engine))
            for r in demo
        ]
        runs = [folder / trace / e for e in DEMO_ENGINES]
        plots += [
            f"{trace}/{name}" for name in _plot(plot_batched_bars, runs, folder / trace / "batched", notes)
        ]
    return FigureResult("fig13", "Mean batched requests (time-weighted over busy time)", tuple(rows),
                        fig13_verdict(rows, options), tuple(plots), tuple(notes))  # fmt: skip


def shared_fig2(folder: Path) -> Path:
    """Figure 2's folder of the same seed: its ShareGPT runs are Figure 13's."""
    if folder.name.startswith(SEED_PREFIX):
        return folder.parent.parent / "fig2" / folder.name
    return folder.parent / "fig2"


def fig13_verdict(rows: Sequence[Row], options: Options) -> str:
    """Per trace: paged over orca-oracle against the paper's ratio, the order, and each level."""
    verdicts = []
    for trace, paper in FIG13_BATCHED.items():
        measured = _intervals(rows, "fig13", trace, "mean_batched_requests", paper)
        blank = _blank(rows, "fig13", trace, "mean_batched_requests", paper)
        metric = f"{trace} {FIG13_METRIC}"
        if "paged" in measured and "orca-oracle" in measured:
            ratio = paper["paged"] / paper["orca-oracle"]
            verdicts.append(ratio_verdict(f"{metric}, paged/orca-oracle", measured["paged"],
                                          measured["orca-oracle"], ratio))  # fmt: skip
        elif {"paged", "orca-oracle"} & blank:
            verdicts.append(unmeasured(f"{metric}, paged/orca-oracle", "a run finished without a value"))
        else:
            verdicts.append(missing(f"{metric}, paged/orca-oracle", "a run did not finish"))
        verdicts.append(_order(metric, measured, paper, blank))
        verdicts += _values(FIG13_METRIC, measured, paper, f"{trace} ", blank)
    return figure_verdict(verdicts)
