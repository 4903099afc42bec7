"""Figure 19's seeds as they stand, written from the committed runs rather than by hand.

    PYTHONPATH=. python results/reproduce/opt-13b-h200/fig19_seeds.py

Writes fig19/seeds.md: for every block size of every seed's two sweeps (`fig19/seed-<s>/recompute`
and `swap`), each mode's preemptions, normalized latency and fitted ms per preemption (the
figure's own `preemption_overhead_ms`), and swap's latency over recompute's; then Figure 19's
verdicts as `reproduce` will give them (its own `fig19_verdict` on these rows merged over the
seeds whose cells are all done), so a README quoting the progress between device sessions cannot
drift from the files. `fig19/figure.json` is written when every seed is done. Seconds on a CPU:
each cell's fit is one `kvbench calibrate` of its steps.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvbench.reproduce.rows import Options, Row, Setting, merge_seeds
from kvbench.reproduce.sweeps import fig19_verdict, preemption_overhead_ms
from kvbench.results.files import write_text
from kvbench.results.load import load_sweep

HERE = Path(__file__).resolve().parent
MODES = ("recompute", "swap")
OUTCOME = r"; (?=(?:matches|differs|not measured|inconclusive)\b)"  # where one verdict's text ends


def seed_rows(folder: Path) -> dict[int, dict[str, dict]]:
    """{block size: {mode: {preemptions, latency, ms}}} of one seed's finished cells."""
    by_size: dict[int, dict[str, dict]] = {}
    for how in MODES:
        if not (folder / how / "sweep.csv").is_file():
            continue
        sweep = load_sweep(folder / how)
        here = {cell.name for cell in sweep.folders}  # a run set aside keeps its row in sweep.csv
        for r in sweep.cells[(sweep.cells.status == "ok") & sweep.cells.cell_id.isin(here)].itertuples():
            ms = preemption_overhead_ms(folder / how / "cells" / r.cell_id, how)
            cell = {"preemptions": int(r.num_preemptions), "latency": float(r.normalized_latency_s), "ms": ms}
            by_size.setdefault(int(r.block_size), {})[how] = cell
    return by_size


def figure_rows(by_size: dict[int, dict[str, dict]]) -> list[Row]:
    """The rows `reproduce` makes of one seed (kvbench.reproduce.sweeps.fig19), from its cells."""
    rows = []
    for bs, modes in by_size.items():
        for how, cell in modes.items():
            engine = f"paged-{how}"
            rows += [
                Row("fig19", engine, "sharegpt-paper", f"overhead_ms_per_preemption@bs{bs}", cell["ms"]),
                Row("fig19", engine, "sharegpt-paper", f"normalized_latency_s@bs{bs}", cell["latency"]),
            ]
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def seed_text(seed: int, by_size: dict[int, dict[str, dict]], complete: bool) -> list[str]:
    cells = sum(len(modes) for modes in by_size.values())
    state = "complete" if complete else f"{cells} of 18 cells"
    lines = [
        f"## Seed {seed} ({state})",
        "",
        "| block size | preemptions, recompute / swap | normalized latency (s/token), recompute / swap "
        "| swap / recompute | ms a preemption (fitted), recompute / swap |",
        "|---|---|---|---|---|",
    ]
    for bs in sorted(by_size):
        m = by_size[bs]
        rec, swap = m.get("recompute"), m.get("swap")
        ratio = f"{swap['latency'] / rec['latency']:.3f}" if rec and swap else "-"
        count = " / ".join(str(c["preemptions"]) if c else "-" for c in (rec, swap))
        latency = " / ".join(f"{c['latency']:.4f}" if c else "-" for c in (rec, swap))
        ms = " / ".join(_ms(c["ms"] if c else None) for c in (rec, swap))
        lines.append(f"| {bs} | {count} | {latency} | {ratio} | {ms} |")
    return [*lines, ""]


def render(root: Path = HERE) -> str:
    """seeds.md's text for the reproduction folder `root` (this script's own by default)."""
    lines = [
        "# Figure 19 at OPT-13B: the seeds as they stand",
        "",
        "Written by `PYTHONPATH=. python results/reproduce/opt-13b-h200/fig19_seeds.py` from the committed",
        "runs (each sweep's sweep.csv, each cell's steps); do not edit by hand. Normalized latency: the",
        "mean over requests of end-to-end latency over output tokens. The fitted ms a preemption: the",
        "blocks swapped (tokens recomputed) times a constant fitted to the cell's own step times.",
        "",
    ]
    complete = []
    for folder in sorted((root / "fig19").glob("seed-*"), key=lambda f: int(f.name.removeprefix("seed-"))):
        by_size = seed_rows(folder)
        done = len(by_size) == 9 and all(len(m) == 2 for m in by_size.values())
        lines += seed_text(int(folder.name.removeprefix("seed-")), by_size, done)
        if done:
            complete.append(figure_rows(by_size))
    if complete:
        rows = merge_seeds(complete)
        full_grid = Options(False, Setting(real=True))  # real, the nine block sizes 1-256, as the seeds ran
        overall, parts = fig19_verdict(rows, full_grid).split(": ", 1)
        seeds = "the complete seed" if len(complete) == 1 else f"the {len(complete)} complete seeds"
        lines += [
            f"## Verdicts over {seeds}: {overall}",
            "",
            "Figure 19's own rules (`kvbench.reproduce.sweeps.fig19_verdict`), a part a line:",
            "",
            *(f"- {part}" for part in re.split(OUTCOME, parts)),
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    text = render()
    write_text(HERE / "fig19" / "seeds.md", text)
    print(text)


if __name__ == "__main__":
    main()
