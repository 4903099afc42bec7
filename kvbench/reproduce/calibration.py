"""A real `kvbench reproduce` calibrates the simulator on its own runs and states its error.

Every real figure beside a simulation calibrated to the same GPU, and the simulator's error on
the real points. So once Figure 2's five runs exist in a real
reproduction, the cost model is fitted to their step rows, and the real runs of Figures 12-17
are replayed through the simulator with it (`kvbench.calibrate.check`):

    <out>/calibration/cost.json             the fit (a `kvbench calibrate` file, held-out errors in it)
    <out>/calibration/held_out.md           Figures 12 and 13: other rates, and another trace
    <out>/calibration/held_out_sharing.md   Figures 14-17: samples, beams, prefixes, chat
    <out>/calibration/held_out_sets.json    per set: errors' median, largest, count within 10 %

Figures 18b and 19 vary what the fit has no term for (block size, swapping), so they are not
held out. A run of Figure 2's trace and seed (Figure 13's ShareGPT runs are copies of Figure 2's;
Figure 12 reruns its trace at other rates) replays fitted requests: it is dropped, and each set
names its dropped runs. Every set states its errors for loaded and unloaded runs apart (a run
that never queued matches its arrival rate whatever the step times); the loaded runs' count
within 10 % is the headline, and each page opens with that summary before its rows. The
folder is replaced whole, so it never mixes two calibrations; a committed folder's pages are
rewritten from its cost.json rows alone (`rewrite_held_out`), refitting nothing.
`kvbench reproduce --cost-model <out>/calibration/cost.json --mode simulate` then draws the
dense curves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from kvbench.calibrate.check import (
    LOADS,
    TARGET,
    Check,
    fit_and_check,
    format_checks,
    format_summary,
    is_loaded,
    read_config,
    summarize,
)
from kvbench.demo import DEMO_ENGINES
from kvbench.errors import KvbenchError
from kvbench.reproduce.rows import SET_ASIDE, seed_folder
from kvbench.results.files import read_json, write_json, write_run_atomically, write_text
from kvbench.results.load import runs_below
from kvbench.results.packed import table_path

FIT_FIGURE = "fig2"
HELD_OUT = {
    "held_out.md": ("Figures 12-13", ("fig12", "fig13")),
    "held_out_sharing.md": ("Figures 14-17", ("fig14", "fig15", "fig16", "fig17")),
}
SETS_FILE = "held_out_sets.json"


@dataclass(frozen=True)
class HeldOutSet:
    label: str  # "Figures 12-13"
    summary: dict  # `kvbench.calibrate.check.summarize` of its checks
    dropped: list[str] = field(default_factory=list)  # its runs with Figure 2's trace draw, not held out


def calibrate_reproduction(out: Path) -> list[HeldOutSet] | None:
    """Fit on `out`'s Figure 2 runs and check the real runs of Figures 12-17; None (nothing
    written) unless all five Figure 2 runs are real runs with step rows."""
    fit = [seed_folder(out / FIT_FIGURE) / engine for engine in DEMO_ENGINES]  # its first seed's
    if not all(_real(run) and table_path(run / "steps.csv") is not None for run in fit):
        return None
    held_out = [run for figures in HELD_OUT.values() for run in _real_runs(out, figures[1])]
    report: list[HeldOutSet] = []

    def write(folder: Path) -> None:
        done = fit_and_check(fit, held_out, folder / "cost.json", out)
        dropped = [str(run.relative_to(out)) for run, _ in done.dropped]
        report.extend(write_sets(folder, done.checks, dropped))

    write_run_atomically(out / "calibration", write)
    return report


def write_sets(folder: Path, checks: list[Check], dropped: list[str]) -> list[HeldOutSet]:
    """Write each held-out set's page (`held_out_page`) and `SETS_FILE` into `folder` from the
    checks and dropped runs (named relative to the reproduction, so a run's first part is its
    figure); a set with neither is not written. One path for a fresh calibration and for a
    rewrite from a committed cost.json (`rewrite_held_out`), so both write the same files."""
    report: list[HeldOutSet] = []
    for name, (label, figures) in HELD_OUT.items():
        mine = [c for c in checks if _figure(c.run) in figures]
        gone = [run for run in dropped if _figure(run) in figures]
        if mine or gone:
            write_text(folder / name, held_out_page(label, mine, gone))
            report.append(HeldOutSet(label, summarize(mine), gone))
    write_json(folder / SETS_FILE, {"held_out_sets": [asdict(s) for s in report]})
    return report


def held_out_page(label: str, checks: list[Check], dropped: list[str]) -> str:
    """A held-out set's page: its errors summarised for loaded and unloaded runs apart
    (`format_summary`: what a reader wants before the rows), then every run, then the runs
    dropped for sharing Figure 2's trace draw."""
    note = f"\n\nNot held out (Figure 2's trace and seed): {', '.join(dropped)}" * bool(dropped)
    if not checks:
        return (
            f"# {label}: real runs beside the calibrated simulation\n\nNo run of another trace draw.{note}\n"
        )
    return (
        f"# {label}: real runs beside the calibrated simulation\n\n{format_summary(checks)}\n\n"
        f"## Every run\n\n{format_checks(checks)}{note}\n"
    )


def rewrite_held_out(out: Path) -> list[HeldOutSet]:
    """Rewrite `out`'s held-out pages and `SETS_FILE` from its calibration/cost.json rows
    (every check: run, engine, metric, real, simulated, loaded), refitting and replaying
    nothing: the fitted constants and every error stay what the GPU's runs gave. A row written
    before `loaded` was recorded takes it from its run's own summary.json and config.json
    (`is_loaded`: what a fresh calibration reads), where that run folder is committed."""
    path = out / "calibration" / "cost.json"
    if not path.is_file():
        raise KvbenchError(f"{out}: no calibration/cost.json to rewrite the held-out pages from")
    cost = read_json(path)
    checks = [_row_check(out, row) for row in cost.get("held_out", [])]
    dropped = [entry["run"] for entry in cost.get("held_out_dropped", [])]
    return write_sets(out / "calibration", checks, dropped)


def _row_check(out: Path, row: dict) -> Check:
    """A cost.json `held_out` row as the `Check` it was written from."""
    check = Check(**{f.name: row[f.name] for f in fields(Check) if f.name in row})
    run = out / check.run
    if check.loaded is None and (run / "summary.json").is_file() and (run / "config.json").is_file():
        check = replace(check, loaded=is_loaded(run, read_json(run / "summary.json"), read_config(run)))
    return check


def _figure(run: str) -> str:
    return Path(run).parts[0]


def read_held_out(out: Path) -> list[HeldOutSet] | None:
    """The held-out sets a real reproduction wrote into `out` (None if it wrote none)."""
    path = out / "calibration" / SETS_FILE
    if not path.is_file():
        return None
    return [HeldOutSet(**entry) for entry in read_json(path)["held_out_sets"]]


def held_out_markdown(sets: list[HeldOutSet]) -> str:
    """The report's table: per held-out set and metric, the simulator's error on the loaded
    real runs (the headline: a queue formed, so step times decide the result) and apart on the
    unloaded ones; then the runs dropped for sharing Figure 2's trace draw."""
    target = f"{100 * TARGET:.0f} %"
    lines = [
        f"| held-out runs | metric | loaded: within {target} | loaded: median error | loaded: largest error "
        f"| unloaded: within {target} | unloaded: median error |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in sets:
        for metric, m in s.summary.items():
            loaded, unloaded = (m.get(load, {"runs": 0}) for load in LOADS)  # older files: no split
            lines.append(
                f"| {s.label} | {metric} | {_within(loaded)} | {_percent(loaded, 'median_abs_error')} "
                f"| {_percent(loaded, 'max_abs_error')} | {_within(unloaded)} "
                f"| {_percent(unloaded, 'median_abs_error')} |"
            )
    dropped = [f"- {s.label}: {len(s.dropped)} runs ({', '.join(s.dropped)})" for s in sets if s.dropped]
    if dropped:
        lines += ["", "Not held out: their trace and seed are Figure 2's (the fitted requests).", *dropped]
    return "\n".join(lines)


def _within(spread: dict) -> str:
    return f"{spread.get('within_target', 0)} of {spread['runs']}" if spread["runs"] else "none"


def _percent(spread: dict, key: str) -> str:
    return f"{100 * spread[key]:.1f} %" if spread["runs"] else "-"


def _real(run: Path) -> bool:
    return read_json(run / "summary.json").get("mode") == "real"


def _real_runs(out: Path, figures: tuple[str, ...]) -> list[Path]:
    """Real run folders under the figures' folders, in name order; runs set aside (`SET_ASIDE`)
    are left out: they repeat a seed's draw at other run code, and would count it twice."""
    return [
        run
        for figure in figures
        for run in runs_below(out / figure, steps=False)
        if _real(run) and SET_ASIDE not in run.relative_to(out).parts
    ]
