"""Tables of this folder's kernel runs: kvbench's decode kernels beside FlashInfer's, one GPU and
one shape set a folder (`<gpu>/<set>/kernels.csv`, written by `kvbench kernels`).

    PYTHONPATH=. python results/reference/kernels-flashinfer/make.py

Writes table.md beside this file. For each cell: the median microseconds of kvbench's paged and
contiguous kernels, FlashInfer's faster decode path (CUDA cores or tensor cores, named) and SDPA;
paged over that FlashInfer path; and whether the two overlap between their 10th and 90th
percentiles (then the cell reads as a tie, not a win either way). Every number is read from the
kernels.csv files.
"""

from __future__ import annotations

import csv
from pathlib import Path

from kvbench.results.files import write_text

HERE = Path(__file__).resolve().parent
FLASHINFER = ("flashinfer-cuda-cores", "flashinfer-tensor-cores")


def cells(table: Path) -> dict[tuple[int, int], dict[str, dict]]:
    """(batch, context) -> backend -> its kernels.csv row, the backends that ran (status ok)."""
    found: dict[tuple[int, int], dict[str, dict]] = {}
    with table.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["status"] == "ok":
                found.setdefault((int(row["batch"]), int(row["context"])), {})[row["backend"]] = row
    return found


def reading(ratio: float, paged: dict, other: dict) -> str:
    """A tie where the two kernels' 10-90th percentile ranges overlap."""
    ours = float(paged["us_p10"]), float(paged["us_p90"])
    theirs = float(other["us_p10"]), float(other["us_p90"])
    if ours[0] <= theirs[1] and theirs[0] <= ours[1]:
        return "tie"
    return "kvbench faster" if ratio < 1 else "FlashInfer faster"


def set_table(table: Path) -> tuple[list[str], dict[str, int]]:
    lines = [
        "| batch x context | kvbench paged | kvbench contiguous | FlashInfer (faster path) | SDPA "
        "| paged / FlashInfer | reading |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    counts: dict[str, int] = {}
    for (batch, context), rows in sorted(cells(table).items()):
        if "kvbench-paged" not in rows or not any(name in rows for name in FLASHINFER):
            continue
        paged = rows["kvbench-paged"]
        path = min((name for name in FLASHINFER if name in rows), key=lambda name: float(rows[name]["us"]))
        other = rows[path]
        ratio = float(paged["us"]) / float(other["us"])
        read = reading(ratio, paged, other)
        counts[read] = counts.get(read, 0) + 1
        contiguous = rows.get("kvbench-contiguous", {}).get("us", "")
        sdpa = rows.get("torch-sdpa", {}).get("us", "")
        lines.append(
            f"| {batch} x {context:,} | {float(paged['us']):.1f} | {float(contiguous):.1f} "
            f"| {float(other['us']):.1f} ({path.removeprefix('flashinfer-')}) | {float(sdpa):.1f} "
            f"| {ratio:.3f} | {read} |"
        )
    return lines, counts


def main() -> None:
    out = [
        "# kvbench's decode kernels beside FlashInfer's (median us of one run, 50 timed calls a cell)",
        "",
        "Written by make.py from the kernels.csv files of this folder. A tie: the two kernels' 10th-90th",
        "percentile ranges overlap.",
    ]
    for table in sorted(HERE.glob("*/*/kernels.csv")):
        lines, counts = set_table(table)
        kinds = ("kvbench faster", "tie", "FlashInfer faster")
        summary = ", ".join(f"{counts[k]} {k}" for k in kinds if k in counts)
        out += ["", f"## {table.parent.parent.name}, {table.parent.name} ({summary})", "", *lines]
    write_text(HERE / "table.md", "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
