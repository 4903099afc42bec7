"""Generated blocks inside hand-written docs: the numbers docs/REPRODUCTION.md states about the
committed reproductions, read from their folders, and its table of real-run settings, read
from `kvbench.reproduce.run.GPU_SETTINGS`; the measured tables of the other docs (HYBRID.md, ...),
each read from its results folder (the machine-readable files where the folder has them, else the
rows of the `table.md` its benchmark wrote).

A block sits between `<!-- generated: NAME ... -->` and `<!-- end generated: NAME -->` lines;
`tools/results_pages.py` rewrites what lies between them (and `--check` fails where it differs),
the prose around them stays hand-written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import results_pages_common as common
from results_pages_common import REGENERATE, aligned_table, fixed, markdown_tables, mean_of, num, table
from results_pages_figures import REPRODUCTIONS, figure_rows

START = "<!-- generated: {name} by `" + REGENERATE + "`; do not edit -->"
END = "<!-- end generated: {name} -->"


def settings_table() -> str:
    """The real runs' settings: model, KV budget, the token slots it holds, the rate scale."""
    from kvbench.budget import budget_from_gib
    from kvbench.config import resolve_model
    from kvbench.reproduce.run import FULL_GPU_MODEL, GPU_SETTINGS, QUICK_GPU_MODEL

    when = {QUICK_GPU_MODEL: "`--quick`'s default", FULL_GPU_MODEL: "the default without `--quick`"}
    rows = []
    for name, s in GPU_SETTINGS.items():
        slots = budget_from_gib(s.kv_cache_gib, resolve_model(s.model)).num_slots
        rate = f"the paper's x {s.rate_scale:.3g}"
        rows.append(
            [f"`{name}`", f"{s.kv_cache_gib:g} GiB", f"{slots:,}", rate, when.get(name, "`--model` only")]
        )
    return table(["`--model`", "KV", "token slots", "rates", "when"], rows)


def _first(folder: Path, figure: str, name: str) -> pd.DataFrame | None:
    """A sweep file of a figure: today's `<sweep>/` or the first seed's `seed-<s>/<sweep>/`."""
    base = common.ROOT / folder / figure
    paths = sorted(base.glob(name)) + sorted(base.glob(f"seed-*/{name}"))
    return pd.read_csv(paths[0]) if paths else None


def static_brackets() -> str:
    """Where static's ShareGPT sustained rate lies in each real run (its bracket)."""
    parts = []
    for label, folder in REPRODUCTIONS:
        frame = _first(folder, "fig12", "sharegpt-paper/sustained.csv")
        cells = _first(folder, "fig12", "sharegpt-paper/sweep.csv")
        if (
            not label.startswith("real")
            or frame is None
            or cells is None
            or "static" not in set(frame.engine)
        ):
            continue
        row = frame[frame.engine == "static"].iloc[0]
        lowest = cells[(cells.engine == "static") & (cells.role != "baseline")].rate.min()
        if pd.isna(row.last_pass_rate):
            parts.append(
                f"{label}: over the bound from the lowest rate tried, {num(row.first_fail_rate)} req/s"
            )
            continue
        fail = "no rate tried" if pd.isna(row.first_fail_rate) else f"{num(row.first_fail_rate)} req/s"
        at = " (the lowest rate tried)" if lowest == row.last_pass_rate else ""
        parts.append(f"{label}: under the bound up to {num(row.last_pass_rate)} req/s{at}, over at {fail}")
    return "Static's ShareGPT sustained rate (Figure 12's brackets): " + "; ".join(parts) + "."


def near_best_block_sizes() -> str:
    """Each run's block sizes within 5 % of its best, by name (a range would hide gaps)."""
    parts = []
    for label, folder in REPRODUCTIONS:
        frame = figure_rows(folder, "fig18b")
        if frame is None:
            continue
        latency = frame[frame.metric.str.startswith("normalized_latency_s@bs")]
        for workload, group in latency.groupby("workload", sort=False):
            best = group.kvbench.min()
            sizes = group.metric.str.removeprefix("normalized_latency_s@bs").astype(int)
            above = {bs: 100 * (v / best - 1) for bs, v in zip(sizes, group.kvbench, strict=True)}
            near = ", ".join(f"{bs} ({a:+.1f} %)" for bs, a in above.items() if a <= 5.0)
            far = ", ".join(f"{bs} ({a:+.1f} %)" for bs, a in above.items() if a > 5.0) or "-"
            parts.append(f"- {label}, {workload}: within 5 % of the best: {near}; beyond: {far}")
    return "Block sizes within 5 % of the best (Figure 18b, normalized latency):\n\n" + "\n".join(parts)


HYBRID_SIM = Path("results/reference/hybrid-occupancy-sim")
HYBRID_REAL = Path("results/reference/hybrid-real")
HYBRID_ENGINES = ("paged", "hybrid", "jenga")


def joined(cells: Sequence[str]) -> str:
    """Several engines' cells in one: the one value where they agree, else each, `a / b`."""
    return cells[0] if len(set(cells)) == 1 else " / ".join(cells)


def spread(cells: Sequence[str]) -> str:
    """Several engines' cells in one, as their range `lo-hi`."""
    ordered = sorted(cells, key=float)
    return ordered[0] if ordered[0] == ordered[-1] else f"{ordered[0]}-{ordered[-1]}"


def engine_rows(
    frame: pd.DataFrame, label: str, groups: Sequence[Sequence[str]], columns: dict[str, Callable]
) -> list[list[str]]:
    """One row per group of engines: `label`, the engines, each column's cells joined its way."""
    by_engine = frame.set_index("engine")
    return [
        [
            label,
            " / ".join(group),
            *(join([by_engine.at[e, c] for e in group]) for c, join in columns.items()),
        ]
        for group in groups
    ]


def hybrid_sim_table() -> str:
    """docs/HYBRID.md's simulated table: both of the benchmark's runs, means over seeds."""
    seeds = markdown_tables(HYBRID_SIM / "table.md")[0]
    seeds["trace"] = seeds.pop("trace (req/s)").str.replace(")", " req/s)")
    long = markdown_tables(HYBRID_SIM / "table-long.md")[0]
    gib = re.search(r"([\d.]+) GiB of KV", (common.ROOT / HYBRID_SIM / "table-long.md").read_text())
    columns = {"batched req.": joined, "req/s": joined, "behind window %": joined}
    rows = []
    for trace, group in seeds.groupby("trace", sort=False):
        frame = group.map(mean_of)
        if trace.startswith("sharegpt"):
            rows += engine_rows(frame, trace, [HYBRID_ENGINES], {**columns, "req/s": spread})
        else:
            rows += engine_rows(frame, trace, [[e] for e in frame.engine], columns)
    rows.sort(key=lambda row: not row[0].startswith("arxiv"))  # long prompts first: the point
    label = f"mooncake-conv, whole, {float(gib.group(1)):.1f} GiB (`--long`)"
    rows += engine_rows(long, label, [[*HYBRID_ENGINES, "orca-oracle"]], columns)
    return table(["trace", "engine", "batched req.", "req/s", "`outside_window` % (busy)"], rows)


def hybrid_real_table() -> str:
    """docs/HYBRID.md's H200 table: the real cells' means, the throughput paired by seed."""
    cells, paired = markdown_tables(HYBRID_REAL / "table.md")[:2]
    frame = cells.loc[:, ~cells.columns.duplicated()].map(mean_of)  # the real columns, not `sim`
    frame["runs"] = frame.runs.replace("1 (one run)", "one run")
    ratio = {(t, e): r for t, e, r in zip(paired.trace, paired.engine, paired["req/s"], strict=True)}
    frame["over paged"] = [
        "1" if e == "paged" else ratio[(t.split(" (")[0], e)]
        for t, e in zip(frame.trace, frame.engine, strict=True)
    ]
    columns = dict.fromkeys(["runs", "batched req. (sat.)", "token states % (sat.)", "over paged"], joined)
    rows = []
    for trace, group in frame.groupby("trace", sort=False):
        groups = [[e] for e in HYBRID_ENGINES] if trace.startswith("arxiv") else [HYBRID_ENGINES]
        rows = engine_rows(group, trace, groups, columns) + rows  # long prompts first
    header = ["trace", "engine", "runs", "batched req. (saturated)", "token states % (saturated)"]
    return table([*header, "req/s, over paged (paired by seed)"], rows)


CALIBRATION_OBJECTIVE = Path("results/reference/calibration-objective")


def objective_table() -> str:
    """docs/CALIBRATION.md's objectives: each fit's loaded held-out runs within the target."""
    from kvbench.calibrate.check import TARGET

    fits = common.json_file(CALIBRATION_OBJECTIVE / "objectives.json")
    names = {"relative": "relative (before)", "absolute": "absolute", "mean": "**mean** (default)"}
    metrics = ("normalized_latency_s", "mean_ttft_s", "output_token_throughput")
    rows = []
    for objective, name in names.items():
        cells = []
        for metric in metrics:
            errors = [
                abs(r["error"]) for r in fits[objective]["held_out"] if r["metric"] == metric and r["loaded"]
            ]
            within = sum(error <= TARGET for error in errors)
            cells.append(f"{within} of {len(errors)} ({100 * max(errors):.1f} %)")
        rows.append([name, *cells])
    header = [
        "objective",
        f"normalized latency within {100 * TARGET:g} % (largest error)",
        "mean TTFT",
        "throughput",
    ]
    return aligned_table(header, rows, "lrrr")


SHARING_REAL = Path("results/reproduce/quick-real-opt-1.3b")


def sharing_figures_table() -> str:
    """docs/SHARING.md's H200 table: Figures 14-17 of the real OPT-1.3B reproduction."""
    figures = {f: figure_rows(SHARING_REAL, f) for f in ("fig14", "fig15", "fig16", "fig17")}

    def ratio(value) -> str:
        return "-" if pd.isna(value) else f"{value:.2f}x"

    def saved(workload: str, column: str) -> str:
        frame = figures["fig15"]
        rows = frame[(frame.workload == workload) & frame.metric.str.startswith("saved_%@")].set_index(
            "metric"
        )
        widths = [[f"saved_%@{p}{w}" for w in (2, 4, 6)] for p in "nk"]
        return "; ".join("/".join(fixed(rows.at[m, column], 1) for m in ws) for ws in widths)

    def capacity(figure: str, engine: str = "paged/orca-oracle") -> pd.DataFrame:
        frame = figures[figure]
        return frame[(frame.metric == "capacity_ratio") & (frame.engine == engine)]

    def width(workload: str) -> str:  # `alpaca-paper k=6`: the width as the table writes it
        return workload.split()[-1].replace("=", " = ")

    fig14, fig16, fig17 = capacity("fig14"), capacity("fig16", "paged-prefix/orca-oracle"), capacity("fig17")
    shots = [w.split("-")[-1] + "-shot" for w in fig16.workload]
    reuse = capacity("fig17", "paged-prefix/paged").kvbench.iloc[0]
    rows = [
        [
            "15, Alpaca, saved % (n = 2/4/6; k = 2/4/6)",
            saved("alpaca-paper", "paper"),
            saved("alpaca-paper", "kvbench"),
        ],
        [
            "15, ShareGPT, saved % (n = 2/4/6; k = 2/4/6)",
            saved("sharegpt-paper", "paper"),
            saved("sharegpt-paper", "kvbench"),
        ],
        [
            "14, capacity paged / Orca (Oracle), Alpaca",
            ", ".join(
                f"{p:g}x at {width(w)}"
                for w, p in zip(fig14.workload, fig14.paper, strict=True)
                if not pd.isna(p)
            ),
            ", ".join(
                f"{ratio(v)} at {width(w)}" for w, v in zip(fig14.workload, fig14.kvbench, strict=True)
            ),
        ],
        [
            "16, capacity paged-prefix / Orca (Oracle)",
            ", ".join(f"{p:g}x ({s})" for s, p in zip(shots, fig16.paper, strict=True)),
            ", ".join(map(ratio, fig16.kvbench)),
        ],
        [
            "17, capacity paged / Orca (Oracle), chat",
            f"{fig17.paper.iloc[0]:g}x (text), ~1.5x (figure)",  # the figure's bars, read by eye
            f"{ratio(fig17.kvbench.iloc[0])}; reusing the last turn's blocks {100 * (reuse - 1):+.0f} %",
        ],
    ]
    return table(["figure", "paper", "H200"], rows)


REPLAYED = Path("results/reference/fig12-alpaca-prefill-graphs-baselines")


def replayed_panel_table() -> str:
    """Figure 12's Alpaca panel with replayed prefills, paged over each engine seed by seed and
    its verdict, read from the rows the folder's compare.py wrote (its comparison.md)."""
    ratios = markdown_tables(REPLAYED / "comparison.md")[1]
    seeds = [c for c in ratios.columns if c.startswith("seed ")]
    rows = []
    for _, row in ratios.iterrows():
        verdict, measured = row["verdict"], "-"
        if "kvbench " in verdict:  # "<outcome>: <metric>, <basis>: kvbench <interval> (+-15%: ..."
            measured = verdict.split("kvbench ")[1].split(" (+-")[0]
            basis = "one run" if "one run" in verdict else verdict.split("last passes, ")[1].split(":")[0]
            verdict = f"{verdict.split(':')[0]} ({basis})"
        rows.append([row["paged over"], row["paper"], *(row[s] for s in seeds), measured, verdict])
    folder = REPLAYED.as_posix()
    return (
        table(["paged over", "paper", *seeds, "kvbench", "verdict (the paper's ratio in it +-15 %)"], rows)
        + f"\n\nFrom [{folder}](../{folder}/comparison.md), written by its `compare.py` from the H200 "
        "cells; a seed not yet run reads `-`."
    )


TEST_REPEATS = Path("results/reference/test-repeats")


def test_repeats_sentence() -> str:
    """docs/TESTING.md's repeats of every timing-sensitive selection at once, from runs.csv."""
    runs = common.csv(TEST_REPEATS / "runs.csv")
    folder, parts, lanes = TEST_REPEATS.as_posix(), [], []
    for loaded, group in runs.groupby("loaded"):
        state = "loaded" if loaded else "idle"
        lanes.append(f"{group.lane.nunique()} " + ("beside two busy loops each" if loaded else "idle"))
        seconds = f"{group.seconds.min():.0f}-{group.seconds.max():.0f} s a run"
        parts.append(f"{state} {int(group.ok.sum())}/{len(group)} green ({seconds})")
    return (
        "Every selection of `tools/repeat_tests.py` together (one run = six pytest processes, the "
        'selections above plus `test_stats.py -m "not slow"` and `test_tensor_parallel.py`), on 2-core '
        f"lanes of a 16-core host, {' and '.join(lanes)}, at once: {', '.join(parts)} "
        f"([{folder}](../{folder}/README.md): `runs.csv`, command and commit)."
    )


BLOCKS: dict[str, dict[str, Callable[[], str]]] = {
    "docs/REPRODUCTION.md": {
        "real-settings": settings_table,
        "static-brackets": static_brackets,
        "near-best-block-sizes": near_best_block_sizes,
        "replayed-alpaca-panel": replayed_panel_table,
    },
    "docs/CALIBRATION.md": {"objective-table": objective_table},
    "docs/SHARING.md": {"h200-figures": sharing_figures_table},
    "docs/TESTING.md": {"test-repeats": test_repeats_sentence},
    "docs/HYBRID.md": {"simulated-table": hybrid_sim_table, "h200-table": hybrid_real_table},
}


def fill(text: str, blocks: dict[str, Callable[[], str]], path: str) -> str:
    """`text` with every named block's body regenerated; a block missing from it: an error."""
    for name, build in blocks.items():
        start, end = START.format(name=name), END.format(name=name)
        pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no generated block {name!r} (lines {start} ... {end})")
        body = f"{start}\n{build().rstrip()}\n{end}"
        text = pattern.sub(lambda _match, body=body: body, text)
    return text


def render_docs() -> dict[str, str]:
    """Every doc holding generated blocks, as it should read, by repository path."""
    return {
        path: fill((common.ROOT / path).read_text(encoding="utf-8"), blocks, path)
        for path, blocks in BLOCKS.items()
    }
