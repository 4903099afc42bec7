"""Figures 12, 14, 15, 17, 18b and 19 of `kvbench reproduce`, run in this process, each of their rows
read again from the sweep files the figure wrote: the latency at each rate, the shared bound,
every sustained rate with its bracket, capacity, the ratios and their intervals, the
sensitivity to the bound, the best block size, and the milliseconds a preemption costs, counted
from the cell's own steps and cost constants.

`tests/test_reproduce.py` runs the same figures through the CLI as a user does (a subprocess);
these check what each number is, and run where a mutation test can see them.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from kvbench.cost_model import CostModel
from kvbench.demo import DEMO_ENGINES
from kvbench.paper import (
    FIG2_OCCUPANCY,
    FIG12_SUSTAINED,
    FIG12_THRESHOLD_S,
    FIG13_BATCHED,
    FIG14_BEAM6_RATIO,
    FIG15_SAVED_PCT,
    FIG16_RATIO,
    FIG17_RATIO,
    FIG19_RECOMPUTE_MS,
    FIG19_SWAP_MS,
    RATIO_BASELINES,
)
from kvbench.report.figures import PlotSkipped
from kvbench.reproduce.engines import fig2, fig2_verdict, fig13, fig13_verdict
from kvbench.reproduce.rows import Options, Row, Setting
from kvbench.reproduce.sharing import (
    FIG14_SEQUENCE_RATES,
    FIG15_METRIC,
    FIG15_SEQUENCE_RATE,
    FIG16_RATES,
    PATTERNS,
    WIDTHS,
    _widths,
    fig14,
    fig14_engines,
    fig14_verdict,
    fig15,
    fig15_verdict,
    fig16,
    fig16_engines,
    fig16_model,
    fig16_verdict,
    fig17,
    fig17_engines,
    fig17_verdict,
)
from kvbench.reproduce.sweeps import (
    BOUND,
    FIG12_BRACKET,
    FIG12_RATES,
    FIG18B_RATE,
    FIG19_BUDGET_SHARE,
    FIG19_RATE,
    SENSITIVITY,
    _plot_overheads,
    fig12,
    fig12_verdict,
    fig18b,
    fig18b_block_sizes,
    fig18b_verdict,
    fig19,
    fig19_verdict,
)
from kvbench.sweep.grid import PAPER_ENGINES

QUICK = Options(quick=True, setting=Setting(), num_requests=200)
SHARING = Options(quick=True, setting=Setting(), num_requests=30)
NUMBERS = {"rate", "normalized_latency_s", "request_throughput", "num_preemptions", "block_size"}


def _number(text: str) -> float | None:
    return None if text == "" else float(text)


def cells_of(sweep: Path) -> list[dict]:
    """sweep.csv's cells but the baselines, their numbers as floats (None where empty)."""
    with open(sweep / "sweep.csv", newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["role"] != "baseline"]
    return [{k: _number(v) if k in NUMBERS else v for k, v in r.items()} for r in rows]


def sustained_of(sweep: Path) -> dict[str, dict]:
    """sustained.csv by engine, its rates and bound as floats (None where empty)."""
    with open(sweep / "sustained.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    keys = ("last_pass_rate", "first_fail_rate", "latency_threshold_s")
    return {r["engine"]: {k: _number(r[k]) for k in keys} for r in rows}


def keyed(rows, figure: str) -> dict[tuple[str, str, str], Row]:
    """A figure's rows by (engine, workload, metric), each key once, every one the figure's."""
    assert {r.figure for r in rows} == {figure}
    out = {(r.engine, r.workload, r.metric): r for r in rows}
    assert len(out) == len(rows), "two rows of one engine, workload and metric"
    return out


def same(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a == pytest.approx(b, rel=1e-12))


def bracket_under(cells: list[dict], engine: str, bound: float) -> tuple[float, float] | None:
    """The figure's reading, done here again: the rates in order, each its repeats' mean latency
    (a failed repeat fails the rate), the last rate before the first over the bound."""
    by_rate: dict[float, list] = {}
    for c in cells:
        if c["engine"] == engine:
            ok = c["status"] == "ok" and c["normalized_latency_s"] is not None
            by_rate.setdefault(c["rate"], []).append(c["normalized_latency_s"] if ok else None)
    last = None
    for rate in sorted(by_rate):
        values = by_rate[rate]
        if None in values or not sum(values) / len(values) < bound:
            return None if last is None else (last, rate)
        last = rate
    return None if last is None else (last, math.inf)


def check_rate_rows(rows: dict, label: str, sweep: Path, engines, ratios: dict, numerator: str = "paged",
                    absolute: dict | None = None, paper_bound: bool = True) -> dict:  # fmt: skip
    """A rate sweep's rows (`rate_rows`) against its files; each engine's capacity."""
    cells, sustained = cells_of(sweep), sustained_of(sweep)
    ok = [c for c in cells if c["status"] == "ok"]
    config = json.loads((sweep / "cells" / cells[0]["cell_id"] / "config.json").read_text())
    assert config["kv_cache_gib"] == 12.0  # the setting's budget
    # bisected: a bracket with a failing rate is at most FIG12_BRACKET wide
    finite = [s for s in sustained.values() if s["last_pass_rate"] and s["first_fail_rate"]]
    assert all(s["first_fail_rate"] <= (1 + FIG12_BRACKET) * s["last_pass_rate"] + 1e-9 for s in finite)
    latency = {k: r for k, r in rows.items() if k[1] == label and k[2].startswith("normalized_latency_s@")}
    assert len(latency) == len(ok)
    for c in ok:
        assert same(
            rows[c["engine"], label, f"normalized_latency_s@{c['rate']:g}"].kvbench, c["normalized_latency_s"]
        )
    (bound,) = {s["latency_threshold_s"] for s in sustained.values()}
    assert same(rows["all", label, BOUND].kvbench, bound)
    assert bound == FIG12_THRESHOLD_S or not paper_bound  # the paper's setting: its 0.5 s/token
    brackets, capacity = {}, {}
    for engine in engines:
        found = sustained[engine]
        last, fail = found["last_pass_rate"], found["first_fail_rate"]
        brackets[engine] = None if last is None else (last, math.inf if fail is None else fail)
        row = rows[engine, label, "sustained_rate_req_s"]
        assert same(row.kvbench, last) and same(row.paper, (absolute or {}).get(engine))
        assert (row.low, row.high) == (brackets[engine] or (None, None))
        capacity[engine] = max((c["request_throughput"] for c in ok if c["engine"] == engine), default=None)
        assert same(rows[engine, label, "capacity_req_s"].kvbench, capacity[engine])
    for other, paper in ratios.items():
        pair = f"{numerator}/{other}"
        row = rows[pair, label, "sustained_ratio"]
        a, b = brackets[numerator], brackets[other]
        assert same(row.paper, paper)
        if a is None or b is None:
            assert row.kvbench is None and row.low is None and row.high is None
        else:
            assert same(row.kvbench, a[0] / b[0])
            assert same(row.low, a[0] / b[1]) and same(row.high, a[1] / b[0])
        expected = capacity[numerator] / capacity[other] if capacity[other] else None
        assert same(rows[pair, label, "capacity_ratio"].kvbench, expected)
    return capacity


def unsaturated_note(label: str, sweep: Path, engines, capacity: dict) -> list[str]:
    """The note naming the engines whose capacity is only a lower bound, recomputed."""
    ok = [c for c in cells_of(sweep) if c["status"] == "ok"]
    top = {e: max((c["rate"] for c in ok if c["engine"] == e), default=None) for e in engines}
    kept = [e for e in engines if capacity[e] and top[e] and capacity[e] >= 0.9 * top[e]]
    return (
        [f"{label}: {', '.join(kept)} kept up with the highest rate: capacity a lower bound"] if kept else []
    )


def check_fig12(result, folder: Path, options: Options) -> None:
    """Figure 12's rows, notes and plots against its two sweeps' files."""
    rows = keyed(result.rows, "fig12")
    for trace in FIG12_RATES:
        paper = FIG12_SUSTAINED[trace]
        ratios = {other: paper["paged"] / paper[other] for other in RATIO_BASELINES}
        sweep = folder / trace
        absolute = paper if options.setting.rate_scale == 1 else None  # the paper's rates, or none
        paper_bound = options.setting.paper_threshold
        capacity = check_rate_rows(
            rows, trace, sweep, PAPER_ENGINES, ratios, absolute=absolute, paper_bound=paper_bound
        )
        assert set(unsaturated_note(trace, sweep, PAPER_ENGINES, capacity)) <= set(result.notes)
        # the ratios read again at each multiple of the bound, from the cells already run
        cells = cells_of(sweep)
        (bound,) = {s["latency_threshold_s"] for s in sustained_of(sweep).values()}
        for multiple in SENSITIVITY:
            for other, ratio in ratios.items():
                metric = f"sustained_ratio@bound x {multiple:g} ({multiple * bound:.3g} s/token)"
                row = rows[f"paged/{other}", trace, metric]
                a, b = (bracket_under(cells, e, multiple * bound) for e in ("paged", other))
                assert same(row.paper, ratio)
                if a is None or b is None:
                    assert row.kvbench is None
                else:
                    assert same(row.kvbench, a[0] / b[0]) and same(row.low, a[0] / b[1])
                    assert same(row.high, a[1] / b[0])
        per_trace = [k for k in rows if k[1] == trace]
        ok = sum(c["status"] == "ok" for c in cells)
        # latency rows, the bound, rate and capacity per engine, two ratios per baseline, the sensitivity
        assert len(per_trace) == ok + 1 + 2 * len(PAPER_ENGINES) + len(ratios) * (2 + len(SENSITIVITY))
        assert f"{trace}/latency_vs_rate.png" in result.plots and (sweep / "latency_vs_rate.png").is_file()
    assert not [k for k in rows if k[1] not in FIG12_RATES]
    assert (result.name, result.title) == ("fig12", "Sustained request rate (normalized latency vs rate)")
    assert result.verdict == fig12_verdict(result.rows, options)
    *kept_up, threshold, ratio = result.notes
    assert kept_up == [
        n
        for t in FIG12_RATES
        for n in unsaturated_note(t, folder / t, PAPER_ENGINES, capacity_of(folder / t))
    ]
    assert threshold.startswith("sustained: the highest rate with normalized latency under one bound")
    assert ratio.startswith("sustained rates bisected to brackets at most 10 % wide") and ratio.endswith(
        "; sustained_ratio@bound x m: the same ratios read at m x the bound (0.5, 0.75, 1.0, 1.25, 2.0, "
        "4.0) from the cells already run (a bound away from the bisected one has grid-wide brackets)"
    )


def capacity_of(sweep: Path) -> dict[str, float | None]:
    ok = [c for c in cells_of(sweep) if c["status"] == "ok"]
    engines = {c["engine"] for c in ok}
    return {e: max(c["request_throughput"] for c in ok if c["engine"] == e) for e in engines}


def test_figure_12s_rows_are_its_sweeps_read_back(tmp_path):
    result = fig12(QUICK, tmp_path)
    check_fig12(result, tmp_path, QUICK)
    assert any(f"the paper's {FIG12_THRESHOLD_S:g} s/token, unchanged" in note for note in result.notes)


def test_figure_12_off_the_papers_rates_judges_ratios_alone_under_a_measured_bound(tmp_path):
    """Rates scaled by anything but 1 are not the paper's: no engine's rate is held against its
    number, while the ratios still are; the bound is the shared multiple of the unloaded latency,
    so the baseline cells run, and no sensitivity bracket may read them. So light a load (seed 1's
    arrivals) that every engine keeps up: each trace's note says so."""
    scaled = Options(
        quick=True, setting=Setting(rate_scale=0.002, paper_threshold=False), num_requests=30, seed=1
    )
    result = fig12(scaled, tmp_path)
    check_fig12(result, tmp_path, scaled)
    rates = [r for r in result.rows if r.metric == "sustained_rate_req_s"]
    assert len(rates) == 2 * len(PAPER_ENGINES) and all(r.paper is None for r in rates)
    assert all(r.paper for r in result.rows if r.metric == "sustained_ratio")
    for trace in FIG12_RATES:
        cells = cells_of(tmp_path / trace)
        assert {c["rate"] for c in cells if c["role"] == "grid"} == {
            0.002 * r for r in FIG12_RATES[trace]["quick"]
        }
        with open(tmp_path / trace / "sweep.csv", newline="", encoding="utf-8") as f:
            baseline = [r for r in csv.DictReader(f) if r["role"] == "baseline"]
        assert baseline and all(r["status"] == "ok" for r in baseline)
    kept_up = [n for n in result.notes if "kept up with the highest rate" in n]
    assert [n.split(":")[0] for n in kept_up] == list(FIG12_RATES)
    assert (
        "4 x the lowest unloaded normalized latency of the compared engines on the simulated machine"
        in (result.notes[-2])
    )


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_figure_18bs_rows_are_each_block_sizes_latency_and_the_best(scale, tmp_path):
    options = Options(quick=True, setting=Setting(rate_scale=scale), num_requests=200 if scale == 1 else 40)
    result = fig18b(options, tmp_path)
    rows = keyed(result.rows, "fig18b")
    for trace, rate in FIG18B_RATE.items():
        cells = [c for c in cells_of(tmp_path / trace) if c["status"] == "ok"]
        assert {c["rate"] for c in cells} == {rate * scale}
        latency = {int(c["block_size"]): c["normalized_latency_s"] for c in cells}
        assert tuple(sorted(latency)) == fig18b_block_sizes(options) == (1, 4, 16, 32, 64, 128, 256)
        for c in cells:
            config = json.loads((tmp_path / trace / "cells" / c["cell_id"] / "config.json").read_text())
            assert config["kv_cache_gib"] == 12.0
        for bs, value in latency.items():
            assert same(rows["paged", trace, f"normalized_latency_s@bs{bs}"].kvbench, value)
        assert rows["paged", trace, "best_block_size"].kvbench == min(latency, key=latency.get)
        assert len([k for k in rows if k[1] == trace]) == len(latency) + 1
        assert f"{trace}/block_size.png" in result.plots
    assert result.notes == tuple(f"{trace} at {rate * scale:g} req/s" for trace, rate in FIG18B_RATE.items())
    assert len(rows) == sum(len([k for k in rows if k[1] == t]) for t in FIG18B_RATE)
    assert (result.name, result.title) == ("fig18b", "End-to-end normalized latency vs block size (paged)")
    assert result.verdict == fig18b_verdict(result.rows, options) and "best block size" in result.verdict


def test_figure_18bs_grids_span_the_papers_block_sizes():
    """Every grid holds the paper's ends (1, 256) and default (16), as powers of two; a quick real
    run fewer sizes than a quick simulated one, the full grid every power."""
    real = Options(quick=True, setting=Setting(real=True))
    grids = [fig18b_block_sizes(o) for o in (QUICK, real, Options(quick=False, setting=Setting()))]
    for grid in grids:
        assert {1, 16, 256} <= set(grid) and all(bs & (bs - 1) == 0 for bs in grid)
    assert len(grids[1]) < len(grids[0]) < len(grids[2]) == 9


def overhead_ms(cell: Path, how: str) -> float | None:
    """A cell's milliseconds per preemption from its own files: blocks swapped, or prefilled
    tokens beyond the prompts, times the cell's cost constant for one, over its preemptions."""
    summary = json.loads((cell / "summary.json").read_text())
    count = summary["num_preemptions"]
    if not count:
        return None
    cost = CostModel(**json.loads((cell / "config.json").read_text())["cost_model_constants"])
    with open(cell / "steps.csv", newline="") as f:
        steps = list(csv.DictReader(f))
    if how == "swap":
        units, constant = sum(float(s["swapped_blocks"]) for s in steps), cost.per_swap_block_s
    else:
        with open(cell / "requests.csv", newline="") as f:
            prompts = sum(float(r["prompt_len"]) for r in csv.DictReader(f))
        prefilled = sum(float(s["num_tokens"]) for s in steps if s["kind"] == "prefill")
        units, constant = max(prefilled - prompts, 0.0), cost.per_token(prefill=True)
    return 1e3 * units * constant / count if constant > 0 else None


def test_figure_19s_overheads_are_counted_from_each_cells_steps(tmp_path):
    result = fig19(QUICK, tmp_path)
    rows = keyed(result.rows, "fig19")
    preempted = 0
    for how in ("recompute", "swap"):
        cells = [c for c in cells_of(tmp_path / how) if c["status"] == "ok"]
        assert {c["rate"] for c in cells} == {FIG19_RATE} and len(cells) == 5
        for c in cells:
            bs = int(c["block_size"])
            config = json.loads((tmp_path / how / "cells" / c["cell_id"] / "config.json").read_text())
            assert config["preemption"] == how and config["kv_cache_gib"] == 12.0 * FIG19_BUDGET_SHARE
            ms = overhead_ms(tmp_path / how / "cells" / c["cell_id"], how)
            row = rows[f"paged-{how}", "sharegpt-paper", f"overhead_ms_per_preemption@bs{bs}"]
            paper = FIG19_SWAP_MS.get(bs) if how == "swap" else FIG19_RECOMPUTE_MS
            assert same(row.kvbench, ms) and same(row.paper, paper)
            assert (
                rows[f"paged-{how}", "sharegpt-paper", f"preemptions@bs{bs}"].kvbench == c["num_preemptions"]
            )
            latency = rows[f"paged-{how}", "sharegpt-paper", f"normalized_latency_s@bs{bs}"].kvbench
            assert same(latency, c["normalized_latency_s"])
            preempted += bool(c["num_preemptions"])
        assert f"{how}/block_size.png" in result.plots
    assert len(rows) == 3 * 10 and preempted >= 8  # the quarter budget makes paged preempt
    assert "overhead.png" in result.plots and (tmp_path / "overhead.png").is_file()
    assert result.name == "fig19"
    assert result.title == "Preemption: recompute vs swap, overhead per preemption vs block size"
    assert result.verdict == fig19_verdict(result.rows, QUICK)
    assert result.notes[-1] == (
        f"{12.0 * FIG19_BUDGET_SHARE:g} GiB of KV (0.25 of the setting's) at 2 req/s so that paged preempts; "
        "overheads: the blocks swapped / tokens recomputed times the cost model's constants (simulated) or "
        "constants fitted to the cell's own step times (real)"
    )


def test_the_overhead_plot_needs_two_block_sizes_that_preempted(tmp_path):
    one = {"swap": {1: 100.0, 16: None}, "recompute": {1: None, 4: 30.0}}
    with pytest.raises(PlotSkipped, match="fewer than two block sizes preempted"):
        _plot_overheads(one, tmp_path / "one")
    two = {"swap": {1: 100.0, 16: 40.0}, "recompute": {}}
    assert [p.name for p in _plot_overheads(two, tmp_path / "two")] == ["two.png", "two.svg"]


def test_figure_14s_widths_and_rows(tmp_path):
    assert _widths(SHARING, "n") == (6,) and _widths(SHARING, "k") == (2, 6)
    assert fig14_engines(SHARING) == ("orca-max", "orca-oracle", "paged")
    assert fig14_engines(Options(quick=False, setting=Setting())) == (
        "orca-max",
        "orca-pow2",
        "orca-oracle",
        "paged",
    )
    assert fig14_engines(Options(quick=True, setting=Setting(real=True))) == ("orca-oracle", "paged")
    full = Options(quick=False, setting=Setting())
    assert _widths(full, "n") == WIDTHS == _widths(full, "k")
    real = Options(quick=True, setting=Setting(real=True))
    assert (_widths(real, "n"), _widths(real, "k")) == ((4,), (6,))
    result = fig14(SHARING, tmp_path)
    rows = keyed(result.rows, "fig14")
    engines = ("orca-max", "orca-oracle", "paged")
    for name, width, field in (("n6", 6, "n"), ("k2", 2, "beam_width"), ("k6", 6, "beam_width")):
        label, sweep = f"alpaca-paper {name[0]}={width}", tmp_path / name
        cells = cells_of(sweep)
        grid = {c["rate"] for c in cells if c["role"] == "grid"}
        assert grid == {r / width for r in FIG14_SEQUENCE_RATES["quick"]}
        assert {c["engine"] for c in cells} == set(engines)
        config = json.loads((sweep / "cells" / cells[0]["cell_id"] / "config.json").read_text())
        assert config["workload"][field] == width
        paper = FIG14_BEAM6_RATIO if name == "k6" else None
        capacity = check_rate_rows(rows, label, sweep, engines, {"orca-oracle": paper})
        assert set(unsaturated_note(label, sweep, engines, capacity)) <= set(result.notes)
        assert f"{name}/latency_vs_rate.png" in result.plots
    assert {k[1] for k in rows} == {"alpaca-paper n=6", "alpaca-paper k=2", "alpaca-paper k=6"}
    assert result.verdict == fig14_verdict(result.rows, SHARING)
    assert result.name == "fig14"
    assert result.title == "Parallel sampling and beam search: normalized latency vs rate (Alpaca)"
    assert "alpaca-paper k=6 paged/orca-oracle sustained rate" in result.verdict
    assert result.notes[-1].startswith("paper: paged over Orca (Oracle) grows from 1.3x")


def test_figure_15s_rows_are_each_runs_saving_beside_the_papers(tmp_path):
    """Every (trace, samples or beams, width) run: its config (the sequence load over the width,
    the width), its saving (summary.json's sharing_saved_fraction, in %) beside the paper's where
    the paper gives one, its preemptions, the notes naming the preempted runs, and a verdict of
    each of the paper's savings."""
    # not defaults; 7 GiB at 8x the load preempts in three ShareGPT runs, so the note has a list to give
    options = Options(quick=True, setting=Setting(rate_scale=8.0, kv_cache_gib=7.0), num_requests=30, seed=3)
    result = fig15(options, tmp_path)
    rows = keyed(result.rows, "fig15")
    assert len(rows) == 2 * len(FIG15_SEQUENCE_RATE) * len(PATTERNS) * len(WIDTHS)
    preempted = []
    for trace, sequence_rate in FIG15_SEQUENCE_RATE.items():
        for letter, pattern in PATTERNS.items():
            for width in WIDTHS:
                run = tmp_path / trace / f"{letter}{width}"
                config = json.loads((run / "config.json").read_text())
                workload = config["workload"]
                assert (config["engine"], workload["source"], workload["num_requests"]) == (
                    "paged",
                    trace,
                    30,
                )
                assert workload["seed"] == 3 and config["kv_cache_gib"] == 7.0
                assert workload["rate"] == pytest.approx(sequence_rate * 8.0 / width)
                assert workload["n" if letter == "n" else "beam_width"] == width
                assert workload["beam_width" if letter == "n" else "n"] == 1
                summary = json.loads((run / "summary.json").read_text())
                saved = rows["paged", trace, f"saved_%@{letter}{width}"]
                assert saved.kvbench == pytest.approx(100 * summary["sharing_saved_fraction"], rel=1e-12)
                assert saved.paper == FIG15_SAVED_PCT[trace, pattern].get(width)
                count = rows["paged", trace, f"preemptions@{letter}{width}"].kvbench
                assert (
                    count == summary["num_preemptions"]
                    and rows["paged", trace, f"preemptions@{letter}{width}"].paper is None
                )
                if count:
                    preempted.append(f"{trace} {letter}{width}")
    assert any(r.kvbench > 0 for r in result.rows if r.metric.startswith("saved_%@k"))  # beams share
    loads = ", ".join(f"{t} {r * 8.0:g}" for t, r in FIG15_SEQUENCE_RATE.items())
    assert f"sequence load per run: {loads} requests/s x width, so paged rarely preempts" in result.notes
    said = [n for n in result.notes if n.startswith("preempted (sharing lost while recomputed): ")]
    assert len(preempted) >= 2
    assert said == [f"preempted (sharing lost while recomputed): {', '.join(preempted)}"]
    assert result.verdict == fig15_verdict(result.rows, options)
    for (trace, pattern), paper in FIG15_SAVED_PCT.items():
        letter = {p: k for k, p in PATTERNS.items()}[pattern]
        for width in paper:
            assert f"{trace} {pattern} {letter}={width} {FIG15_METRIC}" in result.verdict
    assert "not run at this width" not in result.verdict
    assert (result.name, result.title) == (
        "fig15",
        "KV memory saved by sharing: parallel sampling and beam search",
    )
    assert any(p.startswith("saved") for p in result.plots)


def test_figure_15s_verdict_names_a_width_not_run():
    """A saving the paper gives at a width the rows lack is "not run", not judged."""
    rows = [Row("fig15", "paged", "alpaca-paper", "saved_%@n2", 6.0, 6.09)]
    verdict = fig15_verdict(rows, SHARING)
    assert f"alpaca-paper parallel n=4 {FIG15_METRIC}" in verdict and "not run at this width" in verdict
    assert "alpaca-paper parallel n=2" in verdict


def test_figure_12s_verdict_names_the_bound_and_judges_each_engine_the_paper_rates():
    """The order, then each engine's rate where the paper gives one and kvbench measured one,
    every metric naming the bound the rates were read under (or that none was set)."""
    rows = [Row("fig12", "all", "sharegpt-paper", BOUND, 0.04)]
    rows += [
        Row("fig12", e, "sharegpt-paper", "sustained_rate_req_s", 1.0 + i, None if e == "static" else paper)
        for i, (e, paper) in enumerate(FIG12_SUSTAINED["sharegpt-paper"].items())
    ]
    rows += [
        Row("fig12", "paged", "alpaca-paper", "sustained_rate_req_s", 30.0, 28.1),
        Row("fig12", "orca-oracle", "alpaca-paper", "sustained_rate_req_s", math.nan, 21.1),  # none measured
    ]
    verdict = fig12_verdict(rows, QUICK)
    shared = "sharegpt-paper sustained rate, normalized latency <= 0.04 s/token"
    assert f"matches (order only): {shared}: static 1 (paper 0.23), orca-max 2 (paper 0.52)" in verdict
    for engine in ("orca-max", "orca-pow2", "orca-oracle", "paged"):
        assert f"{shared}, {engine}: kvbench" in verdict, engine
    assert f"{shared}, static" not in verdict  # no paper rate given in these rows
    unset = "alpaca-paper sustained rate, normalized latency <= a bound never set"
    assert f"matches: {unset}, paged: kvbench 30" in verdict
    assert f"{unset}, orca-oracle" not in verdict  # its NaN is no measurement


def test_figure_18bs_verdict_lists_the_sizes_within_5_percent_and_a_trace_with_none():
    rows = [
        Row("fig18b", "paged", "alpaca-paper", f"normalized_latency_s@bs{bs}", v)
        for bs, v in ((8, 2.5), (16, 2.0), (32, 2.1), (64, 3.0))
    ]  # 32 at exactly 1.05 x the best
    verdict = fig18b_verdict(rows, QUICK)
    metric = "best block size (lowest normalized latency, mean over requests)"
    assert f"sharegpt-paper {metric}: no measurement: no block size finished" in verdict
    assert verdict.endswith(
        "matches: alpaca-paper best block size (lowest normalized latency, mean over requests): kvbench 16, "
        "paper 16-32; within 5 % of the best: 16 (+0.0%), 32 (+5.0%)"
    )


def test_figure_17s_rows_hold_every_orca_baseline_and_the_prefix_caches_capacity(tmp_path):
    full, real = Options(quick=False, setting=Setting()), Options(quick=True, setting=Setting(real=True))
    assert fig17_engines(full) == ("orca-max", "orca-pow2", "orca-oracle", "paged", "paged-prefix")
    assert fig17_engines(real) == ("orca-oracle", "paged", "paged-prefix")
    result = fig17(SHARING, tmp_path)
    rows = keyed(result.rows, "fig17")
    engines = ("orca-max", "orca-oracle", "paged", "paged-prefix")
    label, sweep = "sharegpt-paper chat", tmp_path / "chat"
    cells = cells_of(sweep)
    config = json.loads((sweep / "cells" / cells[0]["cell_id"] / "config.json").read_text())
    assert (config["workload"]["chat_turns"], config["workload"]["max_history"]) == (4, 1024)
    ratios = {"orca-max": FIG17_RATIO, "orca-oracle": FIG17_RATIO}
    capacity = check_rate_rows(rows, label, sweep, engines, ratios)
    reuse = capacity["paged-prefix"] / capacity["paged"]
    assert same(rows["paged-prefix/paged", label, "capacity_ratio"].kvbench, reuse)
    assert f"paged-prefix/paged capacity {reuse:.2f}x (beyond the paper)" in result.notes
    assert not [
        k for k in rows if k[0].startswith("paged/") and k[0] not in {"paged/orca-max", "paged/orca-oracle"}
    ]
    assert set(unsaturated_note(label, sweep, engines, capacity)) <= set(result.notes)
    assert result.plots == ("chat/latency_vs_rate.png", "chat/latency_vs_rate.svg")
    assert result.verdict == fig17_verdict(result.rows, SHARING)
    assert result.name == "fig17"
    assert result.title == "Chatbot: normalized latency vs rate (history cut to 1024 tokens)"


def check_bisected(result, figure: str, sweep: Path, label: str) -> set[str]:
    """Every rate bracketed inside `sweep`'s grid bisected to at most FIG12_BRACKET wide (cells of
    role `bisect`), its row giving the bisected bracket; the engines bracketed."""
    finite = {e: s for e, s in sustained_of(sweep).items() if s["last_pass_rate"] and s["first_fail_rate"]}
    assert any(c["role"] == "bisect" for c in cells_of(sweep))
    rows = keyed(result.rows, figure)
    for engine, found in finite.items():
        assert found["first_fail_rate"] <= (1 + FIG12_BRACKET) * found["last_pass_rate"] + 1e-9
        row = rows[engine, label, "sustained_rate_req_s"]
        assert (row.kvbench, row.low, row.high) == (found["last_pass_rate"], found["last_pass_rate"],
                                                    found["first_fail_rate"])  # fmt: skip
    return set(finite)


def test_figures_16_and_17_bisect_each_rate_their_grids_bracket(tmp_path):
    """Where engines fail inside the quick grid (a small KV budget: Figure 17 at 2 GiB, Figure 16
    at 0.6 GiB), each bracket is bisected until it is at most FIG12_BRACKET wide and the rows give
    the bisected bracket. At the setting's 12 GiB the quick grids bracket nothing."""
    chat = fig17(Options(quick=True, setting=Setting(rate_scale=4.0, kv_cache_gib=2.0), num_requests=60),
                 tmp_path / "fig17")  # fmt: skip
    assert {"orca-max", "orca-oracle"} <= check_bisected(chat, "fig17", tmp_path / "fig17" / "chat",
                                                         "sharegpt-paper chat")  # fmt: skip
    prefix = fig16(Options(quick=True, setting=Setting(rate_scale=4.0, kv_cache_gib=0.6), num_requests=100),
                   tmp_path / "fig16")  # fmt: skip
    one = check_bisected(prefix, "fig16", tmp_path / "fig16" / "fewshot-1", "translation fewshot-1")
    five = check_bisected(prefix, "fig16", tmp_path / "fig16" / "fewshot-5", "translation fewshot-5")
    assert "orca-oracle" in one and {"orca-oracle", "paged"} <= five


def test_figures_14_16_and_17_name_the_engines_that_kept_up_with_their_highest_rate(tmp_path):
    """At rates far below every engine's capacity each engine completes what arrives, so its
    capacity is only a lower bound, and each figure's notes say so per sweep (recomputed from
    sweep.csv), naming every engine. Seed 1 draws arrivals that reach 90 % of the top rate."""
    low = Options(quick=True, setting=Setting(rate_scale=0.002), num_requests=10, seed=1)
    figures = (
        (fig14, ("orca-max", "orca-oracle", "paged"), {"n6": "alpaca-paper n=6", "k2": "alpaca-paper k=2",
                                                       "k6": "alpaca-paper k=6"}),
        (fig16, ("orca-oracle", "paged", "paged-prefix"), {p: f"translation {p}" for p in FIG16_RATIO}),
        (fig17, ("orca-max", "orca-oracle", "paged", "paged-prefix"), {"chat": "sharegpt-paper chat"}),
    )  # fmt: skip
    for run, engines, sweeps in figures:
        result = run(low, tmp_path / run.__name__)
        kept = [n for n in result.notes if "kept up with the highest rate" in n]
        expected = []
        for name, label in sweeps.items():
            sweep = tmp_path / run.__name__ / name
            capacity = {e: max(c["request_throughput"] for c in cells_of(sweep) if c["engine"] == e)
                        for e in engines}  # fmt: skip
            expected += unsaturated_note(label, sweep, engines, capacity)
        assert kept == expected == [
            f"{label}: {', '.join(engines)} kept up with the highest rate: capacity a lower bound"
            for label in sweeps.values()
        ], run.__name__


def test_figure_16_runs_the_papers_model_only_in_the_papers_simulated_setting():
    """LLaMA-13B stands in for OPT-13B on the roofline only: a calibrated or a real setting was
    measured on its own model, and another model is the user's choice."""
    assert fig16_model(Setting()) == "llama-13b"
    assert fig16_model(Setting(model="opt-125m")) == "opt-125m"
    assert fig16_model(Setting(cost_model="cost.json")) == "opt-13b"
    assert fig16_model(Setting(real=True)) == "opt-13b"
    assert fig16_engines(SHARING) == ("orca-oracle", "paged", "paged-prefix")
    full = ("orca-max", "orca-oracle", "paged", "paged-prefix")
    assert fig16_engines(Options(quick=False, setting=Setting())) == full
    assert fig16_engines(Options(quick=True, setting=Setting(real=True))) == ("orca-oracle", "paged-prefix")


def test_figure_16s_rows_are_each_prefixs_sweep_read_back(tmp_path):
    """Per few-shot prefix: the sweep of the translation requests behind it, on the paper's
    model where the setting is the paper's, its rows (paged-prefix over orca-oracle against the
    paper's ratio), notes, plots and verdict."""
    result = fig16(SHARING, tmp_path)
    rows = keyed(result.rows, "fig16")
    engines = ("orca-oracle", "paged", "paged-prefix")
    for prefix, paper in FIG16_RATIO.items():
        label, sweep = f"translation {prefix}", tmp_path / prefix
        cells = cells_of(sweep)
        assert {c["engine"] for c in cells} == set(engines)
        assert {c["rate"] for c in cells if c["role"] == "grid"} == set(FIG16_RATES["quick"])
        config = json.loads((sweep / "cells" / cells[0]["cell_id"] / "config.json").read_text())
        assert (config["model"], config["workload"]["prefix"]) == ("llama-13b", prefix)
        capacity = check_rate_rows(
            rows, label, sweep, engines, {"orca-oracle": paper}, numerator="paged-prefix"
        )
        assert set(unsaturated_note(label, sweep, engines, capacity)) <= set(result.notes)
        assert f"{prefix}/latency_vs_rate.png" in result.plots
        assert f"translation {prefix} paged-prefix/orca-oracle sustained rate" in result.verdict
    assert {k[1] for k in rows} == {f"translation {prefix}" for prefix in FIG16_RATIO}
    assert any(n.startswith("llama-13b; requests: ") for n in result.notes)
    assert result.verdict == fig16_verdict(result.rows, SHARING)
    assert (result.name, result.title) == (
        "fig16",
        "Shared prefix: normalized latency vs rate (translation, few-shot prefix)",
    )


def _ratio(figure: str, pair: str, label: str, value: float, low: float, high: float) -> Row:
    return Row(figure, pair, label, "sustained_ratio", value, None, low, high)


def test_figure_17s_verdict_judges_every_paged_over_orca_pair_and_no_other():
    label = "sharegpt-paper chat"
    near = [_ratio("fig17", "paged/orca-max", label, 2.1, 1.9, 2.3),
            _ratio("fig17", "paged/orca-oracle", label, 1.95, 1.8, 2.2)]  # fmt: skip
    assert fig17_verdict(near, SHARING).startswith("matches: ")
    others = [
        _ratio("fig17", "paged-prefix/orca-oracle", label, 9.0, 9.0, 9.0),  # beyond the paper
        _ratio("fig17", "paged/orca-pow2", "sharegpt-paper", 9.0, 9.0, 9.0),  # another label
        _ratio("fig12", "paged/orca-pow2", label, 9.0, 9.0, 9.0),  # another figure
        Row("fig17", "paged/orca-pow2", label, "capacity_ratio", 9.0),  # capacity is not judged
    ]
    verdict = fig17_verdict(near + others, SHARING)
    assert verdict.startswith("matches: ") and verdict.count("sustained rate") == 2
    far = [near[0], _ratio("fig17", "paged/orca-oracle", label, 1.2, 1.1, 1.3)]
    verdict = fig17_verdict(far, SHARING)
    assert verdict.startswith("differs: ") and verdict.index("paged/orca-max") < verdict.index(
        "paged/orca-oracle"
    )
    assert fig17_verdict([], SHARING) == "not measured: "


def test_figure_14s_verdict_is_beam_width_6s_ratio_against_the_papers():
    def rows(value, low, high, label="alpaca-paper k=6"):
        return [_ratio("fig14", "paged/orca-oracle", label, value, low, high)]

    assert fig14_verdict(rows(2.3, 2.2, 2.4), SHARING).startswith(
        "matches: matches: alpaca-paper k=6 paged/orca-oracle"
    )
    assert fig14_verdict(rows(1.3, 1.2, 1.4), SHARING).startswith("differs: ")
    other_width = fig14_verdict(rows(2.3, 2.2, 2.4, "alpaca-paper k=2"), SHARING)  # k=6 itself missing
    assert other_width.startswith("differs: ") and other_width.endswith("an engine sustained no rate swept")


OTHER = (
    "outside_window",
    "allocator_overhead",
    "mapped_idle",
    "external_frag",
    "free",
)  # the paper's "other"


def test_figures_2_and_13_are_each_runs_summary_beside_the_papers(tmp_path):
    """Figure 2: each engine's KV share by category, weighted by the time requests wait (the
    saturated occupancy), beside the paper's; Figure 13: each engine's busy-weighted batch on
    both traces, its ShareGPT runs Figure 2's own."""
    two = fig2(QUICK, tmp_path / "fig2")
    # a number no run gives: Figure 13 must read Figure 2's run, not run it again
    summary = tmp_path / "fig2" / "paged" / "summary.json"
    kept = json.loads(summary.read_text())
    summary.write_text(json.dumps({**kept, "mean_batched_requests": 1234.5}))
    thirteen = fig13(QUICK, tmp_path / "fig13")
    summary.write_text(json.dumps(kept))
    assert (two.name, thirteen.name) == ("fig2", "fig13")
    rows = keyed(two.rows, "fig2")
    assert len(rows) == len(DEMO_ENGINES) * 4
    for engine in DEMO_ENGINES:
        summary = json.loads((tmp_path / "fig2" / engine / "summary.json").read_text())
        occupancy = summary["occupancy_saturated"]
        expected = {c: 100 * occupancy[c] for c in ("token_states", "reservation", "internal_frag")}
        expected["other"] = 100 * sum(occupancy.get(c, 0.0) for c in OTHER)
        for category, value in expected.items():
            row = rows[engine, "sharegpt-paper", f"{category}_%"]
            assert same(row.kvbench, value) and same(row.paper, FIG2_OCCUPANCY.get(engine, {}).get(category))
    assert two.title == "KV memory breakdown (%), time-weighted while requests wait"
    assert two.verdict == fig2_verdict(two.rows, QUICK) and two.plots == ("occupancy.png", "occupancy.svg")
    rows = keyed(thirteen.rows, "fig13")
    assert len(rows) == len(DEMO_ENGINES) * len(FIG13_BATCHED)
    for trace, paper in FIG13_BATCHED.items():
        for engine in DEMO_ENGINES:
            summary = json.loads((tmp_path / "fig13" / trace / engine / "summary.json").read_text())
            row = rows[engine, trace, "mean_batched_requests"]
            assert same(row.kvbench, summary["mean_batched_requests"]) and same(row.paper, paper.get(engine))
    assert rows["paged", "sharegpt-paper", "mean_batched_requests"].kvbench == 1234.5
    assert thirteen.title == "Mean batched requests (time-weighted over busy time)"
    assert thirteen.verdict == fig13_verdict(thirteen.rows, QUICK)
    assert thirteen.plots == tuple(f"{t}/batched.{s}" for t in FIG13_BATCHED for s in ("png", "svg"))


def batched(values: dict[str, float | None], trace: str = "sharegpt-paper") -> list[Row]:
    return [Row("fig13", e, trace, "mean_batched_requests", v) for e, v in values.items()]


def test_figure_13s_verdict_reads_paged_over_oracle_and_says_why_it_cannot():
    both = {"orca-max": 7.0, "orca-pow2": 9.8, "orca-oracle": 13.6, "paged": 30.4}
    alpaca = batched(
        {"orca-max": 7.0, "orca-pow2": 43.2, "orca-oracle": 72.8, "paged": 132.4}, "alpaca-paper"
    )
    verdict = fig13_verdict(batched(both) + alpaca, QUICK)
    assert (
        verdict.startswith("matches: ")
        and "sharegpt-paper mean batched requests, busy-weighted, paged/orca-oracle" in verdict
    )
    assert "alpaca-paper paged mean batched requests, busy-weighted" in verdict and "differs" not in verdict
    blank = fig13_verdict(batched({**both, "paged": math.nan}) + alpaca, QUICK)
    pair = "sharegpt-paper mean batched requests, busy-weighted, paged/orca-oracle"
    assert f"not measured: {pair}: no measurement: a run finished without a value" in blank
    assert "a run did not finish" not in blank
    assert (
        "sharegpt-paper paged mean batched requests, busy-weighted: no measurement: the run finished" in blank
    )
    oracle = fig13_verdict(batched({**both, "orca-oracle": math.nan}) + alpaca, QUICK)
    assert f"not measured: {pair}: no measurement: a run finished without a value" in oracle
    gone = fig13_verdict(batched({e: v for e, v in both.items() if e != "orca-oracle"}) + alpaca, QUICK)
    assert gone.startswith(f"differs: differs: {pair}: no measurement: a run did not finish; ")
    assert "a run finished without a value" not in gone
