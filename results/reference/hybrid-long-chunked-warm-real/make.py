"""Tables of this folder's real chunked cells, run again since the runner's warm-up compiles every
decode launch a mixed step can pick, beside the run before it
(results/reference/hybrid-long-chunked-split-real).

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. \
        python results/reference/hybrid-long-chunked-warm-real/make.py

Writes table.md beside this file: (1) each engine's two runs, by the columns of
results/reference/hybrid-long-chunked-real/make.py; (2) their mixed steps: count, median, total,
and every one over 0.4 s (a compile inside the step: their neighbours take about 0.19 s).
Every number is read from the cells' summary.json and steps.csv.
"""

from __future__ import annotations

import runpy
from pathlib import Path

from kvbench.results.files import write_text

HERE = Path(__file__).resolve().parent
BEFORE = HERE.parent / "hybrid-long-chunked-split-real"
TABLES = runpy.run_path(str(HERE.parent / "hybrid-long-chunked-real" / "make.py"))
SLOW_S = 0.4  # a mixed step this long compiled something: the others take 0.13-0.25 s


def results_table(warm: dict, before: dict) -> list[str]:
    columns, line, gib = TABLES["COLUMNS"], TABLES["line"], TABLES["gib"]
    lines = [
        "| engine | run | KV GiB | " + " | ".join(name for name, _, _ in columns) + " |",
        "|---|---|---:|" + "---:|" * len(columns),
    ]
    for engine in TABLES["ENGINES"]:
        for how, run in (("before the warm-up", before[engine]), ("**warmed up**", warm[engine])):
            lines.append(line(engine, how, gib(run), run.summary))
    return lines


def slow_table(warm: dict, before: dict) -> list[str]:
    lines = [
        "| engine | run | mixed steps | median ms | total s | busy s | steps over 0.4 s (s at rows) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for engine in TABLES["ENGINES"]:
        for how, run in (("before the warm-up", before[engine]), ("warmed up", warm[engine])):
            mixed = run.steps[run.steps.kind == "mixed"]
            slow = mixed[mixed.duration_s > SLOW_S]
            pairs = zip(slow.duration_s, slow.batch_size, strict=True)
            listed = ", ".join(f"{s:.2f} at {r}" for s, r in pairs)
            lines.append(
                f"| {engine} | {how} | {len(mixed)} | {1e3 * mixed.duration_s.median():.1f} | "
                f"{mixed.duration_s.sum():.1f} | {run.summary['busy_s']:.1f} | {listed or 'none'} |"
            )
    return lines


def main() -> None:
    runs = TABLES["runs"]
    warm, before = runs(HERE), runs(BEFORE)
    lines = [
        *results_table(warm, before),
        "",
        "Mixed steps, and those a compile lengthened:",
        "",
        *slow_table(warm, before),
    ]
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
