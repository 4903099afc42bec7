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
REAL = HERE.parent / "hybrid-long-real"
ENGINES = ("paged", "hybrid", "jenga", "orca-oracle")
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


def rows() -> list[tuple[str, str, dict]]:
    out = []
    runs = {
        run.engine: run for run in map(load_run, sorted(p.parent for p in REAL.glob("cells/*/summary.json")))
    }
    for engine in ENGINES:
        run = runs[engine]
        base = replace(
            read_config(run.path), kv_cache_gib=run.summary["kv_budget_bytes"] / 2**30, device="cpu"
        )
        out.append((engine, "off", simulate(base).summary))
        for budget in BUDGETS:
            config = replace(base, chunked_prefill=True, max_num_batched_tokens=budget)
            out.append((engine, f"on, {budget:,}", simulate(config).summary))
    return out


def main() -> None:
    lines = [
        "| engine | chunked prefill, step budget | " + " | ".join(name for name, _, _ in COLUMNS) + " |",
        "|---|---|" + "---:|" * len(COLUMNS),
    ]
    for engine, how, summary in rows():
        values = [form.format(summary[key]) for _, key, form in COLUMNS]
        lines.append(f"| {engine} | {how} | " + " | ".join(values) + " |")
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
