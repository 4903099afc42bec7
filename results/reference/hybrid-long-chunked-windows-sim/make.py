"""The chunked long-context windows, predicted before they run: Gemma 3 12B under chunked prefill
on three 30 s windows of Mooncake's conversation trace, simulated on costs fitted to real chunked
steps of the first window only.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. \
        python results/reference/hybrid-long-chunked-windows-sim/make.py

Each engine's cell of results/reference/hybrid-long-chunked-warm-real (paged, hybrid, jenga: the
first 30 s, `--chunked-prefill` at 2,048 tokens a step, the KV budget an H200 leaves the model) is
simulated from its own config.json, with the KV budget that cell measured and the step costs
fitted on the chunked paged cell of results/reference/hybrid-long-chunked-split-real
(`calibration/cost.json`: a price per query-key pair for the prompt chunks), on the windows
starting at 0, 350 and 700 s. The windows at 350 and 700 s are what `tools/device_call.sh
hybrid-long-chunked-windows` runs for real: their requests were never seen by the fit, so the
real runs check this prediction out of sample (results/reference/hybrid-long-chunked-windows-real).
Writes prediction.json (every predicted metric) and table.md beside this file. One simulation
per (window, engine): a replay at the trace's timestamps has nothing a seed varies.
"""

from __future__ import annotations

import json
import runpy
from dataclasses import replace
from pathlib import Path

from kvbench.results.files import write_text
from kvbench.simulate import simulate
from workloads.spec import build_trace

HERE = Path(__file__).resolve().parent
WINDOWS = runpy.run_path(str(HERE.parent / "hybrid-long-windows-sim" / "make.py"))
REAL = HERE.parent / "hybrid-long-chunked-warm-real"
COST = HERE.parent / "hybrid-long-chunked-split-real" / "calibration" / "cost.json"
ENGINES = ("paged", "hybrid", "jenga")
STARTS = (0, 350, 700)  # window starts, s; the first is the fitted window's
METRICS = (  # summary.json key, table heading, digits
    ("request_throughput", "req/s", 3),
    ("mean_ttft_s", "mean TTFT s", 1),
    ("p99_ttft_s", "p99 TTFT s", 1),
    ("mean_tpot_s", "mean TPOT s", 3),
    ("p99_tpot_s", "p99 TPOT s", 3),
    ("mean_batched_requests", "batched req.", 1),
)


def configs() -> dict:
    """Each engine's real chunked cell config, simulated on the CPU with the fitted costs and the
    KV budget the cell measured (results/reference/hybrid-long-windows-sim's reading of a cell)."""
    return WINDOWS["configs"](REAL, COST, ENGINES)


def predict() -> list[dict]:
    """One row per window: its requests, prompt tokens and each engine's predicted metrics."""
    rows = []
    engines = configs()
    for start in STARTS:
        row: dict = {"window_start_s": start}
        for engine, config in engines.items():
            workload = replace(config.workload, window_start_s=float(start))
            if "requests" not in row:
                trace = build_trace(workload)
                row["requests"] = len(trace.requests)
                row["prompt_tokens"] = sum(r.prompt_len for r in trace.requests)
            summary = simulate(replace(config, workload=workload)).summary
            row[engine] = {key: summary[key] for key, _, _ in METRICS}
        rows.append(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| window s | requests | prompt tokens | engine | " + " | ".join(h for _, h, _ in METRICS) + " |",
        "|---|---:|---:|---|" + "---:|" * len(METRICS),
    ]
    for row in rows:
        for engine in ENGINES:
            values = [f"{row[engine][key]:.{digits}f}" for key, _, digits in METRICS]
            lines.append(
                f"| {row['window_start_s']}-{row['window_start_s'] + 30} | {row['requests']} "
                f"| {row['prompt_tokens']:,} | {engine} | " + " | ".join(values) + " |"
            )
    return lines


def main() -> None:
    rows = predict()
    write_text(HERE / "prediction.json", json.dumps({"cost_model": str(COST.relative_to(HERE.parents[2])),
                                                     "windows": rows}, indent=1) + "\n")  # fmt: skip
    lines = table(rows)
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
