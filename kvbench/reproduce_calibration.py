"""A real `kvbench reproduce` calibrates the simulator on its own runs and states its error.

The issue's second half: every real figure beside a simulation calibrated to the same GPU, and
the simulator's error on the real points. So once Figure 2's five runs exist in a real
reproduction, the cost model is fitted to their step rows and every other real run of the
folder is replayed through the simulator with it (`kvbench.calibrate_check`):

    <out>/calibration/cost.json           the fit (a `kvbench calibrate` file, held-out errors in it)
    <out>/calibration/held_out.md         Figures 12 and 13: other rates, and another trace
    <out>/calibration/held_out_sharing.md Figures 14-17: samples, beams, prefixes, chat
    <out>/calibration/summary.json        per set: errors' median, largest, count within 10 %

Figure 13's ShareGPT runs are Figure 2's (copied), so they are fitted, never held out.
`kvbench reproduce --cost-model <out>/calibration/cost.json --mode simulate` then draws the
dense curves.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from kvbench.calibrate_check import fit_and_check, format_checks, runs_below, summarize
from kvbench.demo import DEMO_ENGINES
from kvbench.results import write_json

FIT_FIGURE = "fig2"
HELD_OUT = {
    "held_out.md": ("Figures 12-13", ("fig12", "fig13")),
    "held_out_sharing.md": ("Figures 14-17", ("fig14", "fig15", "fig16", "fig17")),
}


@dataclass(frozen=True)
class HeldOutSet:
    label: str  # "Figures 12-13"
    summary: dict  # `calibrate_check.summarize` of its checks


def calibrate_reproduction(out: Path) -> list[HeldOutSet] | None:
    """Fit on `out`'s Figure 2 runs and check every other real run; None (nothing written)
    unless all five Figure 2 runs are real runs."""
    fit = [out / FIT_FIGURE / engine for engine in DEMO_ENGINES]
    if not all(_real(run) and (run / "steps.csv").is_file() for run in fit):
        return None
    fitted = {(run / "config.json").read_text() for run in fit}  # copies of them are fitted too

    def held(figures: tuple[str, ...]) -> list[Path]:
        return [run for run in _real_runs(out, figures) if (run / "config.json").read_text() not in fitted]

    sets = {name: (label, held(figures)) for name, (label, figures) in HELD_OUT.items()}
    folder = out / "calibration"
    every = [run for _, runs in sets.values() for run in runs]
    _, checks = fit_and_check(fit, every, folder / "cost.json", base=out)
    by_run: dict[str, list] = {}
    for c in checks:
        by_run.setdefault(c.run, []).append(c)
    report = []
    for name, (label, runs) in sets.items():
        mine = [c for run in runs for c in by_run.get(str(run.relative_to(out)), [])]
        (folder / name).write_text(f"# {label}: real runs beside the calibrated simulation\n\n"
                                   f"{format_checks(mine)}\n")  # fmt: skip
        if mine:
            report.append(HeldOutSet(label, summarize(mine)))
    write_json(folder / "summary.json", {"held_out_sets": [asdict(s) for s in report]})
    return report


def read_held_out(out: Path) -> list[HeldOutSet] | None:
    """The held-out sets a real reproduction wrote into `out` (None if it wrote none)."""
    path = out / "calibration" / "summary.json"
    if not path.is_file():
        return None
    return [HeldOutSet(**entry) for entry in json.loads(path.read_text())["held_out_sets"]]


def held_out_markdown(sets: list[HeldOutSet]) -> str:
    """The report's table: per held-out set and metric, the simulator's error on the real runs."""
    lines = [
        "| held-out runs | metric | runs | median error | largest error | within 10 % |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for s in sets:
        for metric, m in s.summary.items():
            lines.append(
                f"| {s.label} | {metric} | {m['runs']} | {100 * m['median_abs_error']:.1f} % "
                f"| {100 * m['max_abs_error']:.1f} % | {m['within_target']} of {m['runs']} |"
            )
    return "\n".join(lines)


def _real(run: Path) -> bool:
    try:
        return json.loads((run / "summary.json").read_text()).get("mode") == "real"
    except (OSError, json.JSONDecodeError):
        return False


def _real_runs(out: Path, figures: tuple[str, ...]) -> list[Path]:
    """Real run folders under the figures' folders, in name order."""
    return [run for figure in figures for run in runs_below(out / figure, steps=False) if _real(run)]
