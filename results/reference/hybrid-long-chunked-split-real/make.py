"""Tables of this folder's real chunked cells, run since a mixed step's decodes attend through
the split decode kernel, beside the same setting's chunked cells from before that change and
its unchunked cells.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. \
        python results/reference/hybrid-long-chunked-split-real/make.py

Writes table.md beside this file: (1) each engine's real unchunked cell
(results/reference/hybrid-long-real), its chunked cell before the change
(results/reference/hybrid-long-chunked-real) and its chunked cell here; (2) where the busy time
went, and (3) the mixed steps by the K/V slots they read against their fitted price, both by
the functions of results/reference/hybrid-long-chunked-real/make.py, one code for both
folders. Every number is read from the cells' summary.json and steps.csv.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np

from kvbench.results.files import write_text

HERE = Path(__file__).resolve().parent
BEFORE = HERE.parent / "hybrid-long-chunked-real"
TABLES = runpy.run_path(str(BEFORE / "make.py"))
UNCHUNKED = TABLES["UNCHUNKED"]
REFIT = HERE / "calibration" / "cost.json"  # `kvbench calibrate` on this folder's paged cell


def refit_table(split: dict) -> list[str]:
    """Each engine's steps priced by the costs fitted on paged's cell alone (its attention-pair
    term included): a step-level check on the other engines' steps, whose batches differ."""
    lines = [
        "| engine | steps | count | measured / priced (sums) | median error | p90 error |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for engine in TABLES["ENGINES"]:
        run = split[engine]
        steps = run.steps.assign(priced_s=TABLES["priced"](run, REFIT))
        for kind in ("mixed", "decode"):
            group = steps[steps.kind == kind]
            error = np.abs(group.duration_s - group.priced_s) / group.duration_s
            values = [
                kind,
                f"{len(group)}",
                f"{group.duration_s.sum() / group.priced_s.sum():.3f}",
                f"{100 * error.median():.1f} %",
                f"{100 * error.quantile(0.9):.1f} %",
            ]
            lines.append(f"| {engine} | " + " | ".join(values) + " |")
    return lines


def results_table(split: dict, before: dict, unchunked: dict) -> list[str]:
    columns, line, gib = TABLES["COLUMNS"], TABLES["line"], TABLES["gib"]
    lines = [
        "| engine | run | KV GiB | " + " | ".join(name for name, _, _ in columns) + " |",
        "|---|---|---:|" + "---:|" * len(columns),
    ]
    for engine in TABLES["ENGINES"]:
        for how, run in (
            ("real, unchunked", unchunked[engine]),
            ("real, chunked, decodes through the extend kernel", before[engine]),
            ("**real, chunked, decodes through the split decode kernel**", split[engine]),
        ):
            lines.append(line(engine, how, gib(run), run.summary))
    return lines


def main() -> None:
    runs = TABLES["runs"]
    split, before, unchunked = runs(HERE), runs(BEFORE), runs(UNCHUNKED)
    lines = [
        *results_table(split, before, unchunked),
        "",
        "Where the busy time went (decode-only steps replay CUDA graphs; a step with prompt tokens"
        " runs eagerly):",
        "",
        *TABLES["time_table"](split, unchunked),
        "",
        "This folder's mixed steps by the K/V slots they read (`kv_tokens_read`), measured and as"
        " the fitted costs price them:",
        "",
        *TABLES["mixed_table"](split),
        "",
        "Every engine's steps priced by the costs fitted on this folder's paged cell"
        " (`calibration/cost.json`, with the attention-pair term):",
        "",
        *refit_table(split),
    ]
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
