"""How Figure 12's sustained rates depend on how long each cell's trace lasts, simulated.

The paper read sustained rates off 1-hour traces: past an engine's capacity the queue, and so
normalized latency, grows for the whole hour, so the bound is crossed just past capacity. A
real reproduction cannot afford an hour per cell, and a fixed request count is worse than a
shorter hour (a fast engine's 120 requests are a few seconds of overload, a slow one's
minutes). This benchmark simulates Figure 12 at the real runs' setting (the cost model fitted
on the model's real runs, the GPU setting's rates and shared bound) with every loaded cell's
trace lasting D seconds, for several D, and prints each engine's sustained bracket, paged's
ratios, and the GPU seconds the real runs placed at that D would take (two runs per engine,
their simulated makespans; the unloaded baselines, a few minutes per seed, come on top), so
the duration is chosen from
figures rather than by feel.

    python benchmarks/fig12_duration.py --cost-model results/reproduce/opt-13b-h200/calibration/cost.json \\
        --durations 30,60,120,300,900 [--seed 0] [--out table.md]
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

from kvbench.reproduce.rows import Options
from kvbench.reproduce.run import setting_for
from kvbench.reproduce.sweeps import FIG12_RATES, PLACED_SPREAD, sweep, threshold_of
from kvbench.sweep.grid import PAPER_ENGINES

BRACKET = 0.02


def simulate(options: Options, trace: str, duration: float, folder: Path) -> dict[str, dict]:
    """Each engine's sustained row and the makespans of its cells, one simulated Figure 12 panel."""
    result = sweep(options, folder, engines=PAPER_ENGINES, trace=trace, rates=FIG12_RATES[trace]["full"],
                   block_sizes=(16,), kv=options.setting.kv_cache_gib, threshold=threshold_of(options),
                   bracket=BRACKET, duration=duration)  # fmt: skip
    with open(folder / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    out = {}
    for row in result.sustained:
        engine = row["engine"]
        cells = [
            (float(r["rate"]), float(r["makespan_s"]))
            for r in rows
            if r["engine"] == engine and r["role"] != "baseline"
        ]
        out[engine] = {
            "low": row["last_pass_rate"],
            "high": row["first_fail_rate"],
            "cells": cells,
        }
    return out


def real_seconds(found: dict) -> float:
    """What the real runs placed from this simulation would take: each engine's two placed
    cells (the simulated makespans of the cells nearest r / 1.045 and r x 1.045); the unloaded
    baselines are not counted (on the H200 at OPT-13B: 28-41 s each, five per panel)."""
    total = 0.0
    for engine in found.values():
        low, high = engine["low"], engine["high"]
        centre = (low + high) / 2 if high else low
        for rate in (centre / PLACED_SPREAD, centre * PLACED_SPREAD):
            total += min(engine["cells"], key=lambda c: abs(c[0] - rate))[1]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost-model", required=True)
    parser.add_argument("--durations", default="30,60,120,300,900")
    parser.add_argument("--traces", default="sharegpt-paper,alpaca-paper")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the table (markdown) here")
    args = parser.parse_args()
    setting = setting_for(False, args.cost_model, quick=False)
    options = Options(False, setting, seed=args.seed)
    lines = [
        "| trace | duration s | "
        + " | ".join(PAPER_ENGINES)
        + " | paged/oracle | paged/max | paged/static | real runs s |",
        "|---|---|" + "---|" * (len(PAPER_ENGINES) + 4),
    ]
    work = Path(tempfile.mkdtemp(prefix="fig12-duration-"))
    for trace in args.traces.split(","):
        for duration in (float(d) for d in args.durations.split(",")):
            found = simulate(options, trace, duration, work / f"{trace}-{duration:g}")
            mid = {e: ((f["low"] + f["high"]) / 2 if f["high"] else f["low"]) for e, f in found.items()}
            cells = [
                f"[{f['low']:.3g}, {f['high']:.3g})" if f["high"] else f">= {f['low']:.3g}"
                for f in found.values()
            ]
            ratios = [f"{mid['paged'] / mid[o]:.2f}" for o in ("orca-oracle", "orca-max", "static")]
            line = (
                f"| {trace} | {duration:g} | "
                + " | ".join(cells)
                + " | "
                + " | ".join(ratios)
                + f" | {real_seconds(found):.0f} |"
            )
            print(line, flush=True)
            lines.append(line)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
