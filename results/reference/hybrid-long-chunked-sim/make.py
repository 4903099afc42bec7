"""Chunked prefill on the long-context Gemma 3 window, simulated on the real runs' own cells.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. python results/reference/hybrid-long-chunked-sim/make.py

Each cell of results/reference/hybrid-long-real (paged, hybrid, jenga, orca-oracle on Gemma 3 12B,
the first 30 s of Mooncake's conversation trace at its own timestamps) is simulated from its own
config.json, its KV budget pinned to the one the real cell measured, without chunking and with
`--chunked-prefill` at several per-step token budgets (`--max-num-batched-tokens`; 131,072 is
the model's maximum length, the unchunked default: a whole prompt of this window fits a step,
so chunking changes little; 2,048 is the chunked default). Writes table.md beside this file.
One run per cell: a replay at the trace's timestamps on the simulator's step clock has nothing
a seed varies.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvbench.calibrate.check import read_config
from kvbench.results.files import write_text
from kvbench.results.load import load_run
from kvbench.simulate import simulate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
REAL = HERE.parent / "hybrid-long-real"
ENGINES = ("paged", "hybrid", "jenga", "orca-oracle")
# fitted on the real paged and orca-oracle cells (the command: README.md)
COST = HERE / "calibration" / "cost.json"
BUDGETS = (131072, 16384, 8192, 2048)  # --max-num-batched-tokens under --chunked-prefill
COLUMNS = (
    ("req/s", "request_throughput", "{:.3f}"),
    ("output tok/s", "output_token_throughput", "{:.0f}"),
    ("mean TTFT s", "mean_ttft_s", "{:.1f}"),
    ("p99 TTFT s", "p99_ttft_s", "{:.1f}"),
    ("mean TPOT s", "mean_tpot_s", "{:.3f}"),
    ("p99 TPOT s", "p99_tpot_s", "{:.3f}"),
    ("batched req.", "mean_batched_requests", "{:.1f}"),
    ("preemptions", "num_preemptions", "{}"),
)


def real_runs() -> dict:
    folders = sorted(summary.parent for summary in REAL.glob("cells/*/summary.json"))
    runs = {run.engine: run for run in map(load_run, folders)}
    return {engine: runs[engine] for engine in ENGINES}


def cell_config(run) -> object:
    """The real cell's config.json, simulated on the CPU with the arena the real cell measured."""
    gib = run.summary["kv_budget_bytes"] / 2**30
    return replace(read_config(run.path), kv_cache_gib=gib, device="cpu")


def rows() -> list[tuple[str, str, dict]]:
    """Each cell on the roofline, unchunked and chunked at every budget."""
    out = []
    for engine, run in real_runs().items():
        base = cell_config(run)
        out.append((engine, "unchunked", simulate(base).summary))
        for budget in BUDGETS:
            config = replace(base, chunked_prefill=True, max_num_batched_tokens=budget)
            out.append((engine, f"chunked {budget:,}", simulate(config).summary))
    return out


def header() -> list[str]:
    return [
        "| engine | run | " + " | ".join(name for name, _, _ in COLUMNS) + " |",
        "|---|---|" + "---:|" * len(COLUMNS),
    ]


def line(engine: str, how: str, summary: dict) -> str:
    return f"| {engine} | {how} | " + " | ".join(form.format(summary[key]) for _, key, form in COLUMNS) + " |"


def calibrated_rows() -> list[str]:
    """Each engine's real cell, its simulation on the fitted costs, and the same chunked at the
    default 2,048-token budget: what the real chunked run should show, written before it ran."""
    lines = header()
    for engine, run in real_runs().items():
        base = replace(cell_config(run), cost_model=str(COST.relative_to(ROOT)))
        lines.append(line(engine, "real (unchunked)", run.summary))
        lines.append(line(engine, "simulated, fitted costs", simulate(base).summary))
        chunked = simulate(replace(base, chunked_prefill=True)).summary
        lines.append(line(engine, "simulated, fitted costs, chunked 2,048", chunked))
    return lines


def main() -> None:
    lines = header() + [line(engine, how, summary) for engine, how, summary in rows()]
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    calibrated = calibrated_rows()
    write_text(HERE / "table-calibrated.md", "\n".join(calibrated) + "\n")
    print("\n".join([*lines, "", *calibrated]))


if __name__ == "__main__":
    main()
