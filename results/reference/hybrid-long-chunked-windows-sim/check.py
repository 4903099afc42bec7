"""The reading of the chunked long-context windows' real runs against this folder's prediction,
written before they ran: `tools/device_call.sh hybrid-long-chunked-windows` writes them into
results/reference/hybrid-long-chunked-windows-real/w<start>/.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. \
        python results/reference/hybrid-long-chunked-windows-sim/check.py

Prints: (1) each window's cells (`w<start>/` of the real folder, and the first window's
warmed-up run, results/reference/hybrid-long-chunked-warm-real), each metric real against
predicted with the error, and the reading rule of the prediction's README: a prediction holds
where its error against the real value (predicted / real - 1) is at most 10 % either way
(completed req/s, mean TTFT, mean TPOT); (2) the
engines against paged and hybrid against jenga, real and predicted, window by window; (3) each
cell's steps priced by the fitted costs the prediction used: median and 90th percentile of
the absolute step error, and the sums' ratio (measured over priced), mixed and decode-only
steps apart. A cell not run yet is left out and said so. Every number is read from the cells'
summary.json and steps.csv and from prediction.json.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import numpy as np

from kvbench.results.load import Run, load_run

SIM = Path(__file__).resolve().parent
REAL = SIM.parent / "hybrid-long-chunked-windows-real"
FIRST = SIM.parent / "hybrid-long-chunked-warm-real"  # the window the costs were fitted on
PRICED = runpy.run_path(str(SIM.parent / "hybrid-long-chunked-real" / "make.py"))["priced"]
ENGINES = ("paged", "hybrid", "jenga")
JUDGED = ("request_throughput", "mean_ttft_s", "mean_tpot_s")
TOLERANCE = 0.10  # the calibration target (docs/CALIBRATION.md), fixed before the runs


def cells(folder: Path) -> dict[str, Run]:
    """The engines run in `folder` (a cut run leaves some out)."""
    found = {
        run.engine: run
        for run in map(load_run, sorted(p.parent for p in folder.glob("cells/*/summary.json")))
    }
    return {engine: found[engine] for engine in ENGINES if engine in found}


def windows() -> list[tuple[dict, dict[str, Run]]]:
    """(predicted row, real cells) per predicted window, in the prediction's order."""
    prediction = json.loads((SIM / "prediction.json").read_text(encoding="utf-8"))
    out = []
    for row in prediction["windows"]:
        start = row["window_start_s"]
        out.append((row, cells(FIRST if start == 0 else REAL / f"w{start}")))
    return out


def error(real: float, predicted: float) -> float:
    """Signed relative error of the prediction against the real value."""
    return predicted / real - 1


def holds(real: float, predicted: float) -> bool:
    """Within the tolerance of what the GPU measured (docs/CALIBRATION.md's error)."""
    return abs(error(real, predicted)) <= TOLERANCE + 1e-12  # exactly 10 % is within, whatever the rounding


def metric_table(found: list[tuple[dict, dict[str, Run]]]) -> tuple[list[str], dict[str, int]]:
    names = {"request_throughput": "req/s", "mean_ttft_s": "mean TTFT s", "mean_tpot_s": "mean TPOT s"}
    digits = {"request_throughput": 3, "mean_ttft_s": 1, "mean_tpot_s": 3}
    lines = [
        "| window s | engine | "
        + " | ".join(f"{names[k]} real | predicted | within 10 %" for k in JUDGED)
        + " | p99 TPOT s real / predicted | batched req. real / predicted |",
        "|---|---|" + "---:|---:|---|" * len(JUDGED) + "---:|---:|",
    ]
    counts = {"holds": 0, "misses": 0}
    for row, runs in found:
        for engine, run in runs.items():
            real, predicted = run.summary, row[engine]
            values = []
            for key in JUDGED:
                ok = holds(real[key], predicted[key])
                counts["holds" if ok else "misses"] += row["window_start_s"] != 0
                shown = f"{'yes' if ok else 'no'} ({100 * error(real[key], predicted[key]):+.1f} %)"
                values += [f"{real[key]:.{digits[key]}f}", f"{predicted[key]:.{digits[key]}f}", shown]
            batched = "mean_batched_requests"
            values += [
                f"{real['p99_tpot_s']:.3f} / {predicted['p99_tpot_s']:.3f}",
                f"{real[batched]:.1f} / {predicted[batched]:.1f}",
            ]
            start = row["window_start_s"]
            lines.append(f"| {start}-{start + 30} | {engine} | " + " | ".join(values) + " |")
    return lines, counts


def ratio_table(found: list[tuple[dict, dict[str, Run]]]) -> list[str]:
    pairs = (("jenga", "paged"), ("hybrid", "paged"), ("hybrid", "jenga"))
    lines = [
        "| window s | " + " | ".join(f"{a} / {b} real | predicted" for a, b in pairs) + " |",
        "|---|" + "---:|---:|" * len(pairs),
    ]
    for row, runs in found:
        values = []
        for a, b in pairs:
            if a in runs and b in runs:
                real = runs[a].summary["request_throughput"] / runs[b].summary["request_throughput"]
                values.append(f"{real:.3f}")
            else:
                values.append("not run")
            values.append(f"{row[a]['request_throughput'] / row[b]['request_throughput']:.3f}")
        start = row["window_start_s"]
        lines.append(f"| {start}-{start + 30} | " + " | ".join(values) + " |")
    return lines


def step_table(found: list[tuple[dict, dict[str, Run]]]) -> list[str]:
    cost = SIM / "prediction.json"
    fitted = SIM.parents[2] / json.loads(cost.read_text(encoding="utf-8"))["cost_model"]
    lines = [
        "| window s | engine | step kind | steps | median abs. error | p90 abs. error"
        " | measured / priced (sums) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for row, runs in found:
        for engine, run in runs.items():
            steps = run.steps.assign(priced_s=PRICED(run, fitted))
            for kind in ("mixed", "decode"):
                part = steps[steps.kind == kind]
                if part.empty:
                    continue
                errors = 100 * np.abs(part.priced_s / part.duration_s - 1)
                start, sums = row["window_start_s"], part.duration_s.sum() / part.priced_s.sum()
                lines.append(
                    f"| {start}-{start + 30} | {engine} | {kind} | {len(part)} | {np.median(errors):.1f} % "
                    f"| {np.quantile(errors, 0.9):.1f} % | {sums:.3f} |"
                )
    return lines


def reading() -> list[str]:
    """The three tables and the count of predictions within target, as lines of markdown."""
    found = windows()
    missing = [f"{row['window_start_s']} s: {e}" for row, runs in found for e in ENGINES if e not in runs]
    metrics, counts = metric_table(found)
    lines = [
        "Real against predicted, one run each (window 0-30: the fitted window, the warmed-up run;"
        " not checked):",
        "",
        *metrics,
        "",
        f"The later windows (one run each, no verdict): {counts['holds']} of "
        f"{counts['holds'] + counts['misses']} predictions within {100 * TOLERANCE:.0f} %."
        + (f" Not run yet: {', '.join(missing)}." if missing else ""),
        "",
        "Completed req/s, engine over engine:",
        "",
        *ratio_table(found),
        "",
        "Each step priced by the fitted costs (`calibration/cost.json` of hybrid-long-chunked-split-real):",
        "",
        *step_table(found),
    ]
    return lines


def main() -> None:
    print("\n".join(reading()))


if __name__ == "__main__":
    main()
