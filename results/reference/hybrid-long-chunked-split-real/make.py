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

from kvbench.results.files import write_text

HERE = Path(__file__).resolve().parent
BEFORE = HERE.parent / "hybrid-long-chunked-real"
TABLES = runpy.run_path(str(BEFORE / "make.py"))
UNCHUNKED = TABLES["UNCHUNKED"]


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
    ]
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
