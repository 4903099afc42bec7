"""Figures 2 and 13 of `kvbench reproduce`: every engine on one trace, saturated, as the demo.

Each engine runs through `kvbench.demo.run_engine` (the demo's own run and row), at the
paper's Figure 13 rate times the setting's rate scale.
"""

from __future__ import annotations

from pathlib import Path

from kvbench.config import RunConfig
from kvbench.demo import DEMO_ENGINES, DemoRow, format_table, run_engine
from kvbench.paper import FIG2_OCCUPANCY, FIG13_BATCHED, FIG13_RATE
from kvbench.report.figures import PlotSkipped, plot_batched_bars, plot_occupancy_bars
from kvbench.reproduce.rows import FigureResult, Options, Row
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
            engine=engine, model=s.model, workload=workload, kv_cache_gib=s.kv_cache_gib,
            cost_model=None if s.real else s.cost_model, device=s.device if s.real else "cpu",
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
                        fig2_verdict(demo), plots, tuple(notes))  # fmt: skip


def fig2_verdict(demo: list[DemoRow]) -> str:
    useful = {r.engine: r.occupancy["token_states"] for r in demo}
    order = sorted((e for e in useful if e in FIG2_OCCUPANCY), key=useful.get)
    paper = sorted(FIG2_OCCUPANCY, key=lambda e: FIG2_OCCUPANCY[e]["token_states"])
    span = ", ".join(f"{e} {useful[e]:.1f} % ({FIG2_OCCUPANCY[e]['token_states']:.1f})" for e in paper)
    if order == paper:
        return f"order of engines matches the paper (token states, kvbench (paper): {span})"
    return f"differs: token-state order {' < '.join(order)}, paper {' < '.join(paper)} ({span})"


def fig13(options: Options, folder: Path) -> FigureResult:
    rows, verdicts, notes, plots = [], [], [], []
    for trace in FIG13_BATCHED:
        demo = run_engines(options, trace, folder / trace, shared=folder.parent / "fig2")
        paper = FIG13_BATCHED[trace]
        rows += [
            Row("fig13", r.engine, trace, "mean_batched_requests", r.batched, paper.get(r.engine))
            for r in demo
        ]
        batched = {r.engine: r.batched for r in demo}
        holds = batched["paged"] > batched["orca-oracle"] > batched["orca-pow2"] >= batched["orca-max"]
        ratio = batched["paged"] / batched["orca-oracle"]
        paper_ratio = paper["paged"] / paper["orca-oracle"]
        verdicts.append(
            f"{trace}: {'order matches' if holds else 'order differs'} "
            f"(paged/orca-oracle {ratio:.2f}x, paper {paper_ratio:.2f}x)"
        )
        runs = [folder / trace / e for e in DEMO_ENGINES]
        plots += [
            f"{trace}/{name}" for name in _plot(plot_batched_bars, runs, folder / trace / "batched", notes)
        ]
    ok = all("order matches" in v for v in verdicts)
    verdict = ("order of engines matches the paper: " if ok else "differs: ") + "; ".join(verdicts)
    return FigureResult("fig13", "Mean batched requests (time-weighted over busy time)", tuple(rows), verdict,
                        tuple(plots), tuple(notes))  # fmt: skip
