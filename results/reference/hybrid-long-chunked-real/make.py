"""Tables of this folder's real chunked cells beside the unchunked ones and the prediction.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. python results/reference/hybrid-long-chunked-real/make.py

Writes table.md beside this file: (1) each engine's real chunked cell (this folder), its real
unchunked cell (results/reference/hybrid-long-real), the prediction made before the chunked run
(results/reference/hybrid-long-chunked-sim's fitted costs, the unchunked cell's KV budget) and
the same costs at the chunked cell's own budget; (2) where the busy time went, decode-only steps
against steps that ran prompt tokens; (3) the chunked cells' mixed steps by the K/V slots they
read, measured against what the fitted costs price them at. Every number is read from the
cells' summary.json and steps.csv, or simulated from their config.json.
"""

from __future__ import annotations

import runpy
from dataclasses import replace
from pathlib import Path

import numpy as np

from kvbench.calibrate.check import read_config
from kvbench.calibrate.fit import FITTED, load_cost_model, predict, read_rows
from kvbench.results.files import write_text
from kvbench.results.load import Run, load_run
from kvbench.simulate import simulate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
UNCHUNKED = HERE.parent / "hybrid-long-real"
COST = HERE.parent / "hybrid-long-chunked-sim" / "calibration" / "cost.json"  # fitted on unchunked cells
ENGINES = ("paged", "hybrid", "jenga")
BIN = 40_000  # K/V slots read a step: the mixed-step table's bin width
# the columns of the simulated tables beside these (label, summary key, format)
COLUMNS = runpy.run_path(str(HERE.parent / "hybrid-long-chunked-sim" / "make.py"))["COLUMNS"]


def runs(folder: Path) -> dict[str, Run]:
    found = {
        run.engine: run
        for run in map(load_run, sorted(p.parent for p in folder.glob("cells/*/summary.json")))
    }
    return {engine: found[engine] for engine in ENGINES}


def gib(run: Run) -> float:
    return run.summary["kv_budget_bytes"] / 2**30


def simulated(run: Run, budget_of: Run, **changes) -> dict:
    """`run`'s own config on the fitted costs, with the KV budget `budget_of` measured."""
    config = replace(read_config(run.path), kv_cache_gib=gib(budget_of), device="cpu", cost_model=str(COST))
    return simulate(replace(config, **changes)).summary


def line(engine: str, how: str, budget: float, summary: dict) -> str:
    values = " | ".join(form.format(summary[key]) for _, key, form in COLUMNS)
    return f"| {engine} | {how} | {budget:.1f} | {values} |"


def results_table(chunked: dict[str, Run], unchunked: dict[str, Run]) -> list[str]:
    lines = [
        "| engine | run | KV GiB | " + " | ".join(name for name, _, _ in COLUMNS) + " |",
        "|---|---|---:|" + "---:|" * len(COLUMNS),
    ]
    for engine in ENGINES:
        real, before = chunked[engine], unchunked[engine]
        lines += [
            line(engine, "real, unchunked", gib(before), before.summary),
            line(engine, "predicted: fitted costs, chunked, unchunked cell's budget", gib(before),
                 simulated(before, before, chunked_prefill=True)),
            line(engine, "fitted costs, chunked, this cell's budget", gib(real), simulated(real, real)),
            line(engine, "**real, chunked 2,048**", gib(real), real.summary),
        ]  # fmt: skip
    return lines


def time_table(chunked: dict[str, Run], unchunked: dict[str, Run]) -> list[str]:
    lines = [
        "| engine | run | busy s | decode-only steps | their s | ms a step | decode rows a step"
        " | steps with prompt tokens | their s | ms a step | prompt tokens a step | rows a step |",
        "|---|---|" + "---:|" * 10,
    ]
    for engine in ENGINES:
        for how, run in (("unchunked", unchunked[engine]), ("chunked", chunked[engine])):
            steps = run.steps
            decode, prompt = steps[steps.kind == "decode"], steps[steps.kind != "decode"]
            n = int(decode.num_steps.sum())
            values = [
                f"{steps.duration_s.sum():.1f}",
                f"{n:,}",
                f"{decode.duration_s.sum():.1f}",
                f"{1e3 * decode.duration_s.sum() / n:.1f}",
                f"{(decode.batch_size * decode.num_steps).sum() / n:.1f}",
                f"{len(prompt):,}",
                f"{prompt.duration_s.sum():.1f}",
                f"{1e3 * prompt.duration_s.mean():.1f}",
                f"{prompt.num_tokens.mean():,.0f}",
                f"{prompt.batch_size.mean():.1f}",
            ]
            lines.append(f"| {engine} | {how} | " + " | ".join(values) + " |")
    return lines


def priced(run: Run, fitted: Path = COST) -> np.ndarray:
    """Each steps.csv row's duration as the costs `fitted` price it `[R]` (a mixed row as a
    prefill of all its tokens, `kvbench.cost_model`)."""
    cost = load_cost_model(str(fitted), run.summary["model"])  # a term fitted later prices at 0
    constants = np.array([getattr(cost, name) for name in FITTED] + [cost.per_row_above_knee_s])
    rows = read_rows(run.path)
    return predict(rows.counts, rows.batch, constants, cost.knee_batch)


def mixed_table(chunked: dict[str, Run]) -> list[str]:
    lines = [
        "| engine | K/V slots read a step | mixed steps | measured ms a step | priced ms a step"
        " | measured / priced | rows a step (decodes and chunks) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for engine in ENGINES:
        run = chunked[engine]
        steps = run.steps.assign(priced_s=priced(run))
        mixed = steps[steps.kind == "mixed"]
        for low, group in mixed.groupby((mixed.kv_tokens_read // BIN) * BIN):
            ratio = group.duration_s.sum() / group.priced_s.sum()
            values = [
                f"{int(low):,}-{int(low) + BIN:,}",
                f"{len(group)}",
                f"{1e3 * group.duration_s.mean():.1f}",
                f"{1e3 * group.priced_s.mean():.1f}",
                f"{ratio:.2f}",
                f"{group.batch_size.mean():.1f}",
            ]
            lines.append(f"| {engine} | " + " | ".join(values) + " |")
    return lines


def main() -> None:
    chunked, unchunked = runs(HERE), runs(UNCHUNKED)
    lines = [
        *results_table(chunked, unchunked),
        "",
        "Where the busy time went (decode-only steps replay CUDA graphs; a step with prompt tokens"
        " runs eagerly through the prefill path, a whole prompt unchunked, a mixed step chunked):",
        "",
        *time_table(chunked, unchunked),
        "",
        "The chunked cells' mixed steps by the K/V slots they read (`kv_tokens_read`), measured and"
        " as the fitted costs price them:",
        "",
        *mixed_table(chunked),
    ]
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
