"""Figure 12's Alpaca cells of every seed: what moved paged's sustained rate between seeds 0 and 1.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. \
        python results/reproduce/opt-13b-h200/fig12_alpaca_seeds.py

Writes fig12/alpaca-seeds.md: for every loaded paged and orca-oracle cell of the seeds' panels
(`fig12/seed-<s>/alpaca-paper/`) and of the earlier panels of seeds 0 and 1, run at other commits
and kept as evidence (`fig12/seed-<s>/earlier/alpaca-paper/`), the kvbench commit it ran at
(env.json), its decode and prefill steps (count, mean ms, the median prefill and requests per
prefill, from steps.csv), and its normalized latency, mean batch and preemptions beside a
simulation of its own config.json on the cost model calibrated on seed 0's cells
(`calibration/cost.json`). A cell the simulator prices well ran as seed 0's did; one it
overprices ran faster steps than those it was fitted on.

A second table takes every engine's loaded cells: their short prefill steps (at most
`SHORT_PREFILL` tokens, a device floor of 5.6 ms on OPT-13B, the weights read once, where the
host launching every op of every layer sets the time). Their times fall in two modes, near
12-14 ms and near 20-23 ms, in stretches of a run, in every engine's cells; a cell's share of
steps in the slower mode (above `SLOW_MODE` x its 10th percentile) and the seconds they took
say how much host speed moved it.
About a minute on a 2-core CPU.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from kvbench.calibrate.check import read_config
from kvbench.results.files import write_text
from kvbench.results.load import load_run
from kvbench.simulate import simulate

HERE = Path(__file__).resolve().parent
COST = HERE / "calibration" / "cost.json"
ENGINES = ("paged", "orca-oracle")
ALL_ENGINES = ("static", "orca-max", "orca-pow2", "orca-oracle", "paged")
SHORT_PREFILL = 64  # tokens: 4 padding buckets of 16 (kvbench.real.model_runner.padded_tokens)
SLOW_MODE = 1.5  # x a cell's 10th-percentile short prefill: the slower mode sits near 1.7-1.8 x


SEEDS = (0, 1, 2)
PANELS = ("earlier/alpaca-paper", "alpaca-paper")  # a seed's panel set aside, then the one that replaced it


def cells(seed: int, panel: str, engine: str) -> list[Path]:
    folders = (HERE / "fig12" / f"seed-{seed}" / panel / "cells").glob(f"{engine}__*")
    loaded = [f for f in folders if "rate-unloaded" not in f.name]
    return sorted(loaded, key=lambda f: json.loads((f / "config.json").read_text())["workload"]["rate"])


def row(seed: int, engine: str, folder: Path) -> str:
    run = load_run(folder)
    steps, summary = run.steps, run.summary
    config = read_config(folder)
    sim = simulate(replace(config, device="cpu", cost_model=str(COST))).summary
    sha = json.loads((folder / "env.json").read_text())["git_sha"][:7]
    decode, prefill = steps[steps.kind == "decode"], steps[steps.kind == "prefill"]
    values = [
        f"{seed}", engine, f"{config.workload.rate:g}", sha,
        f"{decode.num_steps.sum()} x {1e3 * decode.duration_s.sum() / decode.num_steps.sum():.2f}",
        f"{prefill.num_steps.sum()} x {1e3 * prefill.duration_s.sum() / prefill.num_steps.sum():.2f}",
        f"{1e3 * prefill.duration_s.median():.2f}", f"{prefill.batch_size.mean():.2f}",
        f"{summary['normalized_latency_s']:.4f}", f"{sim['normalized_latency_s']:.4f}",
        f"{summary['mean_batched_requests']:.1f}", f"{sim['mean_batched_requests']:.1f}",
        f"{summary['num_preemptions']}", f"{sim['num_preemptions']}",
    ]  # fmt: skip
    return "| " + " | ".join(values) + " |"


def prefill_modes(seed: int, engine: str, folder: Path) -> str | None:
    """A row of the second table: `folder`'s short prefill steps, None where it has under 20."""
    run = load_run(folder)
    steps = run.steps
    short = steps[(steps.kind == "prefill") & (steps.num_tokens <= SHORT_PREFILL)].duration_s
    if len(short) < 20:
        return None
    p10, p50, p90 = (float(short.quantile(q)) for q in (0.1, 0.5, 0.9))
    slow = short[short > SLOW_MODE * p10]
    rate = json.loads((folder / "config.json").read_text())["workload"]["rate"]
    sha = json.loads((folder / "env.json").read_text())["git_sha"][:7]
    values = [
        f"{seed}", engine, f"{rate:g}", sha, f"{len(short)}",
        f"{1e3 * p10:.1f} / {1e3 * p50:.1f} / {1e3 * p90:.1f}", f"{100 * len(slow) / len(short):.0f}",
        f"{slow.sum():.1f} of {steps.duration_s.sum():.1f}", f"{run.summary['normalized_latency_s']:.4f}",
    ]  # fmt: skip
    return "| " + " | ".join(values) + " |"


def main() -> None:
    lines = [
        "| seed | engine | rate req/s | kvbench | decode steps x ms | prefill steps x ms | median prefill ms "
        "| requests a prefill | norm. latency real | simulated | batched real | simulated "
        "| preemptions real | simulated |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed in SEEDS:
        for panel in PANELS:
            for engine in ENGINES:
                lines += [row(seed, engine, folder) for folder in cells(seed, panel, engine)]
    lines += [
        "",
        f"Short prefill steps (at most {SHORT_PREFILL} tokens) of every engine's loaded cells: "
        f"10th, 50th and 90th percentile ms, the share above {SLOW_MODE:g} x the 10th percentile "
        "(the slower mode) and the seconds those took of the run's busy time.",
        "",
        "| seed | engine | rate req/s | kvbench | short prefills | p10 / p50 / p90 ms | slower mode % "
        "| s in the slower mode | norm. latency |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for seed in SEEDS:
        for panel in PANELS:
            for engine in ALL_ENGINES:
                modes = (prefill_modes(seed, engine, folder) for folder in cells(seed, panel, engine))
                lines += [line for line in modes if line is not None]
    write_text(HERE / "fig12" / "alpaca-seeds.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
