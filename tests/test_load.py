"""Saved results read back as DataFrames (kvbench.load_run, load_sweep, load_runs, load_figures),
on the committed result folders and on folders written by the real simulator and sweep; broken
files refused with one line; env.json's commit is kvbench's own checkout's."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import kvbench
from kvbench.errors import KvbenchError
from kvbench.metrics.occupancy import CATEGORIES
from kvbench.results.files import checkout_sha, environment
from kvbench.results.load import read_csv, runs_below
from kvbench.results.packed import table_bytes

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "results" / "reproduce" / "quick-real"  # committed: a real reproduction on an H200
SIMULATED = ROOT / "results" / "reproduce" / "quick-simulated"  # committed: its tables only
DOC = ROOT / "docs" / "RESULTS_FILES.md"


def kvbench_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("load") / "paged"
    proc = kvbench_cli("simulate", "--engine", "paged", "--num-requests", "20", "--rate", "4",
                       "--kv-cache-gib", "2", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("load") / "sweep"
    proc = kvbench_cli("sweep", "--engines", "paged,orca-max", "--rates", "2,8", "--kv-cache-gib", "2",
                       "--num-requests", "16", "--latency-threshold", "1", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


# ---- what loads, and that it is what the files hold ------------------------------------------


def test_load_run_reads_a_simulated_run_as_the_files_hold_it(simulated):
    run = kvbench.load_run(simulated)
    summary = json.loads((simulated / "summary.json").read_text())
    assert run.summary == summary and run.label == "paged" and run.engine == "paged" and run.rate == 4.0
    assert run.config == json.loads((simulated / "config.json").read_text())
    assert run.env["git_sha"] == checkout_sha(ROOT)
    steps, requests = rows_of(simulated / "steps.csv"), rows_of(simulated / "requests.csv")
    assert isinstance(run.steps, pd.DataFrame) and list(run.steps.columns) == list(steps[0])
    assert len(run.steps) == len(steps) and len(run.requests) == len(requests) == 20
    assert run.steps["kind"].tolist() == [row["kind"] for row in steps]  # the one text column
    assert run.steps["num_tokens"].dtype == np.int64  # counts stay integers
    assert run.steps["duration_s"].tolist() == [float(row["duration_s"]) for row in steps]
    assert run.requests["e2el_s"].tolist() == [float(row["e2el_s"]) for row in requests]
    assert run.requests["output_len"].sum() == sum(int(row["output_len"]) for row in requests)
    occupancy, saturated = run.occupancy
    assert occupancy == (summary["occupancy_saturated"] if saturated else summary["occupancy"])


def test_load_run_reads_a_committed_real_run_with_its_collector_columns():
    folder = REAL / "fig2" / "paged"
    run = kvbench.load_run(folder)
    assert run.summary["mode"] == "real" and run.engine == "paged"
    steps = rows_of(folder / "steps.csv")
    assert len(run.steps) == len(steps) and "roofline_s" in run.steps
    written = [float(row["roofline_s"]) for row in steps]  # "nan" on prefill rows
    assert np.array_equal(run.steps["roofline_s"].to_numpy(), written, equal_nan=True)
    assert run.steps["roofline_s"].isna().sum() == sum(row["kind"] == "prefill" for row in steps) > 0
    assert run.arena_bytes == (float(run.summary["arena_bytes"]), "arena_bytes")


def test_load_sweep_reads_a_sweep_the_real_sweep_wrote(swept):
    sweep = kvbench.load_sweep(swept)
    written = rows_of(swept / "sweep.csv")
    assert len(sweep.cells) == sweep.num_cells == len(written) > 0
    assert sweep.cells["cell_id"].tolist() == [row["cell_id"] for row in written]
    assert sweep.cells["rate"].tolist() == [float(row["rate"]) for row in written]
    assert [p.name for p in sweep.folders] == sorted(row["cell_id"] for row in written)
    assert sorted(sweep.sustained["engine"]) == ["orca-max", "paged"]
    assert sweep.strings("engine").tolist() == [row["engine"] for row in written]


def test_load_sweep_reads_a_committed_sweep():
    folder = REAL / "fig12" / "sharegpt-paper"
    sweep = kvbench.load_sweep(folder)
    assert len(sweep.cells) == len(rows_of(folder / "sweep.csv"))
    assert len(sweep.folders) == len(list((folder / "cells").glob("*/summary.json")))
    assert list(sweep.sustained.columns) == list(rows_of(folder / "sustained.csv")[0])


def test_load_runs_is_one_row_per_run_with_its_settings_and_summary(simulated, swept):
    frame = kvbench.load_runs([simulated, swept])
    cells = sorted(p.parent for p in (swept / "cells").glob("*/summary.json"))
    assert frame["path"].tolist() == [str(simulated), *map(str, cells)]
    for row, folder in zip(frame.to_dict("records"), [simulated, *cells], strict=True):
        summary = json.loads((folder / "summary.json").read_text())
        config = json.loads((folder / "config.json").read_text())
        assert row["engine"] == config["engine"] and row["block_size"] == config["block_size"]
        assert row["rate"] == config["workload"]["rate"] and row["seed"] == config["workload"]["seed"]
        assert row["kv_cache_gib"] == config["kv_cache_gib"] and row["trace"] == summary["trace"]
        assert row["request_throughput"] == summary["request_throughput"]
        assert "occupancy" not in row and "percentiles" not in row  # objects and lists stay in summary
    assert list(frame.columns[:4]) == ["label", "path", "engine", "model"]


def test_load_runs_reads_every_run_of_a_committed_reproduction():
    frame = kvbench.load_runs(REAL)
    folders = sorted(
        p.parent for p in REAL.rglob("summary.json") if (p.parent / "config.json").is_file()
    )
    assert frame["path"].tolist() == [str(p) for p in folders] and len(folders) > 50
    assert set(frame["mode"]) == {"real"} and frame["label"].is_unique
    fig2 = frame[frame["path"].str.contains("/fig2/")]
    assert sorted(fig2["engine"]) == sorted(["static", "orca-max", "orca-pow2", "orca-oracle", "paged"])


def test_load_figures_reads_a_committed_reproductions_tables():
    frame = kvbench.load_figures(SIMULATED)
    files = sorted(SIMULATED.glob("*/figure.csv"))
    assert len(frame) == sum(len(rows_of(f)) for f in files)
    assert sorted(set(frame["figure"])) == sorted(f.parent.name for f in files)
    paged = frame[(frame["figure"] == "fig2") & (frame["engine"] == "paged")]
    written = {r["metric"]: r for r in rows_of(SIMULATED / "fig2" / "figure.csv") if r["engine"] == "paged"}
    for row in paged.to_dict("records"):
        assert row["kvbench"] == float(written[row["metric"]]["kvbench"])
    assert frame["paper"].dtype == np.float64 and frame["paper"].isna().any()  # no paper number: NaN


def test_import_kvbench_stays_light_and_loads_on_first_use():
    code = ("import sys, kvbench; assert 'pandas' not in sys.modules and 'torch' not in sys.modules; "
            "kvbench.load_run; assert 'pandas' in sys.modules; print(sorted(kvbench.__all__))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "load_runs" in proc.stdout
    with pytest.raises(AttributeError, match="load_nothing"):
        kvbench.load_nothing  # noqa: B018


def test_numbers_read_back_exactly_as_written_words_and_gaps_as_they_are(tmp_path):
    """Every float as Python's csv wrote it (pandas 2's default parser misses some by one unit in
    the last place), integers as int64, empty and `nan` cells as NaN, words kept as text."""
    floats = np.random.default_rng(0).random(2000) * 10.0 ** np.arange(-8, 12).repeat(100)
    path = tmp_path / "steps.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "duration_s", "roofline_s", "kind"])
        for i, x in enumerate(floats):
            writer.writerow([i, x, math.nan if i % 3 else x, "" if i % 5 else "decode"])
    frame = read_csv(path, text=("kind",))
    assert frame["duration_s"].tolist() == floats.tolist()  # bit for bit
    assert frame["step"].dtype == np.int64 and frame["step"].tolist() == list(range(len(floats)))
    assert frame["roofline_s"].isna().sum() == sum(1 for i in range(len(floats)) if i % 3)
    assert frame["kind"].tolist() == ["" if i % 5 else "decode" for i in range(len(floats))]
    path.write_text("step,duration_s\n0,True\n")
    with pytest.raises(KvbenchError, match=r"column 'duration_s', line 2: 'True' is not a number$"):
        read_csv(path, text=())
    path.write_text("engine,rate,how\npaged,2,\norca-max,,under 2\n")  # words where nothing says which
    frame = read_csv(path)
    assert frame["engine"].tolist() == ["paged", "orca-max"] and frame["how"].tolist() == ["", "under 2"]
    assert np.array_equal(frame["rate"].to_numpy(), [2.0, math.nan], equal_nan=True)


# ---- broken files: one line naming the file, line and column ---------------------------------


def _replace_cell(path: Path, line: int, column: str, value: str) -> None:
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[line - 1].split(",")
    cells[header.index(column)] = value
    lines[line - 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


BROKEN = {  # name: (change to a copy of a run folder, file it names, what the line must say)
    "steps a word": (
        lambda run: _replace_cell(run / "steps.csv", 3, "duration_s", "fast"),
        "steps.csv", "column 'duration_s', line 3: 'fast' is not a number",
    ),
    "steps truncated": (
        lambda run: (run / "steps.csv").write_bytes((run / "steps.csv").read_bytes()[:-20]),
        "steps.csv", "cells, the header",
    ),
    "steps a long line": (
        lambda run: (run / "steps.csv").open("a").write("1," * 40 + "1\n"),
        "steps.csv", "has 41 cells, the header",
    ),
    "steps not utf-8": (
        lambda run: (run / "steps.csv").open("ab").write(b"\xff\xfe\n"),
        "steps.csv", "not UTF-8",
    ),
    "requests a word": (
        lambda run: _replace_cell(run / "requests.csv", 2, "prompt_len", "long"),
        "requests.csv", "column 'prompt_len', line 2: 'long' is not a number",
    ),
    "summary truncated": (
        lambda run: (run / "summary.json").write_text((run / "summary.json").read_text()[:50]),
        "summary.json", "not valid JSON",
    ),
    "config block size a word": (
        lambda run: (run / "config.json").write_text(
            json.dumps(json.loads((run / "config.json").read_text()) | {"block_size": "16"})
        ),
        "config.json", "'block_size' must be a number",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_run_is_refused_in_one_line_naming_the_file(simulated, tmp_path, case):
    change, name, message = BROKEN[case]
    run = shutil.copytree(simulated, tmp_path / "run")
    change(run)
    with pytest.raises(KvbenchError) as error:
        kvbench.load_run(run)
    line = str(error.value)
    assert "\n" not in line and line.startswith(f"{run / name}: ") and message in line, line
    if name.endswith(".json"):
        with pytest.raises(KvbenchError, match=re.escape(str(run / name))):
            kvbench.load_runs(run)


def test_a_broken_sweep_or_figure_table_is_refused_in_one_line(swept, tmp_path):
    sweep = shutil.copytree(swept, tmp_path / "sweep", ignore=shutil.ignore_patterns("cells"))
    _replace_cell(sweep / "sweep.csv", 2, "rate", "many")
    with pytest.raises(KvbenchError, match=r"sweep\.csv: column 'rate', line 2: 'many' is not a number$"):
        kvbench.load_sweep(sweep)
    (sweep / "sweep.csv").write_text("a,b\n1,2\n")
    with pytest.raises(KvbenchError, match="no engine column: not a sweep kvbench wrote"):
        kvbench.load_sweep(sweep)
    with pytest.raises(KvbenchError, match="not a kvbench results folder"):
        kvbench.load_sweep(tmp_path / "nowhere")
    figures = tmp_path / "reproduce"
    shutil.copytree(SIMULATED / "fig2", figures / "fig2")
    _replace_cell(figures / "fig2" / "figure.csv", 2, "kvbench", "lots")
    with pytest.raises(KvbenchError, match=r"figure\.csv: column 'kvbench', line 2: 'lots' is not a number$"):
        kvbench.load_figures(figures)
    with pytest.raises(KvbenchError, match="not a kvbench reproduce folder"):
        kvbench.load_figures(tmp_path / "sweep")
    with pytest.raises(KvbenchError, match="not a kvbench results folder"):
        kvbench.load_runs(tmp_path / "sweep")


# ---- every column documented -------------------------------------------------------------------


PLACEHOLDERS = {  # what each <placeholder> of docs/RESULTS_FILES.md stands for
    "metric": "|".join(("ttft_s", "tpot_s", "itl_s", "e2el_s", "queueing_s")),
    "percentile": r"[0-9]+(?:\.[0-9]+)?",
    "category": "|".join(CATEGORIES),
}


def _documented() -> tuple[set[str], list[re.Pattern]]:
    """Names in backticks in docs/RESULTS_FILES.md; those with <placeholders> become patterns."""
    names = set(re.findall(r"`([^`\s]+)`", DOC.read_text()))
    patterns = []
    for name in (n for n in names if re.search(r"<\w+>", n)):
        parts = re.split(r"<(\w+)>", name)  # text, placeholder, text, ...
        patterns.append(re.compile("".join(
            f"(?:{PLACEHOLDERS[part]})" if i % 2 else re.escape(part) for i, part in enumerate(parts)
        )))  # fmt: skip
    return names, patterns


def _undocumented(keys, names: set[str], patterns: list[re.Pattern]) -> list[str]:
    return sorted(k for k in keys if k not in names and not any(p.fullmatch(k) for p in patterns))


def _keys(folder: Path) -> set[str]:
    """Every column and key a run folder's files hold (headers and JSON keys, read plainly)."""
    keys = set()
    for name in ("steps.csv", "requests.csv"):  # plain or packed (committed results pack large ones)
        data = table_bytes(folder / name)
        if data:
            keys |= set(next(csv.reader(io.StringIO(data.decode()))))
    summary, config = (json.loads((folder / name).read_text()) for name in ("summary.json", "config.json"))
    keys |= set(summary) | set(config) | set(config["workload"])
    keys |= {f"{a}.{b}" for a, v in summary.items() if isinstance(v, dict) and a != "slo" for b in v}
    if (folder / "env.json").is_file():
        keys |= set(json.loads((folder / "env.json").read_text()))
    return keys


def test_every_column_and_key_a_run_writes_is_documented(simulated, swept):
    """Of the runs written here and of every committed result folder (real runs with collectors,
    vmm, prefix caching, sharing), sweeps and reproduced figures."""
    names, patterns = _documented()
    results = ROOT / "results"
    keys = set()
    for folder in [simulated, *kvbench.load_sweep(swept).folders, *runs_below(results)]:
        keys |= _keys(folder)
    for table in [swept / "sweep.csv", swept / "sustained.csv", *results.rglob("sweep.csv"),
                  *results.rglob("sustained.csv"), *results.rglob("figure.csv")]:  # fmt: skip
        keys |= set(next(csv.reader(table.open(newline=""))))
    assert not _undocumented(keys, names, patterns), "add these to docs/RESULTS_FILES.md"
    assert _undocumented({"p99_ttft_s", "p99_ttft", "mean_nothing_s", "occupancy_x"}, names, patterns) == [
        "mean_nothing_s", "occupancy_x", "p99_ttft"
    ]  # the patterns name what they stand for, no more


# ---- env.json's commit: kvbench's own checkout, never the current directory's repository -------


def _git(where: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(where)}  # fmt: skip
    return subprocess.run(["git", *args], cwd=where, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    _git(path, "init", "-q")
    (path / "README").write_text("another project\n")
    _git(path, "add", "README")
    _git(path, "commit", "-q", "-m", "another project")
    return path


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_env_records_kvbench_s_own_commit_not_the_current_directory_s(tmp_path, monkeypatch):
    other = _repo(tmp_path / "other")
    monkeypatch.chdir(other)  # the current directory is some other repository
    ours = checkout_sha(ROOT)
    if (ROOT / ".git").exists():
        assert ours == _git(ROOT, "rev-parse", "HEAD") != _git(other, "rev-parse", "HEAD")
    assert environment()["git_sha"] == ours
    # a copy of kvbench/ inside another repository (as in a vendored or site-packages copy)
    vendored = other / "vendor"
    shutil.copytree(ROOT / "kvbench", vendored / "kvbench", ignore=shutil.ignore_patterns("__pycache__"))
    assert checkout_sha(vendored) == "unknown"
    assert checkout_sha(other) == "unknown"  # the top of a work tree, but not holding kvbench/
    code = ("import json, kvbench.results.files as f; "
            "print(json.dumps([f.__file__, f.environment()['git_sha']]))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=other, env={"PYTHONPATH": str(vendored),
                          "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    where, sha = json.loads(proc.stdout.splitlines()[-1])
    assert Path(where).is_relative_to(vendored) and sha == "unknown"
    # a checkout of kvbench of its own: its commit
    checkout = _repo(tmp_path / "checkout")
    (checkout / "kvbench").mkdir()
    (checkout / "kvbench" / "__init__.py").write_text("")
    _git(checkout, "add", "kvbench")
    _git(checkout, "commit", "-q", "-m", "kvbench")
    assert checkout_sha(checkout) == _git(checkout, "rev-parse", "HEAD")
    assert checkout_sha(checkout / "kvbench") == "unknown"
