"""Saved results read back as pandas DataFrames: `load_run`, `load_sweep`, `load_runs`, and a
reproduction's figure tables, `load_figures` (all four also as `kvbench.load_*`).

Results on disk are the source of truth (DESIGN.md, "Results on disk"), so everything a plot,
a report, a calibration or a notebook shows is read here from the files a run wrote, never
from a live run. The columns of every file are listed in docs/RESULTS_FILES.md.

Columns are read by name and every column beyond the ones a reader needs is optional:
collectors add step columns (torch/NVML memory, roofline) and metrics add summary keys over
time, and an older folder without them must still load. A file that is broken (not UTF-8, a
short or long line from a truncated write, a word where a number belongs) is refused with
one line naming the file, the line and the column (`KvbenchError`), never a traceback or a
silently wrong plot. So is a run folder whose files parse but do not hold what kvbench writes:
a key kvbench always writes missing, a negative count, a NaN where kvbench writes a number, a
steps.csv or requests.csv without its header or without the rows summary.json counts
(`kvbench.results.checks`).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import KvbenchError
from kvbench.flag_ranges import MIN_RATE
from kvbench.results.checks import check_requests, check_run_summary, check_steps
from kvbench.results.files import read_json
from kvbench.results.packed import table_bytes, table_path
from kvbench.results.shape import (
    FIGURE_TEXT,
    STEP_TEXT,
    SUSTAINED_TEXT,
    SWEEP_KEYS,
    SWEEP_TEXT,
    check_config,
    check_summary,
)

NOT_RESULTS = "not a kvbench results folder (no summary.json or sweep.csv)"


NOT_MEASURED = ("", "nan", "NaN", "-nan", "+nan")  # a number cell holding no number: NaN (csv writes nan)
# Numbers read back exactly as Python wrote them: pandas 2's default parser may land one unit in
# the last place off; pandas 3's default is exact and deprecates asking for it.
EXACT = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}


def read_csv(path: Path, text: Collection[str] | None = None) -> pd.DataFrame:
    """A CSV file kvbench wrote (or its packed copy, `kvbench.results.packed`), as a DataFrame; a
    missing or empty file is an empty one.

    `text`: the columns that hold words (kept as strings, "" where empty); every other column
    must hold numbers (int64, or float64 where a cell is empty or `nan`: NaN), or the file is
    refused naming its column and line. None: a column is numbers where every cell is one,
    words otherwise.
    """
    data = table_bytes(path)
    if data is None:
        return pd.DataFrame()
    path = table_path(path)  # errors name the file read: the CSV or its packed copy
    try:
        content = data.decode("utf-8-sig")  # a spreadsheet's byte-order mark is not a column's name
    except UnicodeDecodeError as error:
        raise KvbenchError(f"{path}: not UTF-8 text (byte {error.start}): not a file kvbench wrote") from None
    header = _check_lines(path, content)
    if header is None:
        return pd.DataFrame()
    numbers = [name for name in header if text is None or name not in text]
    try:
        frame = pd.read_csv(
            io.StringIO(content), keep_default_na=False, na_values={name: NOT_MEASURED for name in numbers},
            dtype={name: object for name in header if name not in numbers}, **EXACT,
        )  # fmt: skip
    except (ValueError, pd.errors.ParserError) as error:  # _check_lines lets no such file through
        raise KvbenchError(f"{path}: not CSV ({str(error).strip()})") from None
    for name in numbers:
        column = frame[name]
        if column.dtype.kind in "iuf":
            continue
        if not len(column):
            frame[name] = column.astype(np.float64)
        elif text is not None:  # words (or True/False, which pandas reads as booleans)
            row = _first_word(column)
            bad = str(column.iloc[row])  # as written: True, not pandas' boolean
            raise KvbenchError(f"{path}: column {name!r}, line {row + 2}: {bad!r} is not a number")
        else:  # a column of words: empty cells stay empty text
            frame[name] = column.astype(object).where(column.notna(), "")
    return frame


def _check_lines(path: Path, content: str) -> list[str] | None:
    """The header, after checking every line has as many cells (None: no header).

    pandas pads a short line with empty cells and stops at a long one with a message of its
    own; a short line is what a killed writer leaves, so every line is counted here first.
    """
    reader = csv.reader(io.StringIO(content))
    line = 0  # the last line read whole: an error is on the next
    try:
        header = next(reader, None)
        if header is None:
            return None
        line = reader.line_num
        if "" in header:  # pandas would name it "Unnamed: i", and no reader asks for that
            raise KvbenchError(f"{path}: line 1: a column without a name: not a table kvbench wrote")
        twice = next((name for name in header if header.count(name) > 1), None)
        if twice is not None:  # pandas would read the second as "name.1", unchecked
            raise KvbenchError(f"{path}: line 1: column {twice!r} appears twice: not a table kvbench wrote")
        for row in reader:
            line = reader.line_num
            if len(row) != len(header):
                raise KvbenchError(f"{path}: line {line} has {len(row)} cells, the header {len(header)}")
    except csv.Error as error:
        raise KvbenchError(f"{path}: line {line + 1}: not CSV ({error})") from None
    return header


def _first_word(column: pd.Series) -> int:
    """The row of the first cell of `column` that is not a number (NaN cells were empty)."""
    if column.dtype == bool:  # True/False: pandas' booleans, not numbers
        return 0
    words = pd.to_numeric(column.astype(object), errors="coerce").isna() & column.notna()
    return int(np.flatnonzero(words.to_numpy(dtype=bool))[0])


@dataclass(frozen=True, eq=False)
class Run:
    """One run folder: its summary, config and environment (dicts), steps and requests
    (DataFrames), all read when it is loaded, so a broken file stops every reader at once.

    `label` tells runs apart in plots and tables: the folder name, or a longer relative path
    where several selected folders share a name (see `label_runs`).
    """

    path: Path
    label: str
    summary: dict
    config: dict
    env: dict
    steps: pd.DataFrame
    requests: pd.DataFrame

    @property
    def engine(self) -> str:
        return str(self.summary.get("engine", self.config.get("engine", "?")))

    @property
    def rate(self) -> float | None:
        """Requests/s the workload asked for (None: replayed timestamps or all at once)."""
        rate = (self.config.get("workload") or {}).get("rate")
        return float(rate) if rate is not None else None

    @property
    def occupancy(self) -> tuple[dict[str, float], bool]:
        """Figure 2's breakdown: the saturated occupancy where the run ever saturated, else busy.

        Returns (fractions, saturated?).
        """
        saturated = self.summary.get("occupancy_saturated") or {}
        if saturated:
            return saturated, True
        return self.summary.get("occupancy") or {}, False

    @property
    def arena_bytes(self) -> tuple[float | None, str]:
        """The KV arena's size in bytes and where it came from (summary or slots x bytes/token)."""
        if self.summary.get("arena_bytes") is not None:
            return float(self.summary["arena_bytes"]), "arena_bytes"
        slots, per_token = self.summary.get("num_slots"), self.summary.get("kv_bytes_per_token")
        if slots and per_token:
            return float(slots) * float(per_token), "num_slots × kv_bytes_per_token"
        return None, ""


def _summary_and_config(path: Path) -> tuple[dict, dict]:
    """summary.json with every key kvbench writes (`checks.check_run_summary`), and config.json."""
    summary = check_summary(path / "summary.json", read_json(path / "summary.json"))
    if not summary:
        raise KvbenchError(f"{path}: {NOT_RESULTS}")
    check_run_summary(path / "summary.json", summary)
    return summary, check_config(path / "config.json", read_json(path / "config.json"))


def _table(path: Path, text: Collection[str], check, summary: dict) -> pd.DataFrame:
    """A run's steps.csv or requests.csv, checked against its summary where the folder has it
    (a sweep may leave both out); an empty DataFrame where it has not."""
    found = table_path(path)
    frame = read_csv(path, text=text)
    return frame if found is None else check(found, frame, summary)


def folder_path(path: Path | str) -> Path:
    """`path` as a Path, refusing an empty string: Path('') is the current folder, which a
    caller who passed '' never named (`load_runs('')` read every run below it)."""
    if isinstance(path, str) and not path.strip():
        raise KvbenchError("an empty path names no folder (the current one is '.')")
    return Path(path)


def load_run(path: Path | str, label: str | None = None) -> Run:
    """The run folder at `path` (summary.json, config.json, env.json, steps.csv, requests.csv),
    every file checked to hold what kvbench writes (`kvbench.results.checks`)."""
    path = folder_path(path)
    summary, config = _summary_and_config(path)
    return Run(
        path, label or path.name, summary, config, read_json(path / "env.json"),
        _table(path / "steps.csv", STEP_TEXT, check_steps, summary),
        _table(path / "requests.csv", (), check_requests, summary),
    )  # fmt: skip


def label_runs(paths: Sequence[Path]) -> list[str]:
    """Short distinct names: folder names, lengthened with parents where two would collide."""
    paths = [Path(p).resolve() for p in paths]
    depth = 1
    while True:
        labels = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(labels)) == len(labels) or depth >= max((len(p.parts) for p in paths), default=1):
            return labels
        depth += 1


def as_runs(runs: Iterable[Run | Path | str]) -> list[Run]:
    """Accept loaded runs or folder paths (plot functions take either)."""
    runs = list(runs)
    paths = [folder_path(r) for r in runs if not isinstance(r, Run)]
    labels = iter(label_runs(paths))
    return [r if isinstance(r, Run) else load_run(Path(r), next(labels)) for r in runs]


def runs_below(path: Path, *, steps: bool = False) -> list[Path]:
    """`path` if it is a run folder (summary.json and config.json, and steps.csv where `steps`),
    else the run folders anywhere below it (a sweep's `cells/`, a demo's or a reproduction's
    folders), in name order; hidden folders (a run being written) are skipped."""
    path = Path(path)

    def is_run(folder: Path) -> bool:
        need = ("summary.json", "config.json", "steps.csv") if steps else ("summary.json", "config.json")
        return all(table_path(folder / name) is not None for name in need)

    if is_run(path):
        return [path]
    return sorted(
        summary.parent for summary in path.rglob("summary.json")
        if is_run(summary.parent)
        and not any(part.startswith(".") for part in summary.parent.relative_to(path).parts)
    )  # fmt: skip


def _scalar(value) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


# the settings that tell runs of a comparison apart, first in a row of `load_runs`
FIRST_SETTINGS = ("engine", "model", "trace", "rate", "arrivals", "num_requests", "seed", "block_size",
                  "kv_cache_gib", "emulate_gpu")  # fmt: skip


def settings(config: dict) -> dict:
    """A run's settings as one flat row: config.json's scalars, its workload's beside them
    (`source` named `trace`), nested objects (cost model, SLO) and lists left out."""
    workload = config.get("workload") or {}
    row = {"trace" if key == "source" else key: v for key, v in workload.items() if _scalar(v)}
    row.update({key: v for key, v in config.items() if key != "workload" and _scalar(v)})
    return {key: row[key] for key in FIRST_SETTINGS if key in row} | row


def load_runs(paths: Path | str | Iterable[Path | str]) -> pd.DataFrame:
    """One row per run folder under `paths` (a run, a sweep's cells, a demo's or a
    reproduction's folder): `label`, `path`, the settings of config.json (`settings`), then
    summary.json's scalars, which win where both name a value (summary.json holds what ran:
    `dtype` resolved, `trace` named). Only summary.json and config.json are read.
    """
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    folders: list[Path] = []
    for path in map(folder_path, paths):
        below = runs_below(path)
        if not below:
            raise KvbenchError(f"{path}: {NOT_RESULTS}")
        folders += below
    folders = list(dict.fromkeys(folders))  # a run named twice counts once
    rows = []
    for folder, label in zip(folders, label_runs(folders), strict=True):
        summary, config = _summary_and_config(folder)
        scalars = {key: v for key, v in summary.items() if _scalar(v)}
        rows.append({"label": label, "path": str(folder), **settings(config), **scalars})
    return pd.DataFrame(rows)


@dataclass(frozen=True, eq=False)
class Sweep:
    """A sweep folder: `cells` (sweep.csv, one row per cell), `sustained` (sustained.csv, one
    row per group; empty where the sweep swept no rate) and `folders`, the cell folders that
    hold a summary.json (in name order: load them with `load_run` or `load_runs`)."""

    path: Path
    cells: pd.DataFrame
    sustained: pd.DataFrame
    folders: tuple[Path, ...]

    @property
    def num_cells(self) -> int:
        return len(self.cells)

    def column(self, name: str, default: float = math.nan) -> np.ndarray:
        """A numeric sweep.csv column as floats, or `default` everywhere where the sweep did not
        write it."""
        if name not in self.cells:
            return np.full(self.num_cells, default)
        return self.cells[name].to_numpy(dtype=np.float64)

    def strings(self, name: str, default: str = "") -> np.ndarray:
        """A sweep.csv column as text (numbers printed plainly, `default` where empty)."""
        if name not in self.cells:
            return np.full(self.num_cells, default, dtype=object)
        values = self.cells[name]
        if pd.api.types.is_numeric_dtype(values):
            return np.array([f"{v:g}" if v == v else default for v in values], dtype=object)
        return np.array([v if v != "" else default for v in values.astype(str)], dtype=object)


def load_sweep(path: Path | str) -> Sweep:
    """The sweep folder at `path` (sweep.csv, optional sustained.csv, cells/)."""
    path = folder_path(path)
    if not (path / "sweep.csv").is_file():
        raise KvbenchError(f"{path}: {NOT_RESULTS}")
    cells = read_csv(path / "sweep.csv", text=SWEEP_TEXT)
    missing = [name for name in SWEEP_KEYS if name not in cells]
    if missing:  # a garbage file would otherwise report an empty sweep
        raise KvbenchError(f"{path / 'sweep.csv'}: no {missing[0]} column: not a sweep kvbench wrote")
    if cells.empty:  # kvbench lists every planned cell from the start, pending ones too
        raise KvbenchError(f"{path / 'sweep.csv'}: no cells (a header alone): not a sweep kvbench wrote")
    if "rate" in cells:  # req/s of a loaded cell (kvbench.flag_ranges' bounds); empty: an unloaded one
        rates = cells["rate"].to_numpy(dtype=np.float64)  # [cells]
        bad = ~np.isnan(rates) & ~((rates >= MIN_RATE) & (rates < np.inf))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise KvbenchError(
                f"{path / 'sweep.csv'}: column 'rate', line {row + 2}: {float(rates[row])!r} is not a rate "
                f"(requests/s >= {MIN_RATE:g}, or empty for an unloaded cell)"
            )
    folder = path / "cells"
    folders = sorted(p for p in folder.iterdir() if (p / "summary.json").is_file()) if folder.is_dir() else []
    return Sweep(path, cells, read_csv(path / "sustained.csv", text=SUSTAINED_TEXT), tuple(folders))


def load_figures(path: Path | str) -> pd.DataFrame:
    """A reproduction's tables (`kvbench reproduce --out PATH`): every `<figure>/figure.csv`
    below `path`, one row per number (`figure`, `engine`, `workload`, `metric`, then
    `kvbench`, `paper` and `ratio` as floats, NaN where there is none), figures in name order."""
    path = folder_path(path)
    files = sorted(p for p in path.glob("*/figure.csv") if not p.parent.name.startswith("."))
    if not files:
        raise KvbenchError(f"{path}: not a kvbench reproduce folder (no <figure>/figure.csv)")
    frames = [read_csv(f, text=FIGURE_TEXT) for f in files]
    for f, frame in zip(files, frames, strict=True):
        missing = [name for name in (*FIGURE_TEXT, "kvbench", "paper") if name not in frame]
        if missing:
            raise KvbenchError(f"{f}: no {missing[0]} column: not a figure table kvbench wrote")
    frame = pd.concat(frames, ignore_index=True)
    for name in ("kvbench", "paper", "ratio"):  # a figure with no paper value reads as integers
        if name in frame:
            frame[name] = frame[name].astype(np.float64)
    return frame
