"""The OPT-13B cost model on replayed prefills with and without a decode knee.

    PYTHONPATH=. python results/reference/calibration-knee-gain/compare.py

Writes comparison.md beside this script from three `kvbench calibrate` files fitted on the same
runs (seed 0 of results/reference/fig12-alpaca-prefill-graphs: paged and orca-oracle, Alpaca,
OPT-13B, 15,728 slots, short prefills replayed as CUDA graphs) and holding out the same runs
(its seeds 1 and 2): one fit of both engines under the earlier knee rule (a knee kept only if it
halves the linear fit's error: no knee here), the same under `--knee-gain 0.9` (this folder's
`cost.json`: a knee kept if it cuts the error by a tenth, the default since), and the fit by engine
(results/reference/calibration-by-engine). Three tables:

- the fits' shapes: fixed step cost, per decode row below and past the knee, the knee;
- held-out runs within 10 % of the real run, loaded and unloaded apart, per metric;
- the engines none of the fits saw (static, Orca-Max and Orca-Pow2 on the same panel, seed 0:
  results/reference/fig12-alpaca-prefill-graphs-baselines): their decode steps priced by each
  fit's constants for an engine without runs of its own (the top level), over measured time.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from kvbench.calibrate.check import LOADS, TARGET
from kvbench.calibrate.fit import priced_over_measured, read_rows
from kvbench.results.files import read_json, write_text

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
BY_ENGINE = ROOT / "results" / "reference" / "calibration-by-engine"
FITS = {
    "one fit, rule 0.5 (no knee)": BY_ENGINE / "pooled.json",
    "one fit, rule 0.9 (the default since)": HERE / "cost.json",
    "by engine, rule 0.5": BY_ENGINE / "cost.json",
}
METRICS = ("output_token_throughput", "normalized_latency_s", "mean_ttft_s")
UNSEEN = ROOT / "results" / "reference" / "fig12-alpaca-prefill-graphs-baselines"
UNSEEN_ENGINES = ("static", "orca-max", "orca-pow2")


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.1f} %"


def shape_lines(files: dict[str, dict]) -> list[str]:
    lines = [
        "| fit | knee rule | fixed ms | us / decode row | us more / row past the knee | knee (rows) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, data in files.items():
        knee = data["knee_batch"]
        lines.append(
            f"| {label} | {data.get('knee_gain', 0.5):g} | {1e3 * data['fixed_s']:.3f} | "
            f"{1e6 * data['per_token_s']:.2f} | {1e6 * (data['per_row_above_knee_s'] or 0):.2f} | "
            f"{knee if knee is not None else '-'} |"
        )
    return lines


def held_out_lines(files: dict[str, dict]) -> list[str]:
    labels = list(files)
    lines = [
        "| load | metric | " + " | ".join(f"{label}: within | largest" for label in labels) + " |",
        "|---|---|" + "---:|---:|" * len(labels),
    ]
    for load in LOADS:
        for metric in METRICS:
            cells = []
            for data in files.values():  # the file's own summary of its held-out checks
                got = data["held_out_summary"][metric][load]
                cells.append(f"{got['within_target']} of {got['runs']} | {_percent(got['max_abs_error'])}")
            lines.append(f"| {load} | {metric} | {' | '.join(cells)} |")
    return lines


def unseen_lines(files: dict[str, dict]) -> list[str]:
    """Each unseen engine's decode rows over its seed-0 cells, priced by each fit's top level."""
    labels = list(files)
    lines = ["| engine | cells | " + " | ".join(labels) + " |", "|---|---:|" + "---:|" * len(labels)]
    for engine in UNSEEN_ENGINES:
        cells = sorted((UNSEEN / engine / "cells").iterdir())
        ratios = {label: [] for label in labels}
        for cell in cells:
            rows = read_rows(cell)
            for label, data in files.items():
                ratios[label].append(priced_over_measured(rows, data)["decode"])
        shown = [f"{min(v):.3f}-{max(v):.3f} (median {statistics.median(v):.3f})" for v in ratios.values()]
        lines.append(f"| {engine} | {len(cells)} | {' | '.join(shown)} |")
    return lines


def render() -> str:
    files = {label: read_json(path) for label, path in FITS.items()}
    runs = {len(data["held_out"]) // len(METRICS) for data in files.values()}
    return "\n".join([
        "# OPT-13B, replayed prefills: one fit with a decode knee, one without, and a fit by engine",
        "",
        f"Written by `compare.py` from {', '.join(f'`{p.relative_to(ROOT)}`' for p in FITS.values())} "
        f"(fitted on the same seed-0 runs, holding out the same {runs.pop()} runs of seeds 1 and 2); "
        f"within {_percent(TARGET)} of the real run.",
        "",
        "## The fits' decode steps",
        "",
        "Each file's top level (for the fit by engine, the fit of both engines' runs, which prices an "
        "engine without runs of its own; its engines' own fits have no knee under either rule):",
        "",
        *shape_lines(files),
        "",
        "## Held out",
        "",
        *held_out_lines(files),
        "",
        "## Engines no fit saw: their decode steps priced over measured time",
        "",
        "Seed 0's cells of the same panel, each fit's constants for an engine without runs of its "
        "own (its top level):",
        "",
        *unseen_lines(files),
        "",
    ])  # fmt: skip


if __name__ == "__main__":
    write_text(HERE / "comparison.md", render())
    print(f"wrote {HERE / 'comparison.md'}")
