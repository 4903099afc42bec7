"""Where kvbench writes: every writer refuses what it did not write, checks --out before the
work, writes atomically with the umask's permissions, cleans its own stale temporaries, and
identical inputs give byte-identical results (kvbench/results/outputs.py, kvbench/results/files.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench.cli.app import app
from kvbench.errors import KvbenchError
from kvbench.results.files import atomic_open, remove_stale_temps, write_text
from kvbench.results.outputs import MARKER, NAME_MAX, TEMP_EXTRA, prepare_out

ROOT = Path(__file__).resolve().parent.parent
SIMULATE = ("simulate", "--engine", "paged", "--num-requests", "20", "--rate", "5", "--kv-cache-gib", "2")
REAL = (
    "run", "--engine", "paged", "--model", "tiny-opt", "--device", "cpu", "--kv-cache-gib", "0.002",
    "--trace", "uniform:prompt=4..30,output=2..12", "--num-requests", "8", "--rate", "20",
)  # fmt: skip


def kvbench(*args: str):
    """The command in this process (typer's runner): exit code, stdout and stderr apart."""
    return CliRunner().invoke(app, list(args))


def kvbench_process(*args: str) -> subprocess.CompletedProcess:
    """The command as a user runs it: its own process (memory addresses of its own, too)."""
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def snapshot(path: Path) -> dict:
    """Every entry under `path` (itself included): its bytes (files) and its mtime."""
    entries = [path, *sorted(path.rglob("*"))] if path.is_dir() else [path]
    return {
        str(p): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns, p.stat().st_mode)
        for p in entries
    }


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """One simulated run (the input of report and calibrate)."""
    out = tmp_path_factory.mktemp("inputs") / "run"
    result = kvbench(*SIMULATE, "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def writers(run: Path) -> dict[str, tuple[str, ...]]:
    """Each writing command, all but --out (its value comes last)."""
    return {
        "simulate": SIMULATE,
        "run": REAL,
        "demo": ("demo", "--mode", "simulate", "--num-requests", "20"),
        "report": ("report", str(run)),
        "calibrate": ("calibrate", str(run)),
        "reproduce": ("reproduce", "fig13", "--quick", "--mode", "simulate", "--num-requests", "20"),
        "sweep": ("sweep", "--engines", "paged", "--num-requests", "20", "--kv-cache-gib", "2"),
        "trace plot": ("trace", "plot", "sharegpt-paper"),
        "trace make": ("trace", "make", "fixed:prompt=8,output=4", "--num-requests", "5", "--rate", "1"),
        "kernels": ("kernels", "--cells", "1x16", "--kv-heads", "1", "--gqa", "1", "--head-dim", "16"),
    }


WRITERS = (
    "simulate", "run", "demo", "report", "calibrate", "reproduce", "sweep", "trace plot", "trace make",
    "kernels",
)  # fmt: skip


@pytest.mark.parametrize("writer", WRITERS)
def test_a_users_folder_and_file_are_refused_untouched(writer, run_folder, tmp_path):
    mine = tmp_path / "mydata.png"  # a folder (named so for trace plot, which adds .png and .svg)
    mine.mkdir()
    (mine / "notes.txt").write_text("x\n")
    paper = tmp_path / "paper.png"  # a file (for trace plot: the PNG it would write)
    paper.write_text("my figure\n")
    before = snapshot(tmp_path)
    args = writers(run_folder)[writer]
    for out in (mine, paper):
        for extra in ((), ("--overwrite",)) if writer in ("simulate", "sweep") else ((),):
            one_line_error(kvbench(*args, *extra, "--out", str(out)), f"--out {out}", "did not write")
    assert snapshot(tmp_path) == before  # contents, mtimes, modes; and nothing new beside them


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("bad", ["/proc/kvbench-x", "{file}/sub", ""])
def test_an_unusable_out_is_one_line_before_any_work(writer, bad, run_folder, tmp_path):
    (tmp_path / "file.txt").write_text("x\n")
    out = bad.format(file=tmp_path / "file.txt")
    before = snapshot(tmp_path)
    one_line_error(kvbench(*writers(run_folder)[writer], "--out", out), "--out")
    assert snapshot(tmp_path) == before


def test_out_is_checked_before_the_run_starts(tmp_path):
    # this machine has no GPU: a run on cuda would fail there, yet --out is what is reported
    one_line_error(kvbench(*REAL, "--device", "cuda", "--out", "/proc/kvbench-x"), "--out /proc/kvbench-x")


def test_a_run_is_kept_unless_overwrite_says_otherwise(tmp_path):
    out = tmp_path / "run"
    assert kvbench(*SIMULATE, "--out", str(out)).exit_code == 0
    before = snapshot(out)
    one_line_error(kvbench(*SIMULATE, "--seed", "3", "--out", str(out)), "--overwrite")
    assert snapshot(out) == before
    result = kvbench(*SIMULATE, "--seed", "3", "--out", str(out), "--overwrite")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["workload"]["seed"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporary or old copy left


def test_a_run_does_not_replace_another_kind_of_result(run_folder, tmp_path):
    sweep = tmp_path / "sweep"
    args = writers(run_folder)["sweep"]
    assert kvbench(*args, "--out", str(sweep)).exit_code == 0
    before = snapshot(sweep)
    one_line_error(kvbench(*SIMULATE, "--overwrite", "--out", str(sweep)), "holds a sweep folder, not a run")
    one_line_error(kvbench(*args, "--overwrite", "--out", str(run_folder)), "holds a run folder, not a sweep")
    assert snapshot(sweep) == before


def test_demo_and_report_regenerate_their_own_output(run_folder, tmp_path):
    demo = tmp_path / "demo"
    args = writers(run_folder)["demo"]
    for _ in range(2):  # `make demo` twice
        result = kvbench(*args, "--out", str(demo))
        assert result.exit_code == 0, result.output
    assert json.loads((demo / MARKER).read_text()) == {"kind": "demo"}
    assert (demo / "report" / "report.html").is_file() and (demo / "paged" / "summary.json").is_file()
    report = tmp_path / "report"
    for _ in range(2):
        result = kvbench("report", str(run_folder), "--out", str(report))
        assert result.exit_code == 0, result.output
    assert {p.name for p in report.iterdir()} == {"report.html", "report.md", "plots", MARKER}
    assert not [p for p in tmp_path.rglob(".*")]  # no temporaries left anywhere


def test_calibrate_takes_its_own_file_as_out_and_refuses_a_users(run_folder, tmp_path):
    from kvbench.calibrate.fit import Calibration
    from kvbench.cost_model import CostModel
    from kvbench.results.files import write_json

    ours, users = tmp_path / "cost.json", tmp_path / "mine.json"
    fitted = Calibration(CostModel(0.02, 1e-4, 1e-6), "opt-13b", ("runs/a",), 61, 0.01, 0.02)
    write_json(ours, fitted.to_dict())  # as kvbench calibrate writes it
    users.write_text(json.dumps({"model": "opt-13b", "fixed_s": 0.02}) + "\n")
    before = {**snapshot(ours), **snapshot(users)}
    # --out passes for kvbench's own file: what stops the command is the (simulated) run it fits
    line = one_line_error(kvbench("calibrate", str(run_folder), "--out", str(ours)), str(run_folder))
    assert "--out" not in line
    refused = kvbench("calibrate", str(run_folder), "--out", str(users))
    one_line_error(refused, f"--out {users}", "did not write")
    assert {**snapshot(ours), **snapshot(users)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost.json", "mine.json"]


def test_a_trace_plot_replaces_its_own_files_only(tmp_path):
    out = tmp_path / "trace.png"
    for _ in range(2):
        result = kvbench("trace", "plot", "sharegpt-paper", "--out", str(out))
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.png", "trace.svg"]
    (tmp_path / "trace.svg").write_text("<svg>mine</svg>\n")  # the user's now
    one_line_error(kvbench("trace", "plot", "sharegpt-paper", "--out", str(out)), "trace.svg")
    assert (tmp_path / "trace.svg").read_text() == "<svg>mine</svg>\n"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporaries_of_dead_writers_are_removed_and_nothing_else(tmp_path):
    out = tmp_path / "run"
    dead, alive = _dead_pid(), os.getppid()  # the test runner's parent: alive, not this process
    stale_dir = tmp_path / f".run.kvbench-{dead}-1a2b3c4d"
    stale_dir.mkdir()
    (stale_dir / "summary.json").write_text("{}")
    stale_old = tmp_path / f".run.kvbench-{dead}-old"
    stale_old.mkdir()
    kept = [
        tmp_path / f".run.kvbench-{alive}-5e6f7a8b",  # a writer still at work
        tmp_path / ".run.abcdefgh",  # not kvbench's naming (no pid to judge it by)
        tmp_path / f".other.kvbench-{dead}-1a2b3c4d",  # another path's
        tmp_path / f".run.kvbench-{dead}-1a2b3c4d.keep",  # not exactly kvbench's naming
    ]
    for path in kept:
        path.mkdir()
    result = kvbench(*SIMULATE, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert not stale_dir.exists() and not stale_old.exists()
    assert all(path.is_dir() for path in kept)
    # a file's temporaries likewise, on the next write of that file
    table = tmp_path / "table.md"
    stale_file = tmp_path / f".table.md.kvbench-{dead}-99aa"
    stale_file.write_text("half")
    write_text(table, "whole\n")
    assert table.read_text() == "whole\n" and not stale_file.exists()


def test_an_interrupted_write_leaves_the_previous_file(tmp_path):
    path = tmp_path / "cost.json"
    write_text(path, "old\n")
    with pytest.raises(RuntimeError), atomic_open(path) as f:
        f.write("half of the new")
        raise RuntimeError("killed")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["cost.json"]
    remove_stale_temps(path)  # nothing of another process to remove: a no-op
    assert [p.name for p in tmp_path.iterdir()] == ["cost.json"]


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def test_results_get_the_umasks_permissions(umask_027, run_folder, tmp_path):
    run, sweep, report = tmp_path / "run", tmp_path / "sweep", tmp_path / "report"
    assert kvbench(*SIMULATE, "--out", str(run)).exit_code == 0
    assert kvbench(*writers(run_folder)["sweep"], "--out", str(sweep)).exit_code == 0
    assert kvbench("report", str(run), "--out", str(report)).exit_code == 0
    for folder in (run, sweep, report):
        for path in [folder, *folder.rglob("*")]:
            mode = path.stat().st_mode & 0o777
            assert mode == (0o750 if path.is_dir() else 0o640), (path, oct(mode))


@pytest.mark.parametrize(
    "extra",
    [(), ("--n", "2"), ("--beam-width", "2"), ("--preemption", "swap", "--kv-cache-gib", "1")],
    ids=["plain", "parallel-samples", "beams", "swap"],
)
def test_identical_runs_write_byte_identical_results(extra, tmp_path):
    for name in ("a", "b"):  # two processes: nothing may depend on where objects sit in memory
        proc = kvbench_process(*SIMULATE, *extra, "--out", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr
    for name in ("summary.json", "config.json", "steps.csv", "requests.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    if extra and extra[0] == "--preemption":
        assert summary["num_preemptions"] > 0  # the swap path ran


def test_prepare_out_refuses_a_link_and_names_the_flag(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(KvbenchError, match="--cost-model-out .*link.* is a link"):
        prepare_out(tmp_path / "link", "run", flag="--cost-model-out")
    assert prepare_out(tmp_path / "new" / "deeper", "run") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # a run's folder is made when it is written, whole


def test_the_itl_pool_does_not_depend_on_memory_addresses():
    """Where numpy puts each segment's array must not change the sums behind mean_itl_s."""
    from kvbench.config import RunConfig
    from kvbench.metrics.latency import ItlTable, distribution
    from kvbench.simulate import simulate
    from workloads.spec import WorkloadSpec

    config = RunConfig("paged", workload=WorkloadSpec(num_requests=30, rate=5.0, n=2), kv_cache_gib=2.0)
    seqs = simulate(config).run.sequences
    before = ItlTable.of(seqs)
    # the same segments (still shared where they were) in fresh arrays, allocated in reverse order
    distinct = list({id(ends): ends for seq in seqs for ends in seq.step_ends}.values())
    copies = {id(ends): ends.copy() for ends in reversed(distinct)}
    for seq in seqs:
        seq.step_ends = [copies[id(ends)] for ends in seq.step_ends]
    after = ItlTable.of(seqs)
    for field in ("values", "counts", "maxima"):
        assert getattr(before, field).tobytes() == getattr(after, field).tobytes(), field
    stats = [distribution("itl_s", t.values, (50.0,), t.counts) for t in (before, after)]
    assert stats[0] == stats[1]


def test_trace_make_and_convert_replace_their_own_trace_files_only(tmp_path):
    made = tmp_path / "t.jsonl"
    args = ("trace", "make", "fixed:prompt=8,output=4", "--num-requests", "5", "--rate", "1", "--out")
    args = (*args, str(made))
    for _ in range(2):  # its own file is rewritten
        assert kvbench(*args).exit_code == 0
    for suffix in (".csv", ".parquet"):
        converted = tmp_path / f"t{suffix}"
        for _ in range(2):
            result = kvbench("trace", "convert", str(made), str(converted))
            assert result.exit_code == 0, result.output
    mine = tmp_path / "mine.csv"
    mine.write_text("request_id,arrival_s,prompt_len,output_len\n0,0,4,4\n")  # a user's, without the header
    before = snapshot(tmp_path)
    one_line_error(kvbench("trace", "convert", str(made), str(mine)), f"OUT {mine}", "did not write")
    assert snapshot(tmp_path) == before


def test_a_reused_run_is_copied_with_todays_times_and_the_same_bytes(tmp_path):
    """Figure 13's ShareGPT runs are Figure 2's, copied (`run_summary`'s `reuse`). A GPU call
    brings back the files written after it started (tools/device_call.sh: newer than its
    gpu.txt), so a copy that kept its source's times, from a run of an earlier call, never came
    back: the copy takes the time it was written, and the source's bytes."""
    from kvbench.config import RunConfig
    from kvbench.demo import run_summary
    from workloads.spec import WorkloadSpec

    config = RunConfig("paged", workload=WorkloadSpec(num_requests=12, rate=5.0), kv_cache_gib=2.0)
    source = tmp_path / "fig2" / "paged"
    summary = run_summary(config, source, real=False)
    long_ago = time.time() - 86_400
    for path in source.iterdir():
        os.utime(path, (long_ago, long_ago))
    started = time.time() - 1  # a coarse file system's clock may round down
    copy = tmp_path / "fig13" / "paged"
    assert run_summary(config, copy, real=False, reuse=[copy, source]) == summary
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in source.iterdir())
    for path in copy.iterdir():
        assert path.read_bytes() == (source / path.name).read_bytes()
        assert path.stat().st_mtime >= started, path.name


def test_a_folder_holding_json_nested_too_deeply_is_refused_in_one_line(tmp_path):
    """A file at --out that parses only past Python's recursion limit (100,000 '[') is not a
    file kvbench wrote: refused as any user's file is, not a RecursionError traceback."""
    out = tmp_path / "deep"
    out.mkdir()
    (out / "summary.json").write_text("[" * 100_000)
    (out / MARKER).write_text("[" * 100_000)  # the marker's name, as deep
    before = snapshot(tmp_path)
    one_line_error(kvbench(*SIMULATE, "--out", str(out)), f"--out {out}", "did not write")
    assert snapshot(tmp_path) == before


def test_a_name_too_long_for_the_filesystem_is_one_line_for_a_command_of_several_outputs(tmp_path):
    """`kvbench demo` checks its outputs together (`prepare_outs`): a name longer than the
    filesystem allows is refused in one line naming --out, as a one-output command refuses it."""
    out = tmp_path / ("x" * 300)
    one_line_error(kvbench("demo", "--out", str(out)), f"--out {out}", "cannot write there")
    assert list(tmp_path.iterdir()) == []


def test_text_is_written_as_utf8_whatever_the_locale(tmp_path):
    """Every reader reads kvbench's files as UTF-8: written in a C locale without Python's UTF-8
    mode, a non-ASCII name (a model path, an error message) must still be UTF-8, not a crash, and
    read back as written (a resumed sweep's sweep.csv, a panel's)."""
    code = (
        "import sys; from pathlib import Path; from kvbench.results.files import write_text, write_json;"
        "write_text(Path(sys.argv[1]) / 't.txt', 'caf\\u00e9 \\u2192\\n');"
        "write_json(Path(sys.argv[1]) / 'j.json', {'model': '/m/\\u00e9'});"
        # a sweep.csv holding a non-ASCII path, read back as a resumed sweep and a panel read it
        "from kvbench.sweep.files import read_table; from kvbench.reproduce.panel import seed_cells;"
        "p = Path(sys.argv[1]) / 'sweep.csv';"
        "write_text(p, 'cell_id,role,engine,seed,rate,normalized_latency_s,error\\n"
        "c,grid,paged,0,1.0,0.5,/m/\\u00e9 failed\\n');"
        "assert read_table(p)['c']['error'] == '/m/\\u00e9 failed';"
        "assert seed_cells(p, ['paged'], 0)[0]['error'] == '/m/\\u00e9 failed'"
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert (tmp_path / "t.txt").read_bytes() == "café →\n".encode()
    assert json.loads((tmp_path / "j.json").read_bytes().decode("utf-8")) == {"model": "/m/é"}


def test_a_marker_nested_too_deeply_lists_nothing(tmp_path):
    """`listed` reads a folder's marker to know what kvbench wrote there; a marker nested past
    the recursion limit is no marker kvbench wrote: it lists nothing, no RecursionError."""
    from kvbench.results.ownership import listed

    (tmp_path / MARKER).write_text("[" * 100_000)
    assert listed(tmp_path) == frozenset()
    (tmp_path / MARKER).write_text('{"kind": "demo", "files": ["a.csv", 3]}')
    assert listed(tmp_path) == frozenset({"a.csv"})


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("notes.csv", "My notes on the kvbench-trace format\nimportant stuff\n"),
        ("log.jsonl", '{"run": "x", "comment": "converted with kvbench-trace tools"}\n'),
        ("head.csv", '# {"format": "not-kvbench-trace", "version": 1}\nrequest_id\n'),
        (
            "plot.svg",
            '<?xml version="1.0"?>\n<svg><title>Notes on the kvbench trace plot: draft</title></svg>\n',
        ),
        ("plot.png", "\x89PNG\r\n\x1a\n tEXtTitle\x00kvbench trace plot: mine, drawn by hand\n"),
    ],
)
def test_a_users_file_that_mentions_kvbenchs_formats_is_not_taken_for_one(name, text, tmp_path):
    """A trace file is kvbench's by its header object naming the format, a plot by the title
    matplotlib wrote for kvbench: a file that only mentions the words is the user's, refused."""
    mine = tmp_path / name
    mine.write_bytes(text.encode("utf-8"))
    before = snapshot(mine)
    if name.endswith((".png", ".svg")):
        result = kvbench("trace", "plot", "sharegpt-paper", "--out", str(mine.with_suffix(".png")))
    else:
        result = kvbench(
            "trace",
            "make",
            "fixed:prompt=8,output=4",
            "--num-requests",
            "3",
            "--rate",
            "1",
            "--out",
            str(mine),
        )
    one_line_error(result, name, "did not write")
    assert snapshot(mine) == before and list(tmp_path.iterdir()) == [mine]


@pytest.mark.parametrize(
    "command", [SIMULATE, ("trace", "make", "fixed:prompt=8,output=4", "--num-requests", "3", "--rate", "1")]
)
def test_a_name_too_long_for_the_temporary_copy_is_refused_before_any_work(command, tmp_path):
    """A name the file system takes but not with the temporary copy's additions (kvbench writes
    beside the output, then renames) is refused up front, not after the work."""
    for length in (NAME_MAX - TEMP_EXTRA + 1, NAME_MAX):
        out = tmp_path / ("u" * (length - 4) + ".csv")
        one_line_error(kvbench(*command, "--out", str(out)), f"at most {NAME_MAX - TEMP_EXTRA} bytes")
        assert list(tmp_path.iterdir()) == []
    fits = tmp_path / ("u" * (NAME_MAX - TEMP_EXTRA - 4) + ".csv")
    assert kvbench(*command, "--out", str(fits)).exit_code == 0
    assert [p.name for p in tmp_path.iterdir()] == [fits.name]


def test_a_trace_plot_titled_beyond_latin1_is_still_kvbenchs(tmp_path):
    """A title outside Latin-1 goes into the PNG's iTXt chunk, not tEXt: kvbench's plot of a trace
    named so is still recognised, and replaced by the next plot."""
    trace = tmp_path / "cyrillic.jsonl"  # a name beyond Latin-1 whose glyphs the plot's font has
    header = {"format": "kvbench-trace", "version": 1, "name": "\u0442\u0440\u0430\u0441\u0441\u0430"}
    trace.write_text(
        json.dumps(header) + '\n{"request_id": 0, "arrival_s": 0, "prompt_len": 4, "output_len": 4}\n'
    )
    out = tmp_path / "cyrillic.png"
    for _ in range(2):
        result = kvbench("trace", "plot", str(trace), "--out", str(out))
        assert result.exit_code == 0, result.output
    assert b"iTXtTitle" in out.read_bytes()[:4096]
