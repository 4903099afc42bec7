"""Figure 12's panels as they stand, written from the committed runs rather than by hand.

    PYTHONPATH=. python results/reproduce/opt-13b-h200/fig12_panels.py

Writes fig12/panels.md: for every seed's current panel (`fig12/seed-<s>/<trace>/`; the panels set
aside in `earlier/` are left out, their tables stay in README.md) the shared bound and where it
comes from, the kvbench commits its runs ran at (env.json), the runs' wall time (sweep.csv), each
loaded run's row, and each engine's bracket; then, per trace, paged's ratio to every other engine
as an interval for each seed whose two engines are both bracketed, beside the paper's digitized
ratio (`kvbench/paper.py`). The figure's means, intervals and verdicts over the seeds are
`reproduce` 's own (fig12/figure.json, written when every panel is done); this page is the
progress between device sessions, so a README quoting it cannot drift from the files. A second
on a CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvbench.paper import FIG12_SUSTAINED
from kvbench.results.files import write_text
from kvbench.results.load import load_sweep
from kvbench.sweep.stats import ratio_interval, sustained_rate
from kvbench.sweep.sustained import shared_bound

HERE = Path(__file__).resolve().parent
TRACES = {"sharegpt-paper": "ShareGPT", "alpaca-paper": "Alpaca"}
ENGINES = ("static", "orca-max", "orca-pow2", "orca-oracle", "paged")
ROW_HEADER = (
    "| engine | rate req/s | requests | norm. latency s/token | vs bound | mean TPOT s | mean queueing s "
    "| batched requests, busy-weighted | preemptions | completed req/s |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def panels(root: Path, trace: str) -> list[tuple[int, Path]]:
    """(seed, folder) of every current panel of `trace` under `root` that has run a cell."""
    found = []
    for folder in sorted((root / "fig12").glob(f"seed-*/{trace}")):
        if (folder / "sweep.csv").is_file():
            found.append((int(folder.parent.name.removeprefix("seed-")), folder))
    return sorted(found)


def commits(folder: Path) -> str:
    """'d368405 (15 runs)': the commits the panel's runs recorded, with how many ran at each."""
    counts: dict[str, int] = {}
    for env in sorted((folder / "cells").glob("*/env.json")):
        sha = json.loads(env.read_text())["git_sha"][:7]
        counts[sha] = counts.get(sha, 0) + 1
    return ", ".join(f"{sha} ({n} run{'s' * (n != 1)})" for sha, n in sorted(counts.items()))


def brackets(folder: Path) -> dict[str, tuple[float, float]]:
    """Each engine's (last pass, first fail) where both are measured: sustained.csv's once the
    sweep wrote it, else judged here from its finished loaded runs by the sweep's own rule."""
    sweep = load_sweep(folder)
    found = {}
    if len(sweep.sustained):
        for row in sweep.sustained.to_dict("records"):
            low, high = row.get("last_pass_rate", math.nan), row.get("first_fail_rate", math.nan)
            if low == low and high == high:
                found[row["engine"]] = (float(low), float(high))
        return found
    done = finished(sweep)
    bound, _ = _bound(folder, done)
    loaded = done[done.role != "baseline"]
    for engine in ENGINES if bound == bound else ():
        rows = loaded[loaded.engine == engine]
        verdict = sustained_rate(list(zip(rows.rate, rows.normalized_latency_s, strict=True)), bound)
        if verdict.last_pass is not None and verdict.first_fail is not None:
            found[engine] = (verdict.last_pass, verdict.first_fail)
    return found


def finished(sweep):
    """sweep.csv's finished rows whose run is here: a run set aside (moved to `earlier/`) keeps its
    row until the sweep runs it again."""
    here = {folder.name for folder in sweep.folders}
    return sweep.cells[(sweep.cells.status == "ok") & sweep.cells.cell_id.isin(here)]


def panel_text(seed: int, folder: Path) -> list[str]:
    sweep = load_sweep(folder)
    cells = sweep.cells
    done = finished(sweep)
    gone = int((cells.status == "ok").sum()) - len(done)
    loaded = done[done.role != "baseline"]
    lines = [f"### {TRACES[folder.name]}, seed {seed}", ""]
    bound, source = _bound(folder, done)
    known = bound == bound
    lines.append(f"Bound **{bound:.4f} s/token**: {source}." if known else f"No bound yet: {source}.")
    baselines, pending = len(done) - len(loaded), int((cells.status == "pending").sum())
    lines += [
        f"Runs: {baselines} baselines and {len(loaded)} loaded runs, {done.wall_s.sum():,.0f} s of wall time "
        f"(model loads not included); kvbench at {commits(folder) or 'no run yet'}."
        + (f" {pending} placed runs not run yet (the sweep steps past a pair that misses)." * (pending > 0))
        + (
            f" {gone} finished in sweep.csv but set aside (moved to `earlier/`): they run again, and the"
            " bound and brackets here are the sweep's from before they were set aside." * (gone > 0)
        ),
        "",
    ]
    if len(loaded):
        lines.append(ROW_HEADER)
        for row in loaded.sort_values(["engine", "rate"], key=_engine_order).to_dict("records"):
            latency = row["normalized_latency_s"]
            verdict = "" if bound != bound else ("pass" if latency < bound else "fail")
            values = [
                row["engine"], f"{row['rate']:.4g}", f"{row['num_requests']:.0f}", f"{latency:.4f}", verdict,
                f"{row['mean_tpot_s']:.4f}", f"{row['mean_queueing_s']:.3f}",
                f"{row['mean_batched_requests']:.1f}",
                f"{row['num_preemptions']:.0f}", f"{row['request_throughput']:.2f}",
            ]  # fmt: skip
            lines.append("| " + " | ".join(values) + " |")
        lines.append("")
    found = brackets(folder)
    open_ = [e for e in ENGINES if e not in found]
    if found:
        lines.append(
            "Bracketed (last pass, first fail): "
            + ", ".join(f"{e} {found[e][0]:.4g}/{found[e][1]:.4g}" for e in ENGINES if e in found)
            + (f"; not yet: {', '.join(open_)}." if open_ else "; every engine bracketed.")
        )
    else:
        lines.append("No engine bracketed yet.")
    return [*lines, ""]


def _bound(folder: Path, done) -> tuple[float, str]:
    """The panel's shared bound and where it comes from: sustained.csv's once the sweep wrote it,
    else the sweep's multiple of its lowest unloaded baseline, once every engine's has run."""
    sustained = load_sweep(folder).sustained
    if len(sustained):
        return float(sustained.latency_threshold_s.iloc[0]), str(sustained.threshold_source.iloc[0])
    multiple = json.loads((folder / "sweep.json").read_text())["sustained"]["multiple"]
    baselines = done[done.role == "baseline"]
    if set(baselines.engine) != set(ENGINES):
        return math.nan, "the unloaded baselines have not all run"
    bound, source = shared_bound(baselines.to_dict("records"), multiple)
    return bound, f"{source} (sustained.csv not written yet)"


def _engine_order(column):
    """Sort key: engines in the figure's order, rates as numbers."""
    return column.map(ENGINES.index) if column.name == "engine" else column


def ratios_text(trace: str, seeds: list[tuple[int, Path]]) -> list[str]:
    """paged over every other engine, one interval per seed where both are bracketed."""
    paper = FIG12_SUSTAINED[trace]
    header = "| " + TRACES[trace] + " | " + " | ".join(f"seed {s}" for s, _ in seeds) + " | paper |"
    lines = [header, "|---" * (len(seeds) + 2) + "|"]
    per_seed = [brackets(folder) for _, folder in seeds]
    for other in ENGINES[:-1]:
        cells = []
        for found in per_seed:
            if "paged" in found and other in found:
                low, high = ratio_interval(found["paged"], found[other])
                cells.append(f"[{low:.3g}, {high:.3g}]")
            else:
                cells.append("not yet")
        ratio = paper["paged"] / paper[other]
        lines.append(f"| paged / {other} | " + " | ".join(cells) + f" | {ratio:.3g} |")
    return [*lines, ""]


def render(root: Path = HERE) -> str:
    """panels.md's text for the reproduction folder `root` (this script's own by default)."""
    lines = [
        "# Figure 12 at OPT-13B: the panels as they stand",
        "",
        "Written by `PYTHONPATH=. python results/reproduce/opt-13b-h200/fig12_panels.py` from the committed",
        "runs (sweep.csv, sustained.csv, each run's env.json); do not edit by hand. A ratio of two",
        "brackets is an interval: [paged's pass / the other's fail, paged's fail / the other's pass].",
        "The paper's ratios are of its digitized sustained rates at 0.5 s/token on the A100.",
        "",
    ]
    for trace in TRACES:
        seeds = panels(root, trace)
        lines += [f"## {TRACES[trace]}", ""]
        for seed, folder in seeds:
            lines += panel_text(seed, folder)
        if seeds:
            lines += ratios_text(trace, seeds)
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    text = render()
    write_text(HERE / "fig12" / "panels.md", text)
    print(text)


if __name__ == "__main__":
    main()
