"""Fits of the OPT-13B cost model, held out on the same real runs, side by side.

    PYTHONPATH=. python results/reference/opt-13b-calibration-by-seed/compare.py

Writes comparison.md beside this script from three `kvbench calibrate` files: the reproduction's
own (results/reproduce/opt-13b-h200/calibration/cost.json, fitted on Figure 2's seed-0 runs,
ShareGPT alone), this folder's (cost.json, fitted on seed 0 of Figures 2, 12 and 13, both
traces) and the same runs fitted by engine (cost-by-engine.json, `--by-engine`: each engine's
runs alone, its held-out runs priced with its own fit). Each file holds its held-out checks; only
the runs all hold out are compared (seeds 1 and 2 of Figures 12 and 13), so the columns judge
the same runs. Per trace and load (a run where a queue formed, apart from one that never
queued), per metric: how many runs each fit puts within 10 % of the real run, and the median and
largest error. Then the loaded runs' normalized-latency errors engine by engine, signed
(simulated over real, less 1), which says whether one constant could close them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from kvbench.calibrate.check import LOADS, TARGET
from kvbench.results.files import read_json, write_text

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
REPRODUCTION = "results/reproduce/opt-13b-h200"
FITS = {
    "Figure 2, seed 0 (ShareGPT)": ROOT / REPRODUCTION / "calibration" / "cost.json",
    "Figures 2, 12, 13, seed 0 (both traces)": HERE / "cost.json",
    "the same runs, fitted by engine (--by-engine)": HERE / "cost-by-engine.json",
}
TRACES = ("sharegpt-paper", "alpaca-paper")
METRICS = ("output_token_throughput", "normalized_latency_s", "mean_ttft_s")


def checks(path: Path) -> dict[tuple[str, str], dict]:
    """{(run relative to the reproduction, metric): check} of a cost file's held-out rows."""
    prefix = f"{REPRODUCTION}/"
    return {(c["run"].removeprefix(prefix), c["metric"]): c for c in read_json(path)["held_out"]}


def _trace(run: str) -> str:
    return next(t for t in TRACES if t in run)


def _cell(errors: list[float]) -> str:
    within = sum(abs(e) <= TARGET for e in errors)
    magnitudes = [abs(e) for e in errors]
    return f"{within} | {_percent(statistics.median(magnitudes))} | {_percent(max(magnitudes))}"


def _percent(fraction: float, sign: str = "") -> str:
    return f"{fraction * 100:{sign}.1f} %"


def render(fits: dict[str, Path] = FITS) -> str:
    by_fit = {label: checks(path) for label, path in fits.items()}
    common = sorted(set.intersection(*(set(c) for c in by_fit.values())))
    labels = list(by_fit)
    lines = [
        "# Fits of the OPT-13B cost model on the same held-out runs",
        "",
        f"Written by `PYTHONPATH=. python results/reference/opt-13b-calibration-by-seed/compare.py` from "
        f"the cost files; do not edit by hand. {len(common) // len(METRICS)} runs held out by all "
        f"(seeds 1 and 2 of Figures 12 and 13). Within: the runs whose simulation is within "
        f"{_percent(TARGET)} of the real run; median and largest: the absolute error. Fits: "
        + "; ".join(f"({i}) {f}" for i, f in enumerate(labels, 1))
        + ".",
        "",
        "| trace | load | metric | runs | "
        + " | ".join(f"({i}) within | ({i}) median | ({i}) largest" for i in range(1, len(labels) + 1))
        + " |",
        "|---|---|---|---:|" + "---:|" * 3 * len(labels),
    ]
    for load in LOADS:
        for trace in TRACES:
            for metric in METRICS:
                keys = [
                    k
                    for k in common
                    if k[1] == metric
                    and _trace(k[0]) == trace
                    and LOADS[not by_fit[labels[0]][k]["loaded"]] == load
                ]
                if keys:
                    cells = " | ".join(_cell([by_fit[f][k]["error"] for k in keys]) for f in labels)
                    lines.append(f"| {trace} | {load} | {metric} | {len(keys)} | {cells} |")
    lines += ["", "Loaded runs' normalized latency, error by engine (simulated / real - 1), each fit:", ""]
    lines += ["| trace | engine | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for trace in TRACES:
        engines = sorted({by_fit[labels[0]][k]["engine"] for k in common if _trace(k[0]) == trace})
        for engine in engines:
            keys = [
                k
                for k in common
                if k[1] == "normalized_latency_s"
                and _trace(k[0]) == trace
                and by_fit[labels[0]][k]["engine"] == engine
                and by_fit[labels[0]][k]["loaded"]
            ]
            if keys:
                cells = " | ".join(
                    ", ".join(f"{by_fit[f][k]['error'] * 100:+.0f} %" for k in keys) for f in labels
                )
                lines.append(f"| {trace} | {engine} | {cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_text(HERE / "comparison.md", render())
    print(HERE / "comparison.md")
