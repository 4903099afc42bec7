"""Tables of this folder's real cells, where their time went, and the simulator on the same cells.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. python results/reference/hybrid-long-real/make.py

Writes table.md beside this file. Every number comes from the cells' summary.json, steps.csv and
requests.csv, or from simulating each cell's own config.json (the H200 roofline cost model) with
the KV budget that cell measured: the real runs size the arena from the weights and activations
they measured, which the simulator, given only `--emulate-gpu`, would estimate instead (8.69 GiB
of activations against 18.75-18.78 measured: 10 GiB more KV), so the budget is pinned to make
the simulated cell the same setting. One run per engine (seed 0; a replay at the trace's own
timestamps has nothing else a seed varies).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from kvbench.calibrate.check import read_config
from kvbench.results.files import write_text
from kvbench.results.load import Run, load_run
from kvbench.simulate import simulate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
ENGINES = ("paged", "hybrid", "jenga", "orca-oracle")
LLAMA = ROOT / "results/reference/mooncake-window-real"  # the same window on Llama-3.1-8B
WHOLE = ROOT / "results/reference/hybrid-occupancy-sim/table-long.md"  # the whole trace, simulated
STALL_S = 5.0  # an inter-token gap this long is a stall, not a slow decode step


def cells(folder: Path) -> dict[str, Run]:
    runs = [load_run(summary.parent) for summary in sorted((folder / "cells").glob("*/summary.json"))]
    return {run.engine: run for run in runs}


def pct(value: float | None) -> str:
    return (
        "n/a" if value is None or math.isnan(value) else f"{round(100 * value, 1) + 0.0:.1f}"
    )  # never "-0.0"


def results_table(runs: dict[str, Run]) -> list[str]:
    head = (
        "| engine | requests done | makespan s | req/s | output tok/s | total tok/s | mean TTFT s"
        " | p99 TTFT s | mean TPOT s | median TPOT s | p99 TPOT s | batched req. (busy / sat.) | peak batched"
        " | saturated % | preemptions | wall s |"
    )
    lines = [head, "|---|" + "---:|" * 15]
    for engine, run in runs.items():
        s = run.summary
        values = [
            f"{s['completed']} of {s['num_requests']}",
            f"{s['makespan_s']:.1f}",
            f"{s['request_throughput']:.3f}",
            f"{s['output_token_throughput']:.0f}",
            f"{s['total_token_throughput']:,.0f}",
            f"{s['mean_ttft_s']:.1f}",
            f"{s['p99_ttft_s']:.1f}",
            f"{s['mean_tpot_s']:.3f}",
            f"{s['median_tpot_s']:.3f}",
            f"{s['p99_tpot_s']:.3f}",
            f"{s['mean_batched_requests']:.1f} / {s['mean_batched_requests_saturated']:.1f}",
            f"{s['peak_batched_requests']}",
            pct(s["saturated_s"] / s["busy_s"]),
            f"{s['num_preemptions']}",
            f"{wall_s(run):.0f}",
        ]
        lines.append(f"| {engine} | " + " | ".join(values) + " |")
    return lines


def wall_s(run: Run) -> float:
    sweep = pd.read_csv(HERE / "sweep.csv")
    return float(sweep.loc[sweep.cell_id == run.path.name, "wall_s"].iloc[0])


def occupancy_table(runs: dict[str, Run], key: str) -> list[str]:
    columns = [c for c in next(iter(runs.values())).summary[key] if c != "mapped_idle"]
    lines = ["| engine | " + " | ".join(f"{c} %" for c in columns) + " |", "|---|" + "---:|" * len(columns)]
    for engine, run in runs.items():
        lines.append(f"| {engine} | " + " | ".join(pct(run.summary[key][c]) for c in columns) + " |")
    return lines


def prefill_runs(steps: pd.DataFrame) -> list[tuple[float, int, float]]:
    """Stretches of consecutive prefill rows: (seconds, rows, start s), longest first. Nothing
    decodes during one (a step with new prompts runs them alone)."""
    stretches: list[tuple[float, int, float]] = []
    length, rows, start = 0.0, 0, 0.0
    for kind, begin, duration in zip(steps.kind, steps.start_s, steps.duration_s, strict=True):
        if kind == "prefill":
            start = begin if rows == 0 else start
            length, rows = length + duration, rows + 1
        elif rows:
            stretches.append((length, rows, start))
            length, rows = 0.0, 0
    if rows:
        stretches.append((length, rows, start))
    return sorted(stretches, reverse=True)


def time_split(run: Run) -> dict:
    steps, requests = run.steps, run.requests
    prefill = steps[steps.kind == "prefill"]
    decode = steps[steps.kind != "prefill"]
    longest = prefill_runs(steps)[0]
    decode_steps = int(decode.num_steps.sum())
    slot_s = run.summary["num_slots"] * float(steps.duration_s.sum())  # the arena over the busy time
    return {
        "prefill_share": float(prefill.duration_s.sum() / steps.duration_s.sum()),
        # rows weighted by their duration, as the summary's busy-weighted occupancy is
        "behind_in_prefill": float((prefill.outside_window * prefill.duration_s).sum()) / slot_s,
        "behind": float((steps.outside_window * steps.duration_s).sum()) / slot_s,
        "prefill_rows": len(prefill),
        "prefill_s": float(prefill.duration_s.sum()),
        "prompt_tokens": int(prefill.num_tokens.sum()),
        "prefill_batch": float(prefill.batch_size.mean()),
        "longest_prefill": float(prefill.duration_s.max()),
        "stretch": longest,
        "decode_steps": decode_steps,
        "decode_s": float(decode.duration_s.sum()),
        "decode_step_ms": 1e3 * float(decode.duration_s.sum()) / max(decode_steps, 1),
        "decode_batch": float((decode.batch_size * decode.num_steps).sum()) / max(decode_steps, 1),
        "stalled": int((requests.max_itl_s >= STALL_S).sum()),
        "num_requests": len(requests),
    }


def time_table(runs: dict[str, Run]) -> list[str]:
    head = (
        "| engine | prefill steps | prefill s | prompt tokens | prompt tok/s | requests a prefill step"
        " | longest prefill step s | longest prefill stretch s (steps, from s) | decode steps | decode s"
        " | decode step ms | decode batch | prefill % of busy | behind window % (busy): all / in prefill rows"
        f" | requests with a gap ≥ {STALL_S:g} s |"
    )
    lines = [head, "|---|" + "---:|" * 14]
    for engine, run in runs.items():
        t = time_split(run)
        length, rows, start = t["stretch"]
        values = [
            f"{t['prefill_rows']}",
            f"{t['prefill_s']:.1f}",
            f"{t['prompt_tokens']:,}",
            f"{t['prompt_tokens'] / t['prefill_s']:,.0f}",
            f"{t['prefill_batch']:.2f}",
            f"{t['longest_prefill']:.2f}",
            f"{length:.1f} ({rows}, {start:.1f})",
            f"{t['decode_steps']:,}",
            f"{t['decode_s']:.1f}",
            f"{t['decode_step_ms']:.1f}",
            f"{t['decode_batch']:.1f}",
            pct(t["prefill_share"]),
            f"{pct(t['behind'])} / {pct(t['behind_in_prefill'])}",
            f"{t['stalled']} of {t['num_requests']}",
        ]
        lines.append(f"| {engine} | " + " | ".join(values) + " |")
    return lines


def tpot_tail(runs: dict[str, Run]) -> list[str]:
    """The requests behind each engine's p99 TPOT: with under 100 TPOTs p99 lies between the two
    largest, so the table shows those and what made them (their largest inter-token gap)."""
    counts = {int(run.requests.tpot_s.notna().sum()) for run in runs.values()}
    lines = [
        f"The three largest TPOTs of each engine (requests.csv; {' or '.join(map(str, sorted(counts)))}"
        " requests have a TPOT, the others one output token, so p99 lies between the two largest):",
        "",
    ]
    head = (
        "| engine | request | prompt tokens | output tokens | first token s | finish s | TPOT s"
        " | largest gap s |"
    )
    lines += [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for engine, run in runs.items():
        top = run.requests.sort_values("tpot_s", ascending=False).head(3)
        for row in top.itertuples():
            values = [
                f"{row.request_id}",
                f"{row.prompt_len:,}",
                f"{row.output_len}",
                f"{row.first_token_s:.1f}",
                f"{row.finish_s:.1f}",
                f"{row.tpot_s:.3f}",
                f"{row.max_itl_s:.1f}",
            ]
            lines.append(f"| {engine} | " + " | ".join(values) + " |")
    return lines


def stretch_table(runs: dict[str, Run]) -> list[str]:
    """Each engine's longest prefill stretch: who waited, who ran (and so stalled), and why the
    stretch ended (the queue ran dry, or its head no longer fit)."""
    head = (
        "| engine | stretch s | from s | to s | prompts prefilled | running at its end"
        " | waiting at its end | free % of the arena at its end |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for engine, run in runs.items():
        steps = run.steps
        length, _, start = prefill_runs(steps)[0]
        inside = steps[
            (steps.kind == "prefill") & (steps.start_s >= start) & (steps.start_s < start + length)
        ]
        last = inside.iloc[-1]
        values = [
            f"{length:.1f}",
            f"{start:.1f}",
            f"{start + length:.1f}",
            f"{int(inside.batch_size.sum())}",
            f"{int(last.num_running)}",
            f"{int(last.num_waiting)}",
            pct(last.free / run.summary["num_slots"]),
        ]
        lines.append(f"| {engine} | " + " | ".join(values) + " |")
    return lines


def simulated(run: Run) -> dict:
    """The simulator on the cell's own config, its budget pinned to the one the cell measured."""
    gib = run.summary["kv_budget_bytes"] / 2**30
    config = replace(read_config(run.path), kv_cache_gib=gib, device="cpu")
    result = simulate(config)
    steps = pd.DataFrame([asdict(step) for step in result.run.steps])
    prefill = steps[steps.kind == "prefill"]
    summary = result.summary
    assert summary["num_slots"] == run.summary["num_slots"], "the simulated arena is not the real one"
    return summary | {
        "prefill_s": float(prefill.duration_s.sum()),
        "decode_s": float(steps.duration_s.sum() - prefill.duration_s.sum()),
        "stretch_s": prefill_runs(steps)[0][0],
    }


def real_vs_sim(runs: dict[str, Run]) -> tuple[list[str], list[str]]:
    sims = {engine: simulated(run) for engine, run in runs.items()}
    head = (
        "| engine | req/s (real / sim) | makespan s | prefill s | decode s | longest prefill stretch s"
        " | batched req. (sat.) | token states % (sat.) | behind window % (sat.) | mean TTFT s | p99 TPOT s"
        " | preemptions |"
    )
    lines = [head, "|---|" + "---:|" * 11]
    for engine, run in runs.items():
        r, s, t = run.summary, sims[engine], time_split(run)
        sat_r, sat_s = r["occupancy_saturated"], s["occupancy_saturated"]
        pairs = [
            (f"{r['request_throughput']:.3f}", f"{s['request_throughput']:.3f}"),
            (f"{r['makespan_s']:.1f}", f"{s['makespan_s']:.1f}"),
            (f"{t['prefill_s']:.1f}", f"{s['prefill_s']:.1f}"),
            (f"{t['decode_s']:.1f}", f"{s['decode_s']:.1f}"),
            (f"{t['stretch'][0]:.1f}", f"{s['stretch_s']:.1f}"),
            (f"{r['mean_batched_requests_saturated']:.1f}", f"{s['mean_batched_requests_saturated']:.1f}"),
            (pct(sat_r["token_states"]), pct(sat_s["token_states"])),
            (pct(sat_r["outside_window"]), pct(sat_s["outside_window"])),
            (f"{r['mean_ttft_s']:.1f}", f"{s['mean_ttft_s']:.1f}"),
            (f"{r['p99_tpot_s']:.3f}", f"{s['p99_tpot_s']:.3f}"),
            (f"{r['num_preemptions']}", f"{s['num_preemptions']}"),
        ]
        lines.append(f"| {engine} | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |")
    whole = whole_trace()
    base_r, base_s = runs["paged"].summary, sims["paged"]
    ratio_head = (
        "| engine | req/s over paged, real | simulated, this window | simulated, whole trace (table-long.md)"
        " | batched req. (sat.) over paged, real | simulated, this window |"
    )
    ratios = [ratio_head, "|---|---:|---:|---:|---:|---:|"]
    for engine, run in runs.items():
        if engine == "paged":
            continue
        r, s = run.summary, sims[engine]
        values = [
            f"{r['request_throughput'] / base_r['request_throughput']:.3f}",
            f"{s['request_throughput'] / base_s['request_throughput']:.3f}",
            f"{whole[engine] / whole['paged']:.3f}",
            f"{r['mean_batched_requests_saturated'] / base_r['mean_batched_requests_saturated']:.2f}",
            f"{s['mean_batched_requests_saturated'] / base_s['mean_batched_requests_saturated']:.2f}",
        ]
        ratios.append(f"| {engine} | " + " | ".join(values) + " |")
    slow = [
        "| engine | makespan, real over sim | prefill s, real over sim | decode s, real over sim"
        " | prefill % of busy (real / sim) |",
        "|---|---:|---:|---:|---:|",
    ]
    for engine, run in runs.items():
        s, t = sims[engine], time_split(run)
        values = [
            run.summary["makespan_s"] / s["makespan_s"],
            t["prefill_s"] / s["prefill_s"],
            t["decode_s"] / s["decode_s"],
        ]
        share = f"{pct(t['prefill_share'])} / {pct(s['prefill_s'] / s['busy_s'])}"
        slow.append(f"| {engine} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {share} |")
    return lines, [*ratios, "", *slow]


def whole_trace() -> dict[str, float]:
    """req/s of each engine in the simulated whole-trace replay (its first table's rows)."""
    rates = {}
    for line in WHOLE.read_text().splitlines():
        cols = [c.strip() for c in line.strip("|").split("|")]
        if cols[0] in ENGINES and re.fullmatch(r"[\d.]+", cols[3]):
            rates.setdefault(cols[0], float(cols[3]))
    return rates


def llama_line() -> list[str]:
    """The same window on Llama-3.1-8B under paged (results/reference/mooncake-window-real)."""
    llama = cells(LLAMA)
    lines = []
    for engine, run in llama.items():
        t = time_split(run)
        s = run.summary
        lines.append(
            f"- {run.summary['model']} {engine}: {t['prefill_s']:.1f} s of prefill steps for"
            f" {t['prompt_tokens']:,} prompt tokens ({t['prompt_tokens'] / t['prefill_s']:,.0f} tokens/s),"
            f" {t['decode_s']:.1f} s of decode steps, makespan {s['makespan_s']:.1f} s,"
            f" {pct(s['saturated_s'] / s['busy_s'])} % of the busy time saturated,"
            f" token states {pct(s['occupancy_saturated']['token_states'])} %"
            f" and free {pct(s['occupancy_saturated']['free'])} % (saturated-weighted),"
            f" {s['num_preemptions']} preemptions; its longest stretch of prefill steps"
            f" {t['stretch'][0]:.1f} s ({t['stretch'][1]} steps from {t['stretch'][2]:.1f} s),"
            f" TPOT mean {s['mean_tpot_s']:.3f} s, median {s['median_tpot_s']:.3f} s,"
            f" p99 {s['p99_tpot_s']:.3f} s,"
            f" {t['stalled']} of {t['num_requests']} requests with a gap of {STALL_S:g} s or more."
        )
    return lines


def setting(runs: dict[str, Run]) -> str:
    paged = runs["paged"]
    s, window = paged.summary, paged.config["workload"]["window_duration_s"]
    budgets = "; ".join(
        f"{engine} {run.summary['kv_budget_bytes'] / 2**30:.2f} GiB ({run.summary['num_slots']:,} slots)"
        for engine, run in runs.items()
    )
    return (
        f"{s['model']}, real ({s['dtype']}, {s['attention']} kernels, CUDA graphs), one run per engine"
        f" (seed 0); {s['trace']} replayed over its first {window:g} s at its own timestamps:"
        f" {s['num_requests']} requests ({s['dropped_requests']} of the trace's {s['dropped_of']:,}"
        f" longer than {s['dropped_longer_than']:,} tokens). KV budget per cell: {budgets}."
    )


def arrivals(run: Run) -> str:
    """How fast prompt tokens arrive: the window's load on prefill."""
    r = run.requests
    last = float(r.arrival_s.max())
    return (
        f"Arrivals: {len(r)} requests from 0 to {last:.1f} s; prompts {int(r.prompt_len.sum()):,} tokens"
        f" ({r.prompt_len.mean():,.0f} on average, up to {int(r.prompt_len.max()):,};"
        f" {r.prompt_len.sum() / last:,.0f} a second over the arrivals), outputs {int(r.output_len.sum()):,}"
        f" tokens ({r.output_len.mean():.0f} on average)."
    )


def main() -> None:
    runs = cells(HERE)
    runs = {engine: runs[engine] for engine in ENGINES if engine in runs}
    sim, ratios = real_vs_sim(runs)
    text = [
        setting(runs),
        "",
        arrivals(runs["paged"]),
        "",
        "## Throughput and latency",
        "",
        *results_table(runs),
        "",
        "## Occupancy, saturated-weighted (over the steps during which a request waited)",
        "",
        *occupancy_table(runs, "occupancy_saturated"),
        "",
        "## Occupancy, busy-weighted (over every step)",
        "",
        *occupancy_table(runs, "occupancy"),
        "",
        "## Where the time went (steps.csv; a step with new prompts runs them alone)",
        "",
        *time_table(runs),
        "",
        "The longest stretch of consecutive prefill steps (nothing decodes during it):",
        "",
        *stretch_table(runs),
        "",
        *tpot_tail(runs),
        "",
        "## Real beside the simulator on the same cells",
        "",
        "`sim`: each cell's config.json simulated (H200 roofline cost model, not fitted to this model)"
        " with the KV budget the cell measured; `real / sim` in every column.",
        "",
        *sim,
        "",
        *ratios,
        "",
        "## The same window on Llama-3.1-8B (results/reference/mooncake-window-real)",
        "",
        *llama_line(),
        "",
    ]
    write_text(HERE / "table.md", "\n".join(text))


if __name__ == "__main__":
    main()
