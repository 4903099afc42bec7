"""Saved results read back: run folders and sweep folders, as plots and reports see them.

Results on disk are the source of truth (DESIGN.md, "Results on disk"), so everything a plot
or a report shows is read here from the files a run wrote, never from a live run. Columns are
read by name and every column beyond the ones a plot needs is optional: collectors add
step columns (torch/NVML memory, roofline) and metrics add summary keys over time, and an
older folder without them must still render.

CSV files become `Table`s: one numpy array per column, floats where every value parses as a
number (empty cells are NaN), strings otherwise. pandas is not a kvbench dependency.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.results.shape import STEP_TEXT, SWEEP_KEYS, SWEEP_TEXT, check_config, check_summary

Table = dict[str, np.ndarray]  # column name -> (rows,) array, float or str


def read_table(path: Path, text: Collection[str] | None = None) -> Table:
    """A CSV file as columns; a missing file is an empty table.

    `text`: the columns that may hold words; every other one must hold numbers (empty cells
    are NaN), or the file is refused naming its column and line. None: any column may hold
    words. A file that is not UTF-8, not CSV or has a short line (a truncated write) is refused
    the same way: one line naming the file, never a traceback or a silently wrong plot.
    """
    if not path.is_file():
        return {}
    line = 1
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            rows = []
            for row in reader:
                line = reader.line_num
                rows.append(row)
    except UnicodeDecodeError as error:
        raise KvbenchError(f"{path}: not UTF-8 text (byte {error.start}): not a file kvbench wrote") from None
    except csv.Error as error:
        raise KvbenchError(f"{path}: line {line + 1}: not CSV ({error})") from None
    except OSError as error:
        raise KvbenchError(f"{path}: cannot read it ({error.strerror})") from None
    if header is None:
        return {}
    for n, row in enumerate(rows, 2):
        if len(row) != len(header):
            raise KvbenchError(f"{path}: line {n} has {len(row)} cells, the header {len(header)}")
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    table = {name: _column(values) for name, values in zip(header, columns, strict=True)}
    for name, values in table.items():
        if text is not None and name not in text and values.dtype.kind != "f":
            row = next(i for i, v in enumerate(values) if v != "" and not _is_float(v))
            bad = str(values[row])
            raise KvbenchError(f"{path}: column {name!r}, line {row + 2}: {bad!r} is not a number")
    return table


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _column(values: Sequence[str]) -> np.ndarray:
    try:
        return np.array(values, dtype=np.float64)  # numpy parses the strings: fast for long step files
    except ValueError:
        pass
    try:
        return np.array([float(v) if v != "" else math.nan for v in values], dtype=np.float64)
    except ValueError:
        return np.array(values, dtype=str)


def read_json(path: Path) -> dict:
    """A JSON object from `path`; a missing file is `{}`, a broken one a one-line error."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise KvbenchError(f"{path}: not UTF-8 text (byte {error.start}): not a file kvbench wrote") from None
    except json.JSONDecodeError as error:
        raise KvbenchError(f"{path}: not valid JSON ({error}): truncated or not kvbench's") from None
    except OSError as error:
        raise KvbenchError(f"{path}: cannot read it ({error.strerror})") from None
    if not isinstance(data, dict):
        raise KvbenchError(f"{path}: expected a JSON object, got a JSON {_json_type(data)}")
    return data


def _json_type(value) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


@dataclass(frozen=True)
class Run:
    """One run folder: its summary, config and environment; steps and requests read on demand.

    `label` tells runs apart in plots and tables: the folder name, or a longer relative path
    where several selected folders share a name (see `label_runs`).
    """

    path: Path
    summary: dict
    config: dict
    env: dict
    label: str

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

    @cached_property
    def steps(self) -> Table:
        return read_table(self.path / "steps.csv", text=STEP_TEXT)

    @cached_property
    def requests(self) -> Table:
        return read_table(self.path / "requests.csv", text=())


def read_run(path: Path, label: str | None = None) -> Run:
    path = Path(path)
    summary = check_summary(path / "summary.json", read_json(path / "summary.json"))
    if not summary:
        raise KvbenchError(f"{path}: not a kvbench results folder (no summary.json or sweep.csv)")
    config = check_config(path / "config.json", read_json(path / "config.json"))
    run = Run(path, summary, config, read_json(path / "env.json"), label or path.name)
    run.steps, run.requests  # noqa: B018 -- read now: a broken file stops every reader, not only plots
    return run


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
    paths = [Path(r) for r in runs if not isinstance(r, Run)]
    labels = iter(label_runs(paths))
    return [r if isinstance(r, Run) else read_run(Path(r), next(labels)) for r in runs]


@dataclass(frozen=True)
class Sweep:
    """A sweep folder: `sweep.csv` (one row per cell), optional `sustained.csv`, and `cells/`."""

    path: Path
    cells: Table
    sustained: Table

    @property
    def num_cells(self) -> int:
        return len(next(iter(self.cells.values()), ()))

    def column(self, name: str, default: float = math.nan) -> np.ndarray:
        """A sweep.csv column, or `default` everywhere where the sweep did not write it."""
        values = self.cells.get(name)
        return values if values is not None else np.full(self.num_cells, default)

    def strings(self, name: str, default: str = "") -> np.ndarray:
        values = self.cells.get(name)
        if values is None:
            return np.full(self.num_cells, default, dtype=object)
        if values.dtype.kind == "f":  # a column of numbers read as floats: print them plainly
            return np.array([f"{v:g}" if v == v else default for v in values], dtype=object)
        return values.astype(object)

    def run_folders(self) -> list[Path]:
        """Cell folders holding a summary.json, in name order."""
        cells = self.path / "cells"
        if not cells.is_dir():
            return []
        return sorted(p for p in cells.iterdir() if (p / "summary.json").is_file())


def read_sweep(path: Path) -> Sweep:
    path = Path(path)
    if not (path / "sweep.csv").is_file():
        raise KvbenchError(f"{path}: not a kvbench results folder (no summary.json or sweep.csv)")
    cells = read_table(path / "sweep.csv", text=SWEEP_TEXT)
    missing = [name for name in SWEEP_KEYS if name not in cells]
    if missing:  # a garbage file would otherwise report an empty sweep
        raise KvbenchError(f"{path / 'sweep.csv'}: no {missing[0]} column: not a sweep kvbench wrote")
    return Sweep(path, cells, read_table(path / "sustained.csv"))
