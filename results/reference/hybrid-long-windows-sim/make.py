"""Is the real long-context window typical? The same setting simulated on ten windows of the trace.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. python results/reference/hybrid-long-windows-sim/make.py

results/reference/hybrid-long-real ran Gemma 3 12B on the first 30 s of Mooncake's conversation
trace only. Here each of its four cells (paged, hybrid, jenga, orca-oracle) is simulated from its
own config.json, with the KV budget that cell measured and the step costs fitted on its paged and
orca-oracle cells (results/reference/hybrid-long-chunked-sim/calibration/cost.json), on ten
30-second windows spread evenly over the trace's hour (starting every 350 s), the first one the
real run's. Writes table.md beside this file. One simulation per (window, engine): a replay at
the trace's timestamps has nothing a seed varies.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from statistics import median

from kvbench.calibrate.check import read_config
from kvbench.results.files import write_text
from kvbench.results.load import load_run
from kvbench.simulate import simulate
from workloads.spec import build_trace

HERE = Path(__file__).resolve().parent
REAL = HERE.parent / "hybrid-long-real"
COST = HERE.parent / "hybrid-long-chunked-sim" / "calibration" / "cost.json"
ENGINES = ("paged", "hybrid", "jenga", "orca-oracle")
STARTS = tuple(range(0, 3500, 350))  # window starts, s: ten windows over the trace's 3,537 s
REAL_RATIO = 0.816 / 0.710  # hybrid / paged completed req/s of the real window (its README)


def configs(real: Path = REAL, cost: Path = COST, engines: tuple[str, ...] = ENGINES) -> dict:
    """Each engine's cell config in `real`, simulated on the CPU with the costs fitted in `cost`
    and the KV budget that cell measured."""
    out = {}
    for summary in sorted(real.glob("cells/*/summary.json")):
        run = load_run(summary.parent)
        gib = run.summary["kv_budget_bytes"] / 2**30
        out[run.engine] = replace(read_config(run.path), kv_cache_gib=gib, device="cpu", cost_model=str(cost))
    return {engine: out[engine] for engine in engines}


def window_rows() -> list[dict]:
    rows = []
    for start in STARTS:
        row: dict = {"start": start}
        for engine, config in configs().items():
            workload = replace(config.workload, window_start_s=float(start))
            if "requests" not in row:
                trace = build_trace(workload)
                row["requests"] = len(trace.requests)
                row["prompt_tokens"] = sum(r.prompt_len for r in trace.requests)
            row[engine] = simulate(replace(config, workload=workload)).summary
        rows.append(row)
    return rows


def ratio(row: dict, engine: str) -> float:
    return row[engine]["request_throughput"] / row["paged"]["request_throughput"]


def main() -> None:
    rows = window_rows()
    lines = [
        "| window s | requests | prompt tokens | paged req/s | hybrid / paged | jenga / paged"
        " | orca-oracle / paged | p99 TPOT s, paged | p99 TPOT s, hybrid | batched, paged"
        " | batched, hybrid |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        values = [
            f"{row['start']}-{row['start'] + 30}",
            f"{row['requests']}",
            f"{row['prompt_tokens']:,}",
            f"{row['paged']['request_throughput']:.3f}",
            f"{ratio(row, 'hybrid'):.3f}",
            f"{ratio(row, 'jenga'):.3f}",
            f"{ratio(row, 'orca-oracle'):.3f}",
            f"{row['paged']['p99_tpot_s']:.3f}",
            f"{row['hybrid']['p99_tpot_s']:.3f}",
            f"{row['paged']['mean_batched_requests']:.1f}",
            f"{row['hybrid']['mean_batched_requests']:.1f}",
        ]
        lines.append("| " + " | ".join(values) + " |")
    hybrid = [ratio(row, "hybrid") for row in rows]
    lines += [
        "",
        f"hybrid / paged over the ten windows: median {median(hybrid):.3f}, from {min(hybrid):.3f}"
        f" to {max(hybrid):.3f}; the first window simulated {hybrid[0]:.3f}, real {REAL_RATIO:.3f}.",
    ]
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
