"""A run folder is loaded only if its files hold what kvbench writes (kvbench.results.checks):
every key of summary.json kvbench always writes, counts that are whole numbers >= 0, `completed`
at most `num_requests`, NaN or null only where kvbench writes them, steps.csv and requests.csv
with their header and the rows summary.json counts. A damaged folder stops `kvbench compare` and
`kvbench report` with one line naming the file and the key, column or line, and exit code 2.

Damage is done by hand to real tiny runs `kvbench simulate` writes; `compare` and `report` run
in this process through the `kvbench` script's entry point (`sys.argv` set, SystemExit caught),
as tests/test_bad_flags.py does.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import shutil
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

import kvbench
from kvbench.cli.app import main
from kvbench.engine import StepRecord
from kvbench.errors import KvbenchError
from kvbench.metrics.summary import RequestRecord
from kvbench.results import checks
from kvbench.results.load import runs_below

ROOT = Path(__file__).resolve().parent.parent
SIMULATE = ("simulate", "--engine", "paged", "--model", "opt-125m", "--num-requests", "5", "--rate", "4",
            "--kv-cache-gib", "1")  # fmt: skip


def simulate(out: Path, outputs: str) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "kvbench", *SIMULATE, "--trace", f"uniform:prompt=4..30,output={outputs}",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """5 requests of 2 to 12 output tokens: every latency defined."""
    return simulate(tmp_path_factory.mktemp("run") / "paged", "2..12")


@pytest.fixture(scope="module")
def one_token_run(tmp_path_factory) -> Path:
    """5 requests of one output token each: no TPOT and no inter-token gap (kvbench writes NaN)."""
    return simulate(tmp_path_factory.mktemp("one") / "paged", "1..1")


def kvbench_cli(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `kvbench ARGS`."""
    monkeypatch.setattr(sys, "argv", ["kvbench", *args])
    with pytest.raises(SystemExit) as done:
        main()
    out, err = capsys.readouterr()
    return done.value.code, out, err


# ---- ways to damage a run folder ---------------------------------------------------------------


def _summary(change):
    def damage(run: Path) -> Path:
        path = run / "summary.json"
        summary = json.loads(path.read_text())
        change(summary)
        path.write_text(json.dumps(summary, indent=2))  # NaN and Infinity as Python's json writes them
        return path

    return damage


def _rows(name: str, change):
    """Rewrite table `name` (header first) as `change(rows)` returns it."""

    def damage(run: Path) -> Path:
        path = run / name
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows(change(rows))
        return path

    return damage


def _cell(name: str, line: int, column: str, value: str):
    def change(rows: list[list[str]]) -> list[list[str]]:
        rows[line - 1][rows[0].index(column)] = value
        return rows

    return _rows(name, change)


def _without_column(name: str, column: str):
    def change(rows: list[list[str]]) -> list[list[str]]:
        at = rows[0].index(column)
        return [row[:at] + row[at + 1 :] for row in rows]

    return _rows(name, change)


def _zero_bytes(name: str):
    def damage(run: Path) -> Path:
        (run / name).write_bytes(b"")
        return run / name

    return damage


def _packed_header_only(run: Path) -> Path:
    header = (run / "steps.csv").read_text().splitlines(keepends=True)[0]
    (run / "steps.csv").unlink()
    (run / "steps.csv.gz").write_bytes(gzip.compress(header.encode(), mtime=0))
    return run / "steps.csv.gz"


def _set(key: str, value):
    return _summary(lambda s: s.__setitem__(key, value))


DAMAGE = {  # name: (damage to a copy of a run folder, returning the file; what the line must name)
    "summary a NaN metric": (_set("normalized_latency_s", math.nan), "'normalized_latency_s'"),
    "summary an Infinity rate": (_set("request_throughput", math.inf), "'request_throughput'"),
    "summary a negative count": (_set("num_requests", -1), "'num_requests'"),
    "summary completed above num_requests": (
        _summary(lambda s: s.__setitem__("num_requests", s["completed"] - 1)),
        "'completed'",
    ),
    "summary a count with a fraction": (_set("completed", 4.5), "'completed'"),
    "summary a null count": (_set("num_steps", None), "'num_steps'"),
    "summary no engine": (_summary(lambda s: s.pop("engine")), "'engine'"),
    "summary no percentile key": (_summary(lambda s: s.pop("p90_e2el_s")), "'p90_e2el_s'"),
    "summary one NaN of a distribution": (_set("p99_tpot_s", math.nan), "'p99_tpot_s'"),
    "summary a NaN occupancy": (
        _summary(lambda s: s["occupancy"].__setitem__("token_states", math.nan)),
        "'occupancy.token_states'",
    ),
    "steps zero bytes": (_zero_bytes("steps.csv"), "empty (no header line)"),
    "steps header only": (_rows("steps.csv", lambda rows: rows[:1]), "'num_steps'"),
    "steps packed header only": (_packed_header_only, "'num_steps'"),
    "steps a row missing": (_rows("steps.csv", lambda rows: rows[:-1]), "'num_steps'"),
    "steps no duration column": (_without_column("steps.csv", "duration_s"), "'duration_s'"),
    "steps an empty count": (_cell("steps.csv", 2, "batch_size", ""), "column 'batch_size', line 2"),
    "steps a NaN duration": (_cell("steps.csv", 2, "duration_s", "nan"), "column 'duration_s', line 2"),
    "requests zero bytes": (_zero_bytes("requests.csv"), "empty (no header line)"),
    "requests header only": (_rows("requests.csv", lambda rows: rows[:1]), "'completed'"),
    "requests a row missing": (_rows("requests.csv", lambda rows: rows[:-1]), "'completed'"),
    "requests no output_len column": (_without_column("requests.csv", "output_len"), "'output_len'"),
    "requests an empty count": (_cell("requests.csv", 3, "prompt_len", ""), "column 'prompt_len', line 3"),
    "requests a fraction of a token": (_cell("requests.csv", 2, "output_len", "2.5"), "column 'output_len'"),
    "requests an Infinity latency": (_cell("requests.csv", 4, "e2el_s", "inf"), "column 'e2el_s', line 4"),
    "requests a NaN TPOT of a long output": (_cell("requests.csv", 2, "tpot_s", "nan"), "column 'tpot_s'"),
}


@pytest.mark.parametrize("command", ["compare", "report"])
@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_run_is_one_line_naming_the_file_and_key(
    tmp_path, capsys, monkeypatch, run_dir, command, case
):
    damage, key = DAMAGE[case]
    run = shutil.copytree(run_dir, tmp_path / "run")
    path = damage(run)
    code, out, err = kvbench_cli(capsys, monkeypatch, command, str(run))
    assert code == 2, (out, err)
    assert "Traceback" not in out + err and err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"error: {path}: ") and key in err, err
    assert not (run / "report").exists()


def test_the_undamaged_run_loads_and_compare_and_report_show_it(tmp_path, capsys, monkeypatch, run_dir):
    run = kvbench.load_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert run.summary == summary and run.engine == "paged" and summary["completed"] == 5
    assert len(run.requests) == 5 and run.steps["num_steps"].sum() == summary["num_steps"] > 0
    assert all(math.isfinite(summary[key]) for key in ("normalized_latency_s", "mean_tpot_s", "p99_itl_s"))
    code, out, err = kvbench_cli(capsys, monkeypatch, "compare", str(run_dir))
    assert code == 0, err
    assert next(line for line in out.splitlines() if line.startswith("requests")).split()[-1] == "5/5"
    copy = shutil.copytree(run_dir, tmp_path / "run")
    code, _, err = kvbench_cli(capsys, monkeypatch, "report", str(copy))
    assert code == 0, err
    assert (copy / "report" / "report.html").is_file()


def test_nan_where_kvbench_writes_it_loads_and_nowhere_else(tmp_path, capsys, monkeypatch, one_token_run):
    """One-token outputs have no TPOT and no inter-token gap: kvbench writes NaN for every key of
    those two distributions, and the run loads; a NaN anywhere else in it is damage."""
    summary = json.loads((one_token_run / "summary.json").read_text())
    tpot = [key for key in summary if key.endswith("_tpot_s")]
    assert len(tpot) == 6 and all(math.isnan(summary[key]) for key in tpot)
    assert all(math.isnan(v) for key, v in summary.items() if key.endswith("_itl_s"))
    assert math.isfinite(summary["normalized_latency_s"]) and summary["completed"] == 5
    run = kvbench.load_run(one_token_run)
    assert run.requests["tpot_s"].isna().all() and (run.requests["output_len"] == 1).all()
    code, _, err = kvbench_cli(capsys, monkeypatch, "compare", str(one_token_run))
    assert code == 0, err
    for key, value in (("mean_tpot_s", 0.01), ("normalized_latency_s", math.nan), ("mean_e2el_s", math.nan)):
        run = shutil.copytree(one_token_run, tmp_path / key)
        path = _set(key, value)(run)
        with pytest.raises(KvbenchError, match=r"_s' must be a finite number, got NaN$") as error:
            kvbench.load_run(run)
        assert str(error.value).startswith(f"{path}: '")
        with pytest.raises(KvbenchError, match="must be a finite number"):
            kvbench.load_runs(run)  # summary.json alone is checked as well


def _required_keys(summary: dict) -> list[str]:
    stats = ["mean", "median", "std", *(f"p{q:g}" for q in summary["percentiles"])]
    distributions = [f"{stat}_{name}" for name in checks.DISTRIBUTIONS for stat in stats]
    return [
        *checks.SUMMARY_REQUIRED_TEXT, *checks.SUMMARY_REQUIRED_COUNTS, *checks.SUMMARY_REQUIRED_NUMBERS,
        *checks.SUMMARY_REQUIRED_OTHER, *distributions,
    ]  # fmt: skip


def test_every_key_and_column_kvbench_always_writes_is_required(tmp_path, run_dir):
    run = shutil.copytree(run_dir, tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    keys = _required_keys(summary)
    assert len(keys) == len(set(keys)) == 6 + 9 + 9 + 3 + 5 * 6 and set(keys) <= set(summary)
    for key in keys:
        (run / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != key}))
        with pytest.raises(KvbenchError) as error:
            kvbench.load_run(run)
        assert (
            str(error.value)
            == f"{run / 'summary.json'}: no {key!r}: every summary.json kvbench writes has it"
        )
    (run / "summary.json").write_text(json.dumps(summary))
    for name, columns in (("steps.csv", checks.STEP_COLUMNS), ("requests.csv", checks.REQUEST_COLUMNS)):
        original = (run / name).read_text()
        for column in columns:
            _without_column(name, column)(run)
            with pytest.raises(KvbenchError) as error:
                kvbench.load_run(run)
            assert str(error.value).startswith(f"{run / name}: no {column!r} column"), error.value
            (run / name).write_text(original)
    later = {"steps.csv": checks.STEP_COLUMNS_LATER, "requests.csv": checks.REQUEST_COLUMNS_LATER}
    for name, columns in later.items():  # a folder written before these existed still loads
        for column in columns:
            _without_column(name, column)(run)
    loaded = kvbench.load_run(run)
    assert len(loaded.requests) == 5 and not set(checks.STEP_COLUMNS_LATER) & set(loaded.steps)


def test_the_required_columns_are_the_row_types_fields():
    """Every field of kvbench's step and request rows is required, or listed as one that folders
    written before it existed lack; a field added with a default must be listed there."""
    for row_type, required, later in (
        (StepRecord, checks.STEP_COLUMNS, checks.STEP_COLUMNS_LATER),
        (RequestRecord, checks.REQUEST_COLUMNS, checks.REQUEST_COLUMNS_LATER),
    ):
        names = [f.name for f in fields(row_type)]
        assert sorted(names) == sorted(required + later) and not set(required) & set(later)
        assert {f.name for f in fields(row_type) if f.default is not MISSING} <= set(later)
        ints = {f.name for f in fields(row_type) if f.type == "int"}
        counts = (
            set(checks.REQUEST_COUNTS)
            if row_type is RequestRecord
            else set(names) - set(checks.STEP_NOT_COUNTS)
        )
        assert counts == ints


def test_committed_run_folders_load():
    """The committed results (simulated and real runs, sweeps' cells, packed tables, runs from
    before later keys and columns) load: one folder of each kind (engine, mode, summary keys,
    tables present) through `load_run`, every folder's summary through `load_runs`."""
    folders = runs_below(ROOT / "results")
    assert folders, "no committed run folder here"
    kinds = {}
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        tables = tuple(
            any((folder / f"{name}{ext}").is_file() for ext in ("", ".gz"))
            for name in ("steps.csv", "requests.csv")
        )
        kinds.setdefault((summary.get("engine"), summary.get("mode"), frozenset(summary), tables), folder)
    for folder in kinds.values():
        kvbench.load_run(folder)
    assert len(kvbench.load_runs(folders)) == len(folders)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # a header cell past csv's field limit: the header's line, not the next
        ("step," + "x" * 140_000 + "\n0,1\n", "line 1: not CSV (field larger than field limit"),
        ("step,num_steps\n0,1\n" + '1,"' + "x" * 140_000 + '"\n', "line 3: not CSV (field larger"),
        # pandas would name an empty header cell "Unnamed: 1", which no reader asks for
        ("step,\n0,1\n", "line 1: a column without a name"),
        # and read a second "step" as "step.1", whose cells no check reaches
        ("step,step\n0,x\n", "line 1: column 'step' appears twice"),
    ],
)
def test_a_damaged_header_is_one_line_naming_its_line(tmp_path, content, message):
    """A table's header is line 1: a header csv cannot read is named as line 1 (a data line as
    its own), and a header with a nameless or repeated column is refused, not read as pandas
    renames it (a KeyError traceback, or a word let through into a numbers column)."""
    from kvbench.errors import KvbenchError
    from kvbench.results.load import read_csv

    path = tmp_path / "steps.csv"
    path.write_text(content)
    with pytest.raises(KvbenchError) as error:
        read_csv(path, text=())
    assert str(error.value).startswith(f"{path}: {message}"), error.value
    assert "\n" not in str(error.value)
