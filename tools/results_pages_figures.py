"""docs/results/reproduction.md: the paper's figures in every committed `kvbench reproduce` run.

One column per run folder (results/reproduce/, and the half-grid run in results/reference/),
the paper's number beside them, read from each figure's figure.csv, sustained.csv and
figure.json, the calibrations' cost.json and held_out_sets.json, and the probe runs that chose
the quick real run's model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import results_pages_common as common
from results_pages_common import MISSING, fixed, json_file, num, page, provenance, read_json, rel, table

from kvbench.calibrate.check import TARGET, by_load

# ---- the paper's figures ------------------------------------------------------------------

REPRODUCE = Path("results/reproduce")
# (column label, folder): the paper's setting simulated, then the GPU settings real and calibrated.
REPRODUCTIONS = (
    ("simulated OPT-13B", REPRODUCE / "quick-simulated"),
    ("real OPT-125M", REPRODUCE / "quick-real"),
    ("calibrated OPT-125M", REPRODUCE / "quick-calibrated"),
    ("real OPT-1.3B", REPRODUCE / "quick-real-opt-1.3b"),
    ("calibrated OPT-1.3B", REPRODUCE / "quick-calibrated-opt-1.3b"),
    ("real OPT-1.3B, half grids", Path("results/reference/quick-real-short")),
    ("real OPT-13B, 15,728 slots", REPRODUCE / "opt-13b-h200"),
)
# (figure, title, what the metric is and how it is weighted)
FIGURES = (
    (
        "fig2",
        "Figure 2: KV memory breakdown",
        "Share of the KV arena (%) in each category, ShareGPT at Figure 13's rate; time-weighted over "
        "the steps during which a request waited for memory (the saturated weighting). `other_%` is "
        "the paper's external fragmentation and others.",
    ),
    (
        "fig13",
        "Figure 13: average batched requests",
        "Requests in the running batch, time-weighted over the busy time of the run; ShareGPT at 2 and "
        "Alpaca at 30 requests/s (times the rate scale in real mode).",
    ),
    (
        "fig12",
        "Figure 12: sustained request rate and capacity",
        "Sustained rate: the highest rate whose normalized latency (mean over requests of end-to-end "
        "latency / output tokens) stays under the bound: 0.5 s/token simulated, 4x the lowest unloaded "
        "latency of the engines compared in real mode (one bound for all). Capacity: the most "
        "requests/s any cell of the sweep completed.",
    ),
    (
        "fig14",
        "Figure 14: parallel sampling and beam search",
        "Capacity and sustained rate on Alpaca with n samples or k beams per request (as Figure 12).",
    ),
    (
        "fig15",
        "Figure 15: memory saved by sharing",
        "Slots saved by sharing over the slots the sequences would hold without it (%), time-weighted "
        "over the run, paged engine; `@n2` is 2 parallel samples, `@k2` beam width 2.",
    ),
    (
        "fig16",
        "Figure 16: shared prefix",
        "Capacity and sustained rate of `paged-prefix` (the prefix cache) and Orca (Oracle) after a "
        "1-shot (80-token) or 5-shot (341-token) shared prefix.",
    ),
    (
        "fig17",
        "Figure 17: chatbot",
        "Capacity and sustained rate on 4-turn ShareGPT conversations (history cut to its last 1,024 "
        "tokens); `paged-prefix/paged` is reusing the previous turn's blocks.",
    ),
    (
        "fig18b",
        "Figure 18b: block size",
        "Normalized latency (ms/token) of the paged engine per block size at one loaded rate, and how "
        "far each block size is above the best one. The runs' verdicts give the block sizes within "
        "5 % of the best as a range from the smallest to the largest; the second table gives each one.",
    ),
    (
        "fig19",
        "Figure 19: recomputation against swapping",
        "Overhead per preemption (ms) and preemptions, per block size.",
    ),
)
SWEEP_FIGURES = ("fig12", "fig14", "fig16", "fig17")


def figure_rows(folder: Path, figure: str) -> pd.DataFrame | None:
    path = common.ROOT / folder / figure / "figure.csv"
    return pd.read_csv(path) if path.is_file() else None


def value_text(metric: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if "%" in metric or "batched" in metric:
        return fixed(value, 1)
    if "ratio" in metric:
        return fixed(value, 2) + "x"
    return num(value)


def figure_table(figure: str) -> str:
    """kvbench's numbers of one figure in every reproduction, beside the paper's."""
    frames = {label: figure_rows(folder, figure) for label, folder in REPRODUCTIONS}
    keys: dict[tuple, object] = {}
    for frame in frames.values():
        if frame is None:
            continue
        for row in frame.itertuples():
            if str(row.metric).startswith("normalized_latency_s@"):
                continue  # the latency curves: sweep.csv in each folder
            key = (row.workload, row.engine, row.metric)
            if key not in keys or pd.isna(keys[key]):
                keys[key] = row.paper
    values = {
        label: {(r.workload, r.engine, r.metric): r.kvbench for r in frame.itertuples()}
        for label, frame in frames.items()
        if frame is not None
    }
    labels = [label for label, _ in REPRODUCTIONS]
    rows = [
        [
            workload,
            engine,
            f"`{metric}`",
            value_text(metric, paper),
            *(value_text(metric, values.get(label, {}).get((workload, engine, metric))) for label in labels),
        ]
        for (workload, engine, metric), paper in keys.items()
    ]
    return table(["workload", "engine", "metric", "paper", *labels], rows)


def block_size_table() -> str:
    """Figure 18b: each block size's normalized latency and its distance from the best."""
    cells: dict[tuple, dict[str, str]] = {}
    for label, folder in REPRODUCTIONS:
        frame = figure_rows(folder, "fig18b")
        if frame is None:
            continue
        latency = frame[frame.metric.str.startswith("normalized_latency_s@bs")].copy()
        latency["block"] = latency.metric.str.removeprefix("normalized_latency_s@bs").astype(int)
        for workload, group in latency.groupby("workload", sort=False):
            best = group.kvbench.min()
            for row in group.itertuples():
                above = 100 * (row.kvbench / best - 1)
                cells.setdefault((workload, row.block), {})[label] = (
                    f"{num(1000 * row.kvbench)} ({above:+.1f} %)"
                )
    labels = [label for label, _ in REPRODUCTIONS]
    rows = [[w, b, *(cells[(w, b)].get(label, "-") for label in labels)] for (w, b) in sorted(cells)]
    return table(["workload", "block size", *labels], rows)


def sustained_table(figure: str) -> str:
    """Each sweep's bracket: the last rate under the bound and the first over it (sustained.csv)."""
    cells: dict[tuple, dict[str, str]] = {}
    for label, folder in REPRODUCTIONS:
        base = common.ROOT / folder / figure
        seeds = sorted(base.glob("seed-*"), key=lambda p: int(p.name.removeprefix("seed-")))
        for path in sorted((seeds[0] if seeds else base).glob("*/sustained.csv")):  # the first seed's
            for row in pd.read_csv(path).itertuples():
                bracket = f"{num(row.last_pass_rate)} / {num(row.first_fail_rate)}"
                cells.setdefault((path.parent.name, row.engine), {})[label] = bracket
    if not cells:
        return ""
    labels = [label for label, _ in REPRODUCTIONS if any(label in c for c in cells.values())]
    rows = [[s, e, *(cells[(s, e)].get(label, "-") for label in labels)] for (s, e) in sorted(cells)]
    note = (
        "Sustained-rate brackets, requests/s: last rate under the bound / first rate over it "
        "('-' before the slash: no rate tried was under the bound; after it: none was over it), "
        "from each sweep's `sustained.csv`.\n\n"
    )
    return note + table(["sweep", "engine", *labels], rows)


def verdicts(figure: str) -> str:
    lines = []
    for label, folder in REPRODUCTIONS:
        path = common.ROOT / folder / figure / "figure.json"
        if path.is_file():
            lines.append(f"- {label}: {read_json(path).get('verdict', MISSING)}")
    return "Verdicts written by each run (`figure.json`):\n\n" + "\n".join(lines) if lines else ""


def calibration_tables() -> str:
    fits, errors = [], []
    for label, folder in REPRODUCTIONS:
        cost = read_json(common.ROOT / folder / "calibration" / "cost.json")
        if not cost:
            continue
        fits.append(
            [
                label,
                cost["model"],
                len(cost["runs"]),
                num(cost["rows"]),
                fixed(1000 * cost["fixed_s"], 2),
                fixed(1e6 * cost["per_token_s"], 2),
                fixed(1e9 * cost["per_kv_token_s"], 1),
                fixed(1000 * cost["per_prefill_s"], 2),
                fixed(1e6 * cost["per_prefill_token_s"], 2),
                fixed(100 * cost["median_relative_error"], 1),
            ]
        )
        sets = read_json(common.ROOT / folder / "calibration" / "held_out_sets.json").get("held_out_sets", [])
        errors += [[label, *row] for held in sets for row in held_out_rows(held)]
    fit = table(
        [
            "run",
            "model",
            "fitted runs",
            "step rows",
            "ms per step",
            "us per decode row",
            "ns per context token",
            "ms per prefill step",
            "us per prefill token",
            "median row error %",
        ],
        fits,
    )
    held = table(
        ["run", "held-out set", "load", "metric", "runs", "median abs. error %", "largest abs. error %",
         f"within {100 * TARGET:.0f} %"],
        errors,
    )  # fmt: skip
    return (
        "## Calibration: the cost model fitted to each real run's Figure 2 runs\n\n"
        "From `calibration/cost.json` (the fit) and `calibration/held_out_sets.json` (the real runs "
        "of the other figures replayed through the simulator with it). Errors are given for loaded "
        "runs (a queue formed: step times decide the result) apart from unloaded ones (throughput "
        "is the arrival rate whatever the step times), loaded first; a set written before the "
        "split shows no run under either.\n\n" + fit + "\n\n" + held
    )


def held_out_rows(held: dict) -> list[list]:
    """A held-out set's rows of the calibration table: per load (loaded first) and metric, the
    runs, median and largest absolute error and the count within `TARGET` (`by_load`)."""
    return [
        [
            held["label"],
            load,
            f"`{metric}`",
            s["runs"],
            fixed(_percent(s.get("median_abs_error")), 1),
            fixed(_percent(s.get("max_abs_error")), 1),
            f"{s.get('within_target', 0)} of {s['runs']}",
        ]
        for load, metric, s in by_load(held["summary"])
    ]


def _percent(error: float | None) -> float | None:
    return None if error is None else 100 * error


def model_choice_table() -> str:
    """The probe that chose OPT-125M for the quick real run: same slots, same batches."""
    folder = Path("results/reference/quick-opt-125m/probe/runs")
    rows = []
    for path in sorted((common.ROOT / folder).glob("*.json")):
        s = json_file(folder / path.name)
        rate = path.stem.removeprefix(f"{s['model']}-").split("-", 1)[0]  # MODEL-RATE-ENGINE.json
        rows.append(
            [
                s["model"],
                rate,
                s["engine"],
                num(s["request_throughput"]),
                fixed(s["mean_batched_requests"], 1),
                fixed(100 * s["occupancy_saturated"]["token_states"], 1),
            ]
        )
    return table(
        ["model", "rate req/s", "engine", "requests/s", "mean batched", "token states % (saturated)"], rows
    )


def reproduction_page() -> str:
    sections = []
    for figure, title, what in FIGURES:
        parts = [f"## {title}", what, figure_table(figure)]
        if figure == "fig18b":
            parts.append(
                "Normalized latency in ms/token (above the best block size of that run):\n\n"
                + block_size_table()
            )
        if figure in SWEEP_FIGURES:
            parts.append(sustained_table(figure))
        parts.append(verdicts(figure))
        sections.append("\n\n".join(part for part in parts if part))
    sections.append(
        "## Why the quick real run decodes OPT-125M\n\n"
        "200 ShareGPT requests per engine on the H200 with the same 16,384 token slots "
        "(`results/reference/quick-opt-125m/probe/runs/`): OPT-125M decodes more requests per "
        "second than OPT-1.3B with about the same batches and token-state shares.\n\n" + model_choice_table()
    )
    sections.append(calibration_tables())
    intro = (
        "kvbench's numbers for the PagedAttention paper's figures (`kvbench reproduce`), beside the "
        "paper's (`paper` column), one column per committed run. How to run them and what each figure "
        "measures: [docs/REPRODUCTION.md](../REPRODUCTION.md). Each column is one run (seed 0); the "
        "spread between runs is not measured. Real runs compare ratios and orders with the paper, "
        "not absolute rates (a smaller model on an H200, rates scaled). `-`: not in that run.\n\n"
        + table(
            ["column", "folder", "what it is"],
            [[label, rel(folder), provenance(folder)["measures"]] for label, folder in REPRODUCTIONS],
        )
    )
    folders = [folder for _, folder in REPRODUCTIONS] + [Path("results/reference/quick-opt-125m")]
    return page("The paper's figures, reproduced", intro, folders, sections)
