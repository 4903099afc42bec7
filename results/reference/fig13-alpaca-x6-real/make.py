"""Figure 13's Alpaca panel, real, 1,000 requests at 180 req/s: the five engines' mean batched
requests over three seeds, judged against the paper by kvbench's own verdict rules.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. python results/reference/fig13-alpaca-x6-real/make.py

Writes table.md beside this file: (1) each engine's mean batched requests (busy-weighted, the
metric `kvbench reproduce fig13` judges) per seed, its mean and 95 % t interval over the seeds,
the paper's value and the verdict (`kvbench.reproduce.verdicts.value_verdict`: the paper's value
inside the interval widened by 15 %); the paged / orca-oracle ratio and the engines' order, as
`kvbench.reproduce.engines.fig13_verdict` judges them; (2) paged over each engine seed by seed
(engines of one seed share its trace draw), with the paper's ratio; (3) what says whether the
runs hold the figure's setting: saturated share (the part of the run with a request waiting),
peak batch, preemptions, completed rate and makespan; (4) each cell simulated from its own
config.json on the cost model fitted on the H200's Figure 2 runs
(results/reproduce/opt-13b-h200/calibration/cost.json), the simulation the folder
results/reference/fig2-13-x6-sim made its prediction with: batches and makespans beside the
real ones; (5) the setting's free parameter, the number of requests: the same cells simulated
with 200 to 3,000 requests, each level's verdict and paged / orca-oracle's. Every number is read
from sweep.csv and the cells' config.json, or simulated from them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvbench.calibrate.check import read_config
from kvbench.paper import FIG13_BATCHED
from kvbench.reproduce.engines import FIG13_METRIC
from kvbench.reproduce.verdicts import TOLERANCE, Interval, order_verdict, ratio_verdict, value_verdict
from kvbench.results.files import write_text
from kvbench.results.load import load_sweep
from kvbench.simulate import simulate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
COST = ROOT / "results" / "reproduce" / "opt-13b-h200" / "calibration" / "cost.json"
TRACE = "alpaca-paper"
ENGINES = ("paged", "orca-oracle", "orca-pow2", "orca-max", "static")
METRIC = "mean_batched_requests"
REQUESTS = (200, 500, 1000, 1500, 2000, 3000)  # the free parameter's values, simulated


def by_engine(cells) -> dict[str, list]:
    """Each engine's rows of sweep.csv, in seed order."""
    return {e: cells[cells.engine == e].sort_values("seed") for e in ENGINES}


def levels(rows: dict) -> dict[str, Interval]:
    out = {}
    for engine, frame in rows.items():
        values = [float(v) for v in frame[METRIC]]
        out[engine] = replace(Interval.of_samples(values), seeds=tuple(values))
    return out


def level_table(rows: dict, measured: dict[str, Interval]) -> list[str]:
    paper = FIG13_BATCHED[TRACE]
    seeds = [int(s) for s in rows["paged"].seed]
    lines = [
        "| engine | "
        + " | ".join(f"seed {s}" for s in seeds)
        + f" | mean [95 % CI] | paper | verdict (the paper's in the interval widened by {TOLERANCE:.0%}) |",
        "|---|" + "---:|" * len(seeds) + "---:|---:|---|",
    ]
    for engine in ENGINES:
        values = " | ".join(f"{v:.1f}" for v in measured[engine].seeds)
        interval = measured[engine]
        shown = f"{interval.value:.1f} [{interval.low:.1f}, {interval.high:.1f}]"
        if engine in paper:
            verdict = value_verdict(f"{engine} {FIG13_METRIC}", interval, paper[engine])
            lines.append(f"| {engine} | {values} | {shown} | {paper[engine]:.2f} | **{verdict.outcome}** |")
        else:
            lines.append(f"| {engine} | {values} | {shown} | not in the figure | - |")
    return lines


def verdicts(measured: dict[str, Interval]) -> list[str]:
    paper = FIG13_BATCHED[TRACE]
    metric = f"{TRACE} {FIG13_METRIC}"
    judged = {e: measured[e] for e in paper}
    found = [
        ratio_verdict(f"{metric}, paged/orca-oracle", measured["paged"], measured["orca-oracle"],
                      paper["paged"] / paper["orca-oracle"]),
        order_verdict(metric, judged, paper),
        *(value_verdict(f"{TRACE} {e} {FIG13_METRIC}", measured[e], paper[e]) for e in paper),
    ]  # fmt: skip
    return [f"- {v}" for v in found]


def ratio_table(measured: dict[str, Interval]) -> list[str]:
    paper = FIG13_BATCHED[TRACE]
    lines = [
        "| paged over | per seed | paired mean [95 % CI] | paper"
        f" | paired interval widened by {TOLERANCE:.0%} holds the paper's |",
        "|---|---|---:|---:|---|",
    ]
    paged = measured["paged"]
    for engine in ENGINES[1:]:
        other = measured[engine]
        per_seed = ", ".join(f"{a / b:.2f}" for a, b in zip(paged.seeds, other.seeds, strict=True))
        paired = other.paired_ratio(paged)
        shown = f"{paired.value:.2f} [{paired.low:.2f}, {paired.high:.2f}]"
        if engine in paper:
            ratio = paper["paged"] / paper[engine]
            low, high = paired.widened()
            held = "yes" if low <= ratio <= high else "no"
            lines.append(f"| {engine} | {per_seed} | {shown} | {ratio:.2f} | {held} |")
        else:
            lines.append(f"| {engine} | {per_seed} | {shown} | not in the figure | - |")
    return lines


def setting_table(rows: dict) -> list[str]:
    lines = [
        "| engine | seed | saturated share | peak batch | preemptions | completed | req/s completed"
        " | makespan s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for engine, frame in rows.items():
        for row in frame.itertuples():
            lines.append(
                f"| {engine} | {row.seed} | {row.saturated_share:.2f} | {row.peak_batched_requests} | "
                f"{row.num_preemptions} | {row.completed} | {row.request_throughput:.1f} | "
                f"{row.makespan_s:.1f} |"
            )
    return lines


def cell_configs(sweep, frame) -> list:
    """Each row's cell config, priced by the H200 fit on the CPU."""
    folders = {p.name: p for p in sweep.folders}
    return [
        replace(read_config(folders[row.cell_id]), device="cpu", cost_model=str(COST))
        for row in frame.itertuples()
    ]


def simulated_table(sweep, rows: dict) -> list[str]:
    lines = [
        "| engine | real mean batched (per seed) | simulated on the H200 fit (per seed)"
        " | simulated / real (per seed) | real makespan s | simulated makespan s |",
        "|---|---|---|---|---|---|",
    ]
    for engine, frame in rows.items():
        sims = [simulate(config).summary for config in cell_configs(sweep, frame)]
        real = [float(v) for v in frame[METRIC]]
        sim = [summary[METRIC] for summary in sims]
        lines.append(
            f"| {engine} | {', '.join(f'{v:.1f}' for v in real)} | {', '.join(f'{v:.1f}' for v in sim)} | "
            f"{', '.join(f'{s / r:.3f}' for s, r in zip(sim, real, strict=True))} | "
            f"{', '.join(f'{v:.1f}' for v in frame.makespan_s)} | "
            f"{', '.join(f'{m:.1f}' for m in (summary['makespan_s'] for summary in sims))} |"
        )
    return lines


def requests_table(sweep, rows: dict) -> list[str]:
    """The free parameter: the same cells simulated with other numbers of requests (the same
    rate, seeds and arrivals' process), each engine's mean over the seeds and its verdict, and
    paged / orca-oracle by the figure's ratio verdict and seed by seed."""
    paper = FIG13_BATCHED[TRACE]
    engines = [e for e in ENGINES if e in paper]
    lines = [
        "| requests | " + " | ".join(f"{e} mean (verdict)" for e in engines)
        + " | paged / orca-oracle (verdict) | paired, seed by seed |",
        "|---:|" + "---|" * len(engines) + "---|---|",
    ]  # fmt: skip
    configs = {e: cell_configs(sweep, rows[e]) for e in engines}
    for n in REQUESTS:
        found = {}
        for engine in engines:
            values = [
                simulate(replace(c, workload=replace(c.workload, num_requests=n))).summary[METRIC]
                for c in configs[engine]
            ]
            found[engine] = replace(Interval.of_samples(values), seeds=tuple(values))
        cells = [f"{found[e].value:.1f} ({value_verdict(e, found[e], paper[e]).outcome})" for e in engines]
        ratio = ratio_verdict(
            "ratio", found["paged"], found["orca-oracle"], paper["paged"] / paper["orca-oracle"]
        )
        paired = found["orca-oracle"].paired_ratio(found["paged"])
        lines.append(
            f"| {n:,} | "
            + " | ".join(cells)
            + f" | {ratio.evidence.split(' (')[0].removeprefix('kvbench ')} "
            f"({ratio.outcome}) | {paired.value:.2f} [{paired.low:.2f}, {paired.high:.2f}] |"
        )
    return lines


def main() -> None:
    sweep = load_sweep(HERE)
    rows = by_engine(sweep.cells)
    measured = levels(rows)
    parts = [
        f"## {FIG13_METRIC.capitalize()}, three seeds", "", *level_table(rows, measured), "",
        f"## Verdicts (kvbench.reproduce.verdicts, tolerance {TOLERANCE:.0%})", "", *verdicts(measured), "",
        "## Paged over each engine, seed by seed", "", *ratio_table(measured), "",
        "## The setting each run held", "", *setting_table(rows), "",
        "## Each cell simulated on the H200's Figure 2 fit", "", *simulated_table(sweep, rows), "",
        "## The number of requests, simulated: each cell's config on the H200's Figure 2 fit", "",
        *requests_table(sweep, rows), "",
    ]  # fmt: skip
    write_text(HERE / "table.md", "\n".join(parts))
    print("\n".join(parts))


if __name__ == "__main__":
    main()
