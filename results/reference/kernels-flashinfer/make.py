"""Tables of this folder's kernel runs: kvbench's decode kernels beside FlashInfer's, one GPU,
shape set and seed a folder (`<gpu>/<set>/seed-<s>/kernels.csv`, written by `kvbench kernels`;
a seed draws the inputs and the page order).

    PYTHONPATH=. python results/reference/kernels-flashinfer/make.py

Writes table.md beside this file. For each cell: the median microseconds of kvbench's paged and
contiguous kernels, FlashInfer's faster decode path (CUDA cores or tensor cores, named) and SDPA,
each the mean over the seeds; paged over that FlashInfer path, as the mean of the seeds' ratios
with its 95 % interval; and a reading. A cell is a win only where the ratio is more than 1 % off
1 (MARGIN) and, over two or more seeds, its interval lies wholly on that side of 1, or, over one
seed ("one run"), the two kernels' 10th-90th percentile ranges do not overlap; else a tie. Every
number is read from the kernels.csv files.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from kvbench.report.kernel_plot import read_rows
from kvbench.results.files import write_text
from kvbench.sweep.stats import mean_ci95

HERE = Path(__file__).resolve().parent
FLASHINFER = ("flashinfer-cuda-cores", "flashinfer-tensor-cores")
KINDS = ("kvbench faster", "tie", "FlashInfer faster")
MARGIN = 0.01  # a difference under 1 % is a tie however tight its interval: no serving step feels it


def cells(table: Path) -> dict[tuple[int, int], dict[str, dict]]:
    """(batch, context) -> backend -> its kernels.csv row (numbers parsed by `kvbench kernels`'
    own reader), the backends that ran (status ok)."""
    found: dict[tuple[int, int], dict[str, dict]] = {}
    for row in read_rows(table):
        if row["status"] == "ok":
            found.setdefault((row["batch"], row["context"]), {})[row["backend"]] = row
    return found


def one_run_reading(ratio: float, paged: dict, other: dict) -> str:
    """One seed: a tie under the margin or where the two kernels' 10-90th percentile ranges overlap."""
    if abs(ratio - 1) <= MARGIN or (
        paged["us_p10"] <= other["us_p90"] and other["us_p10"] <= paged["us_p90"]
    ):
        return "tie"
    return "kvbench faster" if ratio < 1 else "FlashInfer faster"


def seeds_reading(
    ratios: list[float], names: tuple[str, str] = ("kvbench faster", "FlashInfer faster")
) -> str:
    """Two or more seeds: a win only past the margin, with the ratio's 95 % interval excluding 1;
    `names`: the reading below 1 and above it (the ratio's numerator faster, its denominator)."""
    mean, half = mean_ci95(ratios)
    if mean < 1 - MARGIN and mean + half < 1:
        return names[0]
    if mean > 1 + MARGIN and mean - half > 1:
        return names[1]
    return "tie"


def virtual_ratio(rows: list[dict]) -> str:
    """kvbench's contiguous kernel over the virtual arena against its paged kernel on the same
    inputs: the mean of the seeds' ratios with its 95 % interval and its reading by the same rule
    as paged / FlashInfer (one seed: the ratio alone, no reading)."""
    ratios = [r["kvbench-virtual"]["us"] / r["kvbench-paged"]["us"] for r in rows if "kvbench-virtual" in r]
    if not ratios:
        return "-"
    mean, half = mean_ci95(ratios)
    if len(ratios) == 1:
        return f"{mean:.3f}"
    read = seeds_reading(ratios, ("virtual faster", "paged faster"))
    return f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}] {read}"


def set_table(folder: Path) -> tuple[list[str], dict[str, int], int]:
    """One shape set over its seeds: table lines, readings counted, seeds read. The virtual-memory
    sets add kvbench's contiguous kernel over a virtual arena (`kvbench-virtual`) as a column, and
    its time over the paged kernel's."""
    runs = [cells(table) for table in sorted(folder.glob("seed-*/kernels.csv"))]
    virtual = any("kvbench-virtual" in row for run in runs for row in run.values())
    lines = [
        "| batch x context | kvbench paged | kvbench contiguous | "
        + ("kvbench virtual | virtual / paged | " if virtual else "")
        + "FlashInfer (faster path) | SDPA | paged / FlashInfer | reading |",
        "|---|---:|---:|" + ("---:|---:|" if virtual else "") + "---:|---:|---:|---|",
    ]
    counts: dict[str, int] = {}
    for cell in sorted(set.intersection(*(set(run) for run in runs))):
        rows = [run[cell] for run in runs]
        if not all("kvbench-paged" in r and all(name in r for name in FLASHINFER) for r in rows):
            continue

        def mean_us(backend: str, rows: list[dict] = rows) -> float | None:
            """The backend's mean over the seeds that ran it (None where none did)."""
            times = [r[backend]["us"] for r in rows if backend in r]
            return statistics.fmean(times) if times else None

        def shown_us(backend: str) -> str:
            us = mean_us(backend)
            return "-" if us is None else f"{us:.1f}"

        path = min(FLASHINFER, key=mean_us)  # the faster by its mean over the seeds (a seed may differ)
        ratios = [r["kvbench-paged"]["us"] / r[path]["us"] for r in rows]
        mean, half = mean_ci95(ratios)
        if len(rows) == 1:
            read, shown = one_run_reading(ratios[0], rows[0]["kvbench-paged"], rows[0][path]), f"{mean:.3f}"
        else:
            read, shown = seeds_reading(ratios), f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]"
        counts[read] = counts.get(read, 0) + 1
        columns = [shown_us("kvbench-paged"), shown_us("kvbench-contiguous")]
        columns += [shown_us("kvbench-virtual"), virtual_ratio(rows)] if virtual else []
        faster = f"{shown_us(path)} ({path.removeprefix('flashinfer-')})"
        columns += [faster, shown_us("torch-sdpa"), shown, read]
        lines.append(f"| {cell[0]} x {cell[1]:,} | " + " | ".join(columns) + " |")
    return lines, counts, len(runs)


def main() -> None:
    out = [
        "# kvbench's decode kernels beside FlashInfer's (median us of 50 timed calls, mean over seeds)",
        "",
        "Written by make.py from the kernels.csv files of this folder. A cell is a win where paged /",
        "FlashInfer is more than 1 % off 1 and, over two or more seeds, its 95 % interval excludes 1 (over",
        "one seed, one run: the two kernels' 10th-90th percentile ranges do not overlap); else a tie.",
    ]
    for folder in sorted(path for path in HERE.glob("*/*") if any(path.glob("seed-*/kernels.csv"))):
        lines, counts, seeds = set_table(folder)
        summary = ", ".join(f"{counts[k]} {k}" for k in KINDS if k in counts)
        over = "one run" if seeds == 1 else f"{seeds} seeds"
        out += ["", f"## {folder.parent.name}, {folder.name}, {over} ({summary})", "", *lines]
    write_text(HERE / "table.md", "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
