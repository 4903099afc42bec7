"""How much of Figure 12's Alpaca verdict a prefill step's fixed cost decides, simulated.

On the H200 at OPT-13B, paged sustains less than orca-oracle on Alpaca (real runs,
results/reproduce/opt-13b-h200), the opposite of the paper. The step rows point at the
prefill steps: paged admits every arrival at the next step, so almost every other step
prefills one or two short prompts, and on this GPU such a step (run eagerly) costs more than a
decode step of 100 rows (replayed as a CUDA graph); on the paper's A100 both read the same
weights eagerly and cost about the same. A real ablation needs GPU time; this benchmark asks
the calibrated simulator first:

1. fit the cost model to the given real runs (`kvbench calibrate`'s fit, no held-out runs);
2. simulate Figure 12's panels at the real setting (60 s traces, the shared 4 x unloaded bound,
   the GPU setting's budget) with that fit, and again with the fit's per-prefill-step cost
   (`per_prefill_s`) set to 0: a prefill step then costs what a decode step feeding as many
   tokens costs, everything else equal;
3. print each engine's sustained bracket and paged's ratios under both.

    python benchmarks/prefill_counterfactual.py \\
        results/reproduce/opt-13b-h200/fig12/seed-0/alpaca-paper/cells \\
        results/reproduce/opt-13b-h200/fig12/seed-0/sharegpt-paper/cells --out folder
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from kvbench.calibrate.check import find_runs, fit_and_check
from kvbench.reproduce.rows import Options
from kvbench.reproduce.run import setting_for
from kvbench.reproduce.sweeps import FIG12_PLACED_DURATION_S
from kvbench.sweep.grid import PAPER_ENGINES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fig12_duration import simulate  # a sibling benchmark: one Figure 12 panel simulated

VARIANTS = ("fitted", "prefill-at-decode-cost")


def cost_files(runs: list[Path], out: Path) -> dict[str, Path]:
    """The fit to `runs`, and the same fit with no extra cost per prefill step."""
    fitted = out / "cost-fitted.json"
    fit_and_check(find_runs(runs, steps=True, flag="runs"), [], fitted)
    data = json.loads(fitted.read_text())
    data["per_prefill_s"] = 0.0
    counterfactual = out / "cost-prefill-at-decode-cost.json"
    counterfactual.write_text(json.dumps(data, indent=2) + "\n")
    return dict(zip(VARIANTS, (fitted, counterfactual), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="real runs to fit, or folders of them")
    parser.add_argument("--out", type=Path, required=True, help="folder for the cost files and table.md")
    parser.add_argument("--traces", default="alpaca-paper,sharegpt-paper")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    costs = cost_files(args.runs, args.out)
    lines = [
        "| trace | cost model | " + " | ".join(PAPER_ENGINES) + " | paged/oracle | paged/pow2 | paged/max |",
        "|---|---|" + "---|" * (len(PAPER_ENGINES) + 3),
    ]
    work = Path(tempfile.mkdtemp(prefix="prefill-counterfactual-"))
    for trace in args.traces.split(","):
        for variant, cost in costs.items():
            options = Options(False, setting_for(False, str(cost), quick=False), seed=args.seed)
            found = simulate(options, trace, FIG12_PLACED_DURATION_S, work / f"{trace}-{variant}")
            cells = [bracket(f) for f in found.values()]
            ratios = [ratio(found["paged"], found[o]) for o in ("orca-oracle", "orca-pow2", "orca-max")]
            line = f"| {trace} | {variant} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |"
            print(line, flush=True)
            lines.append(line)
    (args.out / "table.md").write_text("\n".join(lines) + "\n")


def bracket(found: dict) -> str:
    """An engine's sustained bracket [last pass, first fail), or a lower bound where none failed."""
    return f"[{found['low']:.3g}, {found['high']:.3g})" if found["high"] else f">= {found['low']:.3g}"


def ratio(num: dict, den: dict) -> str:
    """paged's bracket over another engine's, as an interval [low/high, high/low]; open above
    where paged never failed."""
    low = num["low"] / den["high"] if den["high"] else None
    high = num["high"] / den["low"] if num["high"] else None
    left = f"{low:.2f}" if low is not None else "?"
    return f"[{left}, {high:.2f}]" if high is not None else f">= {left}"


if __name__ == "__main__":
    main()
