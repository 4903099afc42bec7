"""The vmm occupancy runs over their seeds, written from the committed runs rather than by hand.

    PYTHONPATH=. python results/reference/vmm-occupancy-real/seeds.py

Writes seeds.md beside this script: for every trace and engine (each folder's finished cells,
`sweep.csv` status ok), the mean and 95 % t interval over seeds (`Interval.of_samples`) of the
completed rate, the saturated-weighted occupancy categories (`summary.json`
`occupancy_saturated`), batching, latency, decode step time (from `steps.csv`) and, for vmm, the
driver's map and unmap counts and seconds; then each engine's completed rate over paged's and vmm
per-request's over its `sync` run, paired seed by seed (`Interval.paired_ratio`: the same
requests and arrivals), with the commit each seed ran at. Seconds on a CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvbench.reproduce.verdicts import Interval
from kvbench.results.files import write_text
from kvbench.results.load import load_sweep, read_csv

HERE = Path(__file__).resolve().parent
TRACES = {"sharegpt-paper": "9 req/s, 270 requests", "alpaca-paper": "110 req/s, 3,300 requests"}
# (folder suffix, engine in it, the engine's name here)
VARIANTS = (
    ("per-layer", "paged", "paged"),
    ("per-layer", "orca-oracle", "orca-oracle"),
    ("per-layer", "vmm", "vmm per-layer 2 MiB"),
    ("per-request", "vmm", "vmm per-request 2 MiB"),
    ("per-request-ahead", "vmm", "vmm per-request 2 MiB, ahead"),
    ("per-request-ahead-held", "vmm", "vmm per-request 2 MiB, ahead, held"),
)
SYNC = "vmm per-request 2 MiB"
# (column, heading, format); percentages of the arena, saturated-weighted
MEMORY = (
    ("rate", "completed req/s", "{:.2f}"),
    ("token_states", "token states %", "{:.1f}"),
    ("reservation", "reservation %", "{:.1f}"),
    ("internal_frag", "page rounding (internal) %", "{:.1f}"),
    ("buddy", "buddy overhead + external %", "{:.1f}"),
    ("mapped_idle", "mapped idle %", "{:.1f}"),
    ("free", "free %", "{:.1f}"),
)
TIME = (
    ("makespan", "makespan s", "{:.1f}"),
    ("saturated", "saturated share %", "{:.0f}"),
    ("batched", "batched (saturated)", "{:.1f}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("latency", "normalized latency s/token", "{:.3f}"),
    ("decode_ms", "decode ms a step", "{:.1f}"),
    ("decode_rows", "decode rows a step", "{:.1f}"),
)
DRIVER = (
    ("maps", "maps", "{:,.0f}"),
    ("unmaps", "unmaps", "{:,.0f}"),
    ("ahead_maps", "maps ahead", "{:,.0f}"),
    ("step_maps", "maps in steps", "{:,.0f}"),
    ("map_s", "driver s", "{:.2f}"),
    ("step_map_s", "driver s in steps", "{:.2f}"),
    ("lost", "lost", "{:.0f}"),
)


def cell_values(cell: Path) -> dict[str, float]:
    """One run's figures: its summary's, and its decode steps' mean time and rows a step."""
    s = json.loads((cell / "summary.json").read_text())
    occ = s["occupancy_saturated"]
    steps = read_csv(cell / "steps.csv")
    decode = steps[steps.kind == "decode"]
    n = decode.num_steps.sum()
    values = {
        "rate": s["request_throughput"],
        "token_states": 100 * occ["token_states"],
        "reservation": 100 * occ["reservation"],
        "internal_frag": 100 * occ["internal_frag"],
        "buddy": 100 * (occ["allocator_overhead"] + occ["external_frag"]),
        "mapped_idle": 100 * occ["mapped_idle"],
        "free": 100 * occ["free"],
        "makespan": s["makespan_s"],
        "saturated": 100 * s["saturated_s"] / s["busy_s"],
        "batched": s["mean_batched_requests_saturated"],
        "preemptions": s["num_preemptions"],
        "latency": s["normalized_latency_s"],
        "decode_ms": 1000 * decode.duration_s.sum() / n,
        "decode_rows": (decode.batch_size * decode.num_steps).sum() / n,
    }
    if "vmm_maps" in s:
        values |= {
            "maps": s["vmm_maps"],
            "unmaps": s["vmm_unmaps"],
            "ahead_maps": s["vmm_ahead_maps"],
            "step_maps": s["vmm_maps"] - s["vmm_ahead_maps"],
            "map_s": s["vmm_map_s"],
            "step_map_s": s["vmm_map_s"] - s["vmm_ahead_map_s"],
            "lost": s.get("vmm_ahead_lost", float("nan")),  # counted since ed5361d
        }
    return values


def runs(root: Path, trace: str, suffix: str, engine: str) -> dict[int, tuple[str, dict[str, float]]]:
    """{seed: (commit, figures)} of one engine's finished runs in one folder."""
    folder = root / f"{trace}-{suffix}"
    if not (folder / "sweep.csv").is_file():
        return {}
    sweep = load_sweep(folder)
    here = {cell.name for cell in sweep.folders}
    done = sweep.cells[(sweep.cells.status == "ok") & (sweep.cells.engine == engine)]
    found = {}
    for r in done[done.cell_id.isin(here)].itertuples():
        cell = folder / "cells" / r.cell_id
        commit = json.loads((cell / "env.json").read_text())["git_sha"][:7]
        found[int(r.seed)] = (commit, cell_values(cell))
    return dict(sorted(found.items()))


def _number(fmt: str, value: float) -> str:
    text = fmt.format(value)
    return text.lstrip("-") if not text.strip("-0.,") else text  # no "-0.0"


def over_seeds(values: list[float], fmt: str) -> str:
    """Mean [95 % interval] of several seeds' values; one seed's value alone as it is; "-" where
    a seed has none (a count its commit did not make)."""
    if any(math.isnan(v) for v in values):
        return "-"
    if len(values) == 1:
        return _number(fmt, values[0])
    i = Interval.of_samples(values)
    return f"{_number(fmt, i.value)} [{_number(fmt, i.low)}, {_number(fmt, i.high)}]"


def seeds_label(found: dict) -> str:
    commits = ", ".join(f"{seed}: {commit}" for seed, (commit, _) in found.items())
    return f"{len(found)} ({commits})"


def table(data: dict, columns: tuple, only_vmm: bool = False) -> list[str]:
    lines = [
        "| trace | engine | seeds (commit) | " + " | ".join(head for _, head, _ in columns) + " |",
        "|---|---|---|" + "---|" * len(columns),
    ]
    for (trace, name), found in data.items():
        if (only_vmm and not name.startswith("vmm")) or not found:
            continue
        cells = [over_seeds([v[key] for _, v in found.values()], fmt) for key, _, fmt in columns]
        lines.append(f"| {trace} | {name} | {seeds_label(found)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def paired(data: dict, trace: str, name: str, base: str) -> str | None:
    """`name`'s completed rate over `base`'s, seed by seed, over the seeds both ran."""
    mine, theirs = data.get((trace, name), {}), data.get((trace, base), {})
    seeds = [s for s in mine if s in theirs]
    if not seeds:
        return None
    ratios = [mine[s][1]["rate"] / theirs[s][1]["rate"] for s in seeds]
    each = ", ".join(f"{r:.3f}" for r in ratios)
    one = Interval(0, 0, 0, tuple(theirs[s][1]["rate"] for s in seeds))
    ratio = one.paired_ratio(Interval(0, 0, 0, tuple(mine[s][1]["rate"] for s in seeds)))
    if ratio is None:
        summary = "one run"
    else:
        told = "below 1" if ratio.high < 1 else "above 1" if ratio.low > 1 else "holds 1: not told apart"
        summary = f"{ratio.value:.3f} [{ratio.low:.3f}, {ratio.high:.3f}], {told}"
    same = all(mine[s][0] == theirs[s][0] for s in seeds)
    commits = (
        "same commit at every seed"
        if same
        else "commits differ: " + ", ".join(f"{s}: {mine[s][0]} / {theirs[s][0]}" for s in seeds)
    )
    return f"| {trace} | {name} / {base} | {', '.join(map(str, seeds))} | {each} | {summary} | {commits} |"


def render(root: Path = HERE) -> str:
    """seeds.md's text for the results folder `root` (this script's own by default)."""
    data = {
        (trace, name): runs(root, trace, suffix, engine)
        for trace in TRACES
        for suffix, engine, name in VARIANTS
    }
    lines = [
        "# vmm occupancy at OPT-13B on the H200: the seeds as they stand",
        "",
        "Written by `PYTHONPATH=. python results/reference/vmm-occupancy-real/seeds.py` from the",
        "committed runs (each cell's summary.json and steps.csv); do not edit by hand. Each figure is",
        "the mean over the seeds run and its 95 % t interval in brackets (one seed: its value alone).",
        "Occupancy is saturated-weighted (the steps during which a request waited), in % of the arena.",
        "Decode ms and rows a step: over decode steps, a segment of several steps counted as each.",
        "",
        "## Completed rate and memory",
        "",
        *table(data, MEMORY),
        "## Time and batching",
        "",
        *table(data, TIME),
        "## Driver calls (vmm)",
        "",
        "Maps in steps: `vmm_maps` less `vmm_ahead_maps`; driver s in steps: `vmm_map_s` less",
        "`vmm_ahead_map_s` (maps and unmaps); lost: `vmm_ahead_lost`, counted since ed5361d (a dash:",
        "a seed run before it).",
        "",
        *table(data, DRIVER, only_vmm=True),
        "## Completed rate, paired by seed",
        "",
        "Each seed's ratio of completed rates (the same requests and arrivals), then their mean and",
        "95 % t interval (two seeds or more), and whether the interval lies below 1, above, or holds it.",
        "",
        "| trace | engines | seeds | ratio at each seed | mean [95 % interval] | commits |",
        "|---|---|---|---|---|---|",
    ]
    for trace in TRACES:
        for _, _, name in VARIANTS:
            if name != "paged":
                lines.append(paired(data, trace, name, "paged"))
        for name in ("vmm per-request 2 MiB, ahead", "vmm per-request 2 MiB, ahead, held"):
            lines.append(paired(data, trace, name, SYNC))
    return "\n".join(line for line in lines if line is not None).rstrip() + "\n"


def main() -> None:
    text = render()
    write_text(HERE / "seeds.md", text)
    print(text)


if __name__ == "__main__":
    main()
