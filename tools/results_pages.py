"""Write docs/results/*.md from the committed result folders under results/.

Docs tables are generated, not typed (docs/METHOD rules): every number on these pages is read
from a folder's own files (figure.csv, sustained.csv, kernels.csv, the benchmarks' JSON), and
every page names the folders, commands and provenance it read. Provenance comes from the
folder's env.json files where they exist, else from the `| field | value |` table at the top
of the folder's README.md ("not recorded" where neither says).

    python tools/results_pages.py            # rewrite docs/results/
    python tools/results_pages.py --check    # exit 1 if a page differs from what the folders give

Output is deterministic: rows in the folders' own order or sorted, fixed number formats, no
dates other than the ones recorded in the folders. tests/test_results_pages.py fails when a
committed page differs from a regeneration.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: kvbench is the repository's package
    sys.path.insert(0, str(ROOT))

from kvbench.results.files import read_json, write_text  # noqa: E402

PAGES_DIR = Path("docs/results")
REGENERATE = "python tools/results_pages.py"
MISSING = "not recorded"
PROVENANCE_KEYS = ("kvbench commit", "committed in", "GPU", "driver", "torch", "triton", "date")


# ---- formatting ---------------------------------------------------------------------------


def num(value, digits: int = 3) -> str:
    """A number in `digits` significant figures (whole numbers whole), thousands separated."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return "-"
    value = float(value)
    if value == int(value) or abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def fixed(value, decimals: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{float(value):,.{decimals}f}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def rel(path: Path) -> str:
    """A link from docs/results/ to a repository path."""
    return f"[`{path.as_posix()}`](../../{path.as_posix()})"


# ---- provenance ---------------------------------------------------------------------------


def readme_fields(folder: Path) -> dict[str, str]:
    """The `| field | value |` table of a folder's README.md, as written beside the data."""
    path = folder / "README.md"
    if not path.is_file():
        return {}
    fields, inside = {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.replace(" ", "") == "|field|value|":
            inside = True
        elif inside and line.startswith("|") and not line.startswith("|---"):
            key, _, value = line.strip("| ").partition(" | ")
            fields[key.strip()] = value.strip()
        elif inside and not line.startswith("|"):
            break
    return fields


def env_fields(folder: Path) -> dict[str, str]:
    """What the env.json files under `folder` agree on (several values joined, sorted)."""
    envs = [read_json(path) for path in sorted(folder.rglob("env.json"))]
    if not envs:
        return {}

    def joined(get: Callable[[dict], object]) -> str:
        values = sorted({str(v) for v in map(get, envs) if v})
        return ", ".join(values) if values else MISSING

    packages = lambda name: lambda env: env.get("packages", {}).get(name)  # noqa: E731
    dates = sorted({env.get("created_utc", "")[:10] for env in envs} - {""})
    return {
        "kvbench commit": joined(lambda env: env.get("git_sha", "")[:7]),
        "GPU": joined(lambda env: env.get("gpu")),
        "driver": joined(lambda env: env.get("driver")),
        "torch": joined(packages("torch")),
        "triton": joined(packages("triton")),
        "date": (dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}") if dates else MISSING,
    }


def provenance(folder: Path) -> dict[str, str]:
    fields = {key: MISSING for key in ("measures", "command", *PROVENANCE_KEYS)}
    fields.update(readme_fields(ROOT / folder))
    fields.update(env_fields(ROOT / folder))
    return fields


def provenance_table(folders: Sequence[Path]) -> str:
    rows = []
    for folder in folders:
        p = provenance(folder)
        rows.append([rel(folder), p["command"], *(p[key] for key in PROVENANCE_KEYS)])
    return table(["folder", "command", *PROVENANCE_KEYS], rows)


def page(title: str, intro: str, folders: Sequence[Path], sections: Iterable[str]) -> str:
    head = (
        f"# {title}\n\n<!-- Generated by `{REGENERATE}` from the folders below; do not edit. -->\n\n"
        f"{intro}\n\n## Where the numbers come from\n\n{provenance_table(folders)}\n"
    )
    return head + "".join(f"\n{section.rstrip()}\n" for section in sections)


def csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(ROOT / path)


def json_file(path: Path) -> dict:
    return json.loads((ROOT / path).read_text(encoding="utf-8"))


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
        "latency / output tokens) stays under the bound: 0.5 s/token simulated, 4x each engine's "
        "unloaded latency in real mode. Capacity: the most requests/s any cell of the sweep completed.",
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
        "far each block size is above the best one.",
    ),
    (
        "fig19",
        "Figure 19: recomputation against swapping",
        "Overhead per preemption (ms) and preemptions, per block size.",
    ),
)
SWEEP_FIGURES = ("fig12", "fig14", "fig16", "fig17")


def figure_rows(folder: Path, figure: str) -> pd.DataFrame | None:
    path = ROOT / folder / figure / "figure.csv"
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
        for path in sorted((ROOT / folder / figure).glob("*/sustained.csv")):
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
        path = ROOT / folder / figure / "figure.json"
        if path.is_file():
            lines.append(f"- {label}: {read_json(path).get('verdict', MISSING)}")
    return "Verdicts written by each run (`figure.json`):\n\n" + "\n".join(lines) if lines else ""


def calibration_tables() -> str:
    fits, errors = [], []
    for label, folder in REPRODUCTIONS:
        cost = read_json(ROOT / folder / "calibration" / "cost.json")
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
        sets = read_json(ROOT / folder / "calibration" / "held_out_sets.json").get("held_out_sets", [])
        for held in sets:
            for metric, s in held["summary"].items():
                errors.append(
                    [
                        label,
                        held["label"],
                        f"`{metric}`",
                        s["runs"],
                        fixed(100 * s["median_abs_error"], 1),
                        fixed(100 * s["max_abs_error"], 1),
                        f"{s['within_target']} of {s['runs']}",
                    ]
                )
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
        ["run", "held-out set", "metric", "runs", "median abs. error %", "max %", "within 10 %"], errors
    )
    return (
        "## Calibration: the cost model fitted to each real run's Figure 2 runs\n\n"
        "From `calibration/cost.json` (the fit) and `calibration/held_out_sets.json` (the real runs "
        "of the other figures replayed through the simulator with it).\n\n" + fit + "\n\n" + held
    )


def model_choice_table() -> str:
    """The probe that chose OPT-125M for the quick real run: same slots, same batches."""
    folder = Path("results/reference/quick-opt-125m/probe/runs")
    rows = []
    for path in sorted((ROOT / folder).glob("*.json")):
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


# ---- kernels ------------------------------------------------------------------------------

KERNELS = Path("results/reference/kernels-bench")
MERGE = Path("results/reference/kernel-merge-variants")
TUNING = Path("results/reference/kernel-tuning")


def kernel_cells_table(path: Path, backends: Sequence[str]) -> str:
    """Fraction of the measured read bandwidth per cell and backend, and paged / contiguous time."""
    frame = csv(path)
    rows = []
    for (batch, context), group in frame.groupby(["batch", "context"], sort=True):
        by = group.set_index("backend")
        fractions = [fixed(by.bw_fraction.get(b), 2) if b in by.index else "-" for b in backends]
        ratio = by.us["kvbench-paged"] / by.us["kvbench-contiguous"]
        rows.append([f"({batch}, {context:,})", f"{batch * context // 1024:,}K", *fractions, fixed(ratio, 2)])
    return table(["(B, L)", "B x L", *backends, "paged / contiguous time"], rows)


def block_size_kernel_table(path: Path) -> str:
    frame = csv(path)
    paged = frame[frame.backend == "kvbench-paged"]
    blocks = sorted(paged.block_size.unique())
    rows = []
    for (batch, context), group in paged.groupby(["batch", "context"], sort=True):
        by = group.set_index("block_size").vs_contiguous
        rows.append([batch, f"{context:,}", *(fixed(by.get(b), 3) for b in blocks)])
    return table(["batch", "context", *(f"block size {b}" for b in blocks)], rows)


def merge_table() -> str:
    data = json_file(MERGE / "merge_variants.json")
    rows = [
        [
            s["cell"],
            s["heuristic_splits"],
            fixed(s.get("kernel_bw_fraction", s.get("none_bw_fraction")), 3),
            fixed(s.get("fused_bw_fraction"), 3),
            fixed(s["fused_vs_kernel"], 3),
        ]
        for s in data["summary"]
    ]
    note = "One split needs no merge: its row is the kernel alone.\n\n"
    return note + table(
        ["cell", "splits", "merge kernel: fraction of read bw", "fused merge", "fused / kernel time"], rows
    )


def kernels_page() -> str:
    bandwidth = json_file(KERNELS / "issue-cells/bandwidth.json")["read_bandwidth_bytes_per_s"]
    sections = [
        "## Decode attention against the read bandwidth\n\n"
        f"bf16, 32 query heads, 8 KV heads, head dim 128, block size 16, random page order; fraction of "
        f"the read bandwidth measured in the same run ({bandwidth / 1e12:.2f} TB/s, Triton streaming "
        f"read); `paged / contiguous time`: kvbench's paged kernel over its contiguous mode "
        f"({rel(KERNELS / 'issue-cells/kernels.csv')}).\n\n"
        + kernel_cells_table(
            KERNELS / "issue-cells/kernels.csv",
            ("kvbench-paged", "kvbench-contiguous", "torch-sdpa", "flex-paged"),
        ),
        "## Figure 18a: block size in the kernel\n\n"
        f"Time of kvbench's paged kernel over its contiguous mode at each block size "
        f"({rel(KERNELS / 'fig18a/kernels.csv')}).\n\n"
        + block_size_kernel_table(KERNELS / "fig18a/kernels.csv"),
        "## Merging split-KV partial results: a kernel of its own or the last split\n\n"
        "The fused merge (the last split program merges, taking an atomic ticket) against the separate "
        "merge kernel, at the split counts of the rule then in use "
        f"({rel(MERGE / 'merge_variants.json')}).\n\n" + merge_table(),
        "## The split rule's tuning\n\n"
        f"Text logs of `benchmarks/tune_decode.py` ({rel(TUNING)}); the rule they chose is "
        "`kernels/splits.py`.",
    ]
    intro = (
        "kvbench's decode-attention kernels on the GPU (`kvbench kernels`, `benchmarks/`). One run per table."
    )
    return page("Kernels", intro, [KERNELS, MERGE, TUNING], sections)


# ---- real decoding ------------------------------------------------------------------------

REAL = Path("results/reference/real-decode-kernels")
ANCHORS = Path("results/reference/anchors-h200")
COLLECTORS = Path("results/reference/collectors-cost")


def real_decode_table() -> str:
    rows = []
    for name in ("real_decode.json", "real_decode_split_rule.json", "real_decode_nographs.json"):
        for engine, f in json_file(REAL / name)["figures"].items():
            rows.append(
                [
                    f"`{name}`",
                    engine,
                    "yes" if f["cuda_graphs"] else "no",
                    fixed(f["output_tokens_per_s"], 0),
                    fixed(f["mean_decode_step_ms"], 2),
                    f"{f['steps']:,} ({f['engine_calls']})",
                    f["peak_running"],
                ]
            )
    return table(
        [
            "file",
            "engine",
            "CUDA graphs",
            "output tokens/s",
            "mean decode step ms",
            "steps (engine calls)",
            "peak batch",
        ],
        rows,
    )


def roofline_tables() -> str:
    data = json_file(REAL / "decode_step.json")
    steps: dict[int, dict[str, float]] = {}
    for r in data["roofline"]:
        steps.setdefault(r["batch"], {"floor": r["floor_ms"]})[r["addressing"]] = r["step_ms"]
        if r["addressing"] == "paged":
            steps[r["batch"]]["efficiency"] = r["efficiency"]
    roof = table(
        ["batch", "paged step ms", "contiguous step ms", "floor ms", "paged efficiency %"],
        [
            [
                b,
                fixed(s["paged"], 2),
                fixed(s["contiguous"], 2),
                fixed(s["floor"], 2),
                fixed(100 * s["efficiency"], 1),
            ]
            for b, s in sorted(steps.items())
        ],
    )
    shares: dict[str, dict[bool, float]] = {}
    for r in data["host_share"]:
        shares.setdefault(r["engine"], {})[r["segments"]] = r["host_share"]
    host = table(
        ["engine", "host share %, in segments", "one step per engine call"],
        [[e, fixed(100 * s[True], 1), fixed(100 * s[False], 1)] for e, s in shares.items()],
    )
    return (
        f"{data['model']} fp16, random weights, every sequence at context 512, one decode step replayed "
        "as a CUDA graph; floor = (weights + KV read + KV written) / measured read bandwidth.\n\n"
        + roof
        + "\n\nHost share of a decode step at batch 64: 1 - GPU time / loop step time.\n\n"
        + host
    )


def anchors_table() -> str:
    data = json_file(ANCHORS / "anchors.json")
    rows = []
    for engine, r in data["rows"].items():
        reserved = r["torch_peak_reserved_bytes"]
        rows.append(
            [
                engine,
                fixed(r["output_tokens_per_s"], 0),
                fixed(r["ratio_to_paged"], 4),
                fixed(r["mean_ttft_s"], 2),
                fixed(r["mean_tpot_s"], 4),
                fixed(r["makespan_s"], 1),
                "-" if reserved is None else fixed(reserved / 1e9, 1),
            ]
        )
    return (
        f"{data['model']}, {data['num_requests']} requests at once, {data['output_tokens']:,} output tokens, "
        f"transformers {data['transformers']}.\n\n"
        + table(
            [
                "engine",
                "output tokens/s",
                "vs paged",
                "mean TTFT s",
                "mean TPOT s",
                "makespan s",
                "peak torch reserved GB",
            ],
            rows,
        )
    )


def collectors_table() -> str:
    figures = json_file(COLLECTORS / "collectors_after.json")["figures"]
    runs = [(name, f) for name, f in figures.items() if not name.endswith("#warmup")]
    without = [f["output_tokens_per_s"] for _, f in runs if not f["collectors"]]
    with_ = [f["output_tokens_per_s"] for _, f in runs if f["collectors"]]
    cost = 100 * (1 - (sum(with_) / len(with_)) / (sum(without) / len(without)))
    rows = [
        [name, ", ".join(f["collectors"]) or "none", fixed(f["output_tokens_per_s"], 0)] for name, f in runs
    ]
    return (
        table(["run", "collectors", "output tokens/s"], rows)
        + f"\n\nMean without: {fixed(sum(without) / len(without), 0)}; with every collector: "
        f"{fixed(sum(with_) / len(with_), 0)}; cost {cost:.2f} % (the warm-up run is not counted)."
    )


def real_decoding_page() -> str:
    sections = [
        "## The reference workload end to end\n\n"
        "`llama-1b-ref`, bf16, random weights, 256 requests at once (176 in / 269 out on average, "
        "68,760 output tokens), 8 GiB of KV; output tokens over the engine loop's wall time.\n\n"
        + real_decode_table(),
        "## Decode step against its roofline\n\n" + roofline_tables(),
        "## Beside transformers on the same weights and trace\n\n" + anchors_table(),
        "## What the collectors cost\n\nThe reference workload, paged engine, runs alternating without and "
        "with the torch, NVML and roofline collectors.\n\n" + collectors_table(),
    ]
    intro = "Real decoding on the GPU: kvbench's engines with its Triton kernels and CUDA graphs."
    return page("Real decoding", intro, [REAL, ANCHORS, COLLECTORS], sections)


# ---- virtual memory -----------------------------------------------------------------------

PROBE = Path("results/reference/vmm-probe")
VMM_KERNELS = Path("results/reference/vmm-kernels")
VMM_OCCUPANCY = Path("results/reference/vmm-occupancy-sim")


def probe_tables() -> str:
    data = json_file(PROBE / "probe.json")
    costs = [
        ("create (physical memory)", data["create_per_page"]),
        ("map + set access, fresh handle", data["map_set_access_per_page"]),
        ("map + set access, handle reused", data["remap_map_set_access"]),
        ("unmap", data["remap_unmap"]),
    ]
    rows = [[what, num(c["n"]), fixed(c["median_us"], 1), fixed(c["p99_us"], 1)] for what, c in costs]
    rows.append(["release", "-", fixed(data["release_us_per_page"], 1), "-"])
    k = table(
        ["pages", "one handle, one call us", "one call per page us"],
        [
            [r["pages"], fixed(r["one_call_us"], 0), fixed(r["k_calls_us"], 0)]
            for r in data["one_handle_vs_k_pages"]
        ],
    )
    busy = data["while_gpu_busy"]
    return (
        f"Page size {data['granularity_bytes'] // 2**20} MiB (the driver's granularity).\n\n"
        + table(["call, per page", "calls", "median us", "p99 us"], rows)
        + "\n\n"
        + k
        + f"\n\nWith {busy['queued_gpu_work_ms']} ms of GPU work queued, map took "
        f"{busy['map_while_busy_us']} us "
        f"and unmap {busy['unmap_while_busy_us']} us; a graph replayed after a remap read the new page: "
        f"{'yes' if data['graph_after_remap']['ok'] else 'no'}."
    )


def vmm_kernel_table(path: Path, label: str) -> list[list[str]]:
    frame = csv(path)
    rows = []
    for (batch, context), group in frame.groupby(["batch", "context"], sort=True):
        us = group.set_index("backend").us
        rows.append(
            [
                f"{label} B{batch} L{context}",
                fixed(us["kvbench-paged"], 1),
                fixed(us["kvbench-contiguous"], 1),
                fixed(us["kvbench-virtual"], 1),
                fixed(us["kvbench-virtual"] / us["kvbench-contiguous"], 2),
                fixed(us["kvbench-paged"] / us["kvbench-virtual"], 2),
            ]
        )
    return rows


def virtual_memory_page() -> str:
    kernels = vmm_kernel_table(VMM_KERNELS / "opt13b/kernels.csv", "OPT-13B") + vmm_kernel_table(
        VMM_KERNELS / "gqa8/kernels.csv", "GQA 8x4"
    )
    occupancy = (ROOT / VMM_OCCUPANCY / "table.md").read_text(encoding="utf-8")
    sections = [
        "## Mapping a KV page with the CUDA driver\n\n" + probe_tables(),
        "## Decode attention over virtual memory\n\nThe same kernel over 16-token blocks (paged), one "
        "`cudaMalloc`'d arena (contiguous) and per-sequence virtual ranges with 2 MiB pages mapped "
        "under the tokens (virtual); median microseconds of 50 calls.\n\n"
        + table(
            ["cell", "paged", "contiguous", "virtual", "virtual / contiguous", "paged / virtual"], kernels
        ),
        "## Occupancy of the vmm engine, simulated at the paper's setting\n\nOPT-13B, 15,728 token slots, "
        f"1,000 requests, seeds 0-2 ({rel(VMM_OCCUPANCY / 'table.md')}, as the benchmark wrote it).\n\n"
        + occupancy,
    ]
    intro = "vAttention's approach: KV in per-request virtual ranges, physical pages mapped on demand."
    return page("Virtual memory", intro, [PROBE, VMM_KERNELS, VMM_OCCUPANCY], sections)


# ---- sharing ------------------------------------------------------------------------------

SHARING = Path("results/reference/sharing-h200")


def sharing_page() -> str:
    rows = []
    for name in ("sharing_real.csv", "sharing_real_sharegpt.csv"):
        for r in csv(SHARING / name).itertuples():
            rows.append(
                [
                    r.workload,
                    r.pattern,
                    r.width,
                    num(r.rate),
                    fixed(r.saved_pct, 1),
                    fixed(r.paper_pct, 1),
                    fixed(r.mean_batched_seqs, 1),
                    r.preemptions,
                ]
            )
    sections = [
        "## Memory saved by parallel sampling and beam search, real decoding\n\n"
        "OPT-13B (random weights, bf16), 12 GiB of KV, paged engine; saved: slots saved by sharing over "
        "the slots the sequences would hold without it, time-weighted over the run. The rate is a fixed "
        "sequence rate divided by the width. The simulated counterparts: "
        "[reproduction.md](reproduction.md#figure-15-memory-saved-by-sharing).\n\n"
        + table(
            [
                "workload",
                "pattern",
                "width",
                "requests/s",
                "saved %",
                "paper %",
                "mean batched sequences",
                "preemptions",
            ],
            rows,
        )
    ]
    return page("Sharing", "KV sharing between the sequences of one request on the GPU.", [SHARING], sections)


# ---- the pages ----------------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "reproduction.md": reproduction_page,
    "kernels.md": kernels_page,
    "real-decoding.md": real_decoding_page,
    "virtual-memory.md": virtual_memory_page,
    "sharing.md": sharing_page,
}


def index_page() -> str:
    titles = {name: build().splitlines()[0].removeprefix("# ") for name, build in PAGES.items()}
    rows = [[f"[{titles[name]}]({name})", name] for name in PAGES]
    return (
        f"# Results\n\n<!-- Generated by `{REGENERATE}`; do not edit. -->\n\n"
        "Every table on these pages is generated from the committed result folders under "
        "[results/](../../results/README.md), which hold the commands and provenance.\n\n"
        + table(["page", "file"], rows)
        + "\n"
    )


def render() -> dict[str, str]:
    """Every page's text, by file name under docs/results/."""
    pages = {name: build() for name, build in PAGES.items()}
    pages["README.md"] = index_page()
    return dict(sorted(pages.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs")
    args = parser.parse_args(argv)
    out = ROOT / PAGES_DIR
    pages = render()
    stale = [
        name
        for name, text in pages.items()
        if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text
    ]
    if args.check:
        for name in stale:
            print(f"{PAGES_DIR / name} differs from the result folders: run {REGENERATE}")
        return 1 if stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for name in stale:
        write_text(out / name, pages[name])
        print(f"wrote {PAGES_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
