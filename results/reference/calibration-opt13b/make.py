"""Refit OPT-13B's H200 cost model on every seed-0 run and check it on the seed-1 and seed-2 runs.

    KVBENCH_TRACE_DIR=../shared/traces python results/reference/calibration-opt13b/make.py

Writes cost.json (the fit, with its held-out errors) and held_out.md beside this file:
before.json ("before": results/reproduce/opt-13b-h200/calibration/cost.json as fitted on
fig2/seed-0's five runs, kept here because the reproduction refits its own file) and the new
fit ("after") on the same held-out runs, loaded and unloaded apart.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvbench.calibrate.check import check, fit_and_check, format_checks, summarize
from kvbench.results.files import write_text

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
RUNS = ROOT / "results/reproduce/opt-13b-h200"


def runs(folder: str) -> list[Path]:
    return [summary.parent for summary in sorted((RUNS / folder).glob("**/summary.json"))]


FIT = runs("fig2/seed-0") + runs("fig13/seed-0/alpaca-paper")  # fig13/seed-0/sharegpt-paper is fig2/seed-0
HELD_OUT = runs("fig13/seed-1") + runs("fig2/seed-2")  # fig2/seed-1 is fig13/seed-1/sharegpt-paper


def counts(checks) -> list[str]:
    head = "| metric | loaded: within 10 % | loaded: median error | loaded: largest error | unloaded runs |"
    lines = [head, "|---|---:|---:|---:|---:|"]
    for metric, m in summarize(checks).items():
        lo = m["loaded"]
        lines.append(
            f"| {metric} | {lo['within_target']} of {lo['runs']} | {100 * lo['median_abs_error']:.1f} % "
            f"| {100 * lo['max_abs_error']:.1f} % | {m['unloaded']['runs']} |"
        )
    return lines


def main() -> None:
    committed = check(HERE / "before.json", HELD_OUT)
    before = [replace(c, run=str(Path(c.run).relative_to(RUNS))) for c in committed]
    # the objective this folder was fitted with (the default then; kvbench calibrate's is "mean" now)
    after = fit_and_check(FIT, HELD_OUT, HERE / "cost.json", base=RUNS, objective="relative").checks
    text = [
        "# OPT-13B on the H200: held-out runs before and after the refit", "",
        "Before: before.json here (the reproduction's first fit, on fig2/seed-0's five runs).",
        "After: cost.json here (fitted on fig2/seed-0 and fig13/seed-0/alpaca-paper, ten runs, with "
        "`per_segment_s`). Held out in both: every seed-1 and seed-2 run.", "",
        "## Before", "", *counts(before), "", format_checks(before), "",
        "## After", "", *counts(after), "", format_checks(after), "",
    ]  # fmt: skip
    write_text(HERE / "held_out.md", "\n".join(text))


if __name__ == "__main__":
    main()
