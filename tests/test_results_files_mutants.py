"""What kvbench's results writers record, and which paths they take, keep, replace or remove,
pinned at the edges the results-files mutation scope found untested
(results/mutation/results-files/).

Each test builds a folder in tmp_path and calls the functions of kvbench/results/ (ownership.py,
outputs.py, files.py, packed.py) on it, checking what is left on disk, the bytes written or the
whole one-line refusal. The recognisers of earlier outputs get files that just meet and just miss
what they look for. The provenance tests build git checkouts in tmp_path, and put a stand-in `git`
(a script on PATH) or a stand-in torch module (in sys.modules) where a real one cannot show the
case (a git that hangs, a GPU).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

import kvbench
from kvbench.errors import KvbenchError
from kvbench.results.files import (
    checkout_sha,
    environment,
    read_json,
    remove_stale_temps,
    save_figure,
    temp_path,
    write_csv,
    write_json,
    write_run_atomically,
)
from kvbench.results.outputs import prepare_out, prepare_outs, prepare_plot
from kvbench.results.ownership import carry_foreign, files_under, foreign, listed, remove_owned
from kvbench.results.packed import pack_table, table_bytes


def write(folder: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)


def test_a_marker_whose_files_entry_is_no_list_claims_nothing(tmp_path: Path) -> None:
    """A marker whose "files" is a string or an object is read as claiming no file: kvbench does not
    take each letter or key for a file it wrote, so a user's file named like one stays put."""
    for files in ("ab", {"a": 1}):
        folder = tmp_path / f"out-{type(files).__name__}"
        write(folder, {"a": "mine\n", "kvbench.json": json.dumps({"kind": "report", "files": files})})
        assert listed(folder) == frozenset()
        remove_owned(folder)
        assert (folder / "a").read_text() == "mine\n"


def test_a_link_to_a_folder_is_listed_as_one_entry(tmp_path: Path) -> None:
    """A marker lists a link to a folder by its path, as it lists a file."""
    write(tmp_path / "out", {"plots/a.png": "png"})
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "out" / "plots" / "linked")
    assert files_under(tmp_path / "out") == ["plots/a.png", "plots/linked"]


def test_a_temporary_copy_inside_a_folder_is_not_the_users(tmp_path: Path) -> None:
    """The files inside a temporary copy kvbench left in a folder are not a user's: replacing the
    folder does not carry them over as foreign."""
    write(tmp_path / "old", {".run.kvbench-123-abc/summary.json": "{}", "notes.txt": "mine\n"})
    assert foreign(tmp_path / "old") == ["notes.txt"]


def test_a_link_to_an_empty_folder_is_named_once(tmp_path: Path) -> None:
    """A user's link to an empty folder is one foreign entry, carried once."""
    (tmp_path / "old").mkdir()
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / "empty", tmp_path / "old" / "link")
    assert foreign(tmp_path / "old") == ["link"]


def test_a_run_folder_of_only_its_summary_and_config_is_kvbenchs(tmp_path: Path) -> None:
    """A run folder holding just summary.json and config.json is a run: both are kvbench's, and
    removing it removes the folder."""
    write(tmp_path / "run", {"summary.json": "{}", "config.json": "{}"})
    assert foreign(tmp_path / "run") == []
    remove_owned(tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_users_file_two_folders_deep_is_carried_into_the_new_copy(tmp_path: Path) -> None:
    """A user's file at a/b/notes.txt moves into the replacing copy at the same path, though the
    new copy has no a/ folder yet."""
    write(tmp_path / "old", {"a/b/notes.txt": "mine\n", "summary.json": "{}", "config.json": "{}"})
    (tmp_path / "new").mkdir()
    assert carry_foreign(tmp_path / "old", tmp_path / "new") == ["a/b/notes.txt"]
    assert (tmp_path / "new" / "a" / "b" / "notes.txt").read_text() == "mine\n"


def test_removing_a_sweep_removes_the_folders_its_cells_leave_empty(tmp_path: Path) -> None:
    """Removing a sweep kvbench wrote removes every cell folder and the sweep folder itself, nested
    folders included, when nothing of a user's is inside."""
    run = {"summary.json": "{}", "config.json": "{}", "steps.csv": "a\n", "requests.csv": "b\n"}
    cells = {f"cells/{c}/{name}": text for c in ("x", "y") for name, text in run.items()}
    write(tmp_path / "sweep", cells)
    remove_owned(tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()


def test_removing_a_sweep_keeps_a_users_file_and_its_folders(tmp_path: Path) -> None:
    """A user's file among a sweep's cells stays, with the folders above it; kvbench's files go."""
    run = {"summary.json": "{}", "config.json": "{}", "steps.csv": "a\n"}
    write(tmp_path / "sweep", {**{f"cells/x/{n}": t for n, t in run.items()}, "cells/x/mine.txt": "m\n"})
    remove_owned(tmp_path / "sweep")
    assert files_under(tmp_path / "sweep") == ["cells/x/mine.txt"]


def refusal(call, *args, **kwargs) -> str:
    with pytest.raises(KvbenchError) as caught:
        call(*args, **kwargs)
    return str(caught.value)


def test_the_current_or_a_parent_folder_is_refused_naming_a_folder_or_a_file(tmp_path: Path) -> None:
    """`--out ..` is refused in one line that asks for a new folder for a folder output and a new
    file for a file output, from each of prepare_out, prepare_outs and prepare_plot."""
    up = tmp_path / ".."
    assert (
        refusal(prepare_out, up, "run")
        == f"--out {up}: name a new folder, not the current or a parent folder"
    )
    assert (
        refusal(prepare_out, up, "trace")
        == f"--out {up}: name a new file, not the current or a parent folder"
    )
    assert refusal(prepare_outs, (up, "run", False)) == (
        f"--out {up}: name a new folder, not the current or a parent folder"
    )
    assert refusal(prepare_outs, (up, "trace", False)) == (
        f"--out {up}: name a new file, not the current or a parent folder"
    )
    assert (
        refusal(prepare_plot, up, "--plot")
        == f"--plot {up}: name a new file, not the current or a parent folder"
    )


def test_a_plot_is_named_png_or_svg_and_its_twin_is_checked_under_the_same_flag(tmp_path: Path) -> None:
    """A trace plot may be named .png or .svg (both are written); another suffix is refused naming
    the path; a user's file at the twin's name is refused under the flag the user gave."""
    assert prepare_plot(tmp_path / "fig.svg") == [tmp_path / "fig.png", tmp_path / "fig.svg"]
    assert refusal(prepare_plot, tmp_path / "fig.txt", "--plot") == (
        f"--plot {tmp_path / 'fig.txt'}: name a .png or .svg file (kvbench writes the figure as both)"
    )
    (tmp_path / "fig.svg").write_text("mine")
    assert refusal(prepare_plot, tmp_path / "fig.png", "--plot") == (
        f"--plot {tmp_path / 'fig.svg'} is a file that kvbench did not write; "
        "kvbench never replaces one, with or without --overwrite: choose a new file"
    )


def test_a_file_where_a_folder_goes_and_a_folder_where_a_file_goes_are_refused_in_whole(
    tmp_path: Path,
) -> None:
    """The refusal names what is there (file or folder), what kvbench writes there, and asks for a
    new one of the output's own sort."""
    (tmp_path / "f").write_text("mine")
    (tmp_path / "d").mkdir()
    assert refusal(prepare_out, tmp_path / "f", "run") == (
        f"--out {tmp_path / 'f'} is a file that kvbench did not write (it writes a run folder there); "
        "choose a new folder"
    )
    assert refusal(prepare_out, tmp_path / "d", "trace") == (
        f"--out {tmp_path / 'd'} is a folder that kvbench did not write (it writes a trace file there); "
        "choose a new file"
    )


def test_a_users_folder_is_refused_naming_its_first_three_entries(tmp_path: Path) -> None:
    """A non-empty folder kvbench did not write is refused naming its first three entries, sorted,
    comma-separated; a user's file is refused without an entry list."""
    write(tmp_path / "mine", {name: "x" for name in ("d.txt", "c.txt", "b.txt", "a.txt")})
    assert refusal(prepare_out, tmp_path / "mine", "report") == (
        f"--out {tmp_path / 'mine'} is a folder that kvbench did not write (it holds a.txt, b.txt, c.txt); "
        "kvbench never replaces one, with or without --overwrite: choose a new folder"
    )
    (tmp_path / "mine.yaml").write_text("x")
    assert refusal(prepare_out, tmp_path / "mine.yaml", "calibration") == (
        f"--out {tmp_path / 'mine.yaml'} is a file that kvbench did not write; "
        "kvbench never replaces one, with or without --overwrite: choose a new file"
    )


def test_a_new_demo_folder_is_made_with_its_parents_and_marked(tmp_path: Path) -> None:
    """A demo's folder, two levels below any existing one, is made at once and marked as a demo, so
    a rerun recognises it; a marked demo folder with files in it is taken again."""
    out = tmp_path / "a" / "b" / "demo"
    assert prepare_out(out, "demo") == out
    assert json.loads((out / "kvbench.json").read_text()) == {"kind": "demo"}
    (out / "demo.md").write_text("old")
    assert prepare_out(out, "demo") == out


def test_a_sweep_is_recognised_by_its_marker_or_its_old_sweep_json_and_nothing_else(tmp_path: Path) -> None:
    """A folder marked as a sweep, or one holding a sweep.json with axes and base_config (written
    before the marker), is resumed; a folder of a user's notes is not a sweep, and one marked as a
    report is not a sweep either."""
    write(tmp_path / "marked", {"kvbench.json": json.dumps({"kind": "sweep"}), "cells/x.txt": "x"})
    assert prepare_out(tmp_path / "marked", "sweep") == tmp_path / "marked"
    write(tmp_path / "old", {"sweep.json": json.dumps({"axes": {}, "base_config": {}})})
    assert prepare_out(tmp_path / "old", "sweep") == tmp_path / "old"
    write(tmp_path / "notes", {"notes.txt": "x"})
    assert refusal(prepare_out, tmp_path / "notes", "sweep") == (
        f"--out {tmp_path / 'notes'} is a folder that kvbench did not write (it holds notes.txt); "
        "kvbench never replaces one, with or without --overwrite: choose a new folder"
    )
    write(tmp_path / "report", {"kvbench.json": json.dumps({"kind": "report"})})
    assert refusal(prepare_out, tmp_path / "report", "sweep") == (
        f"--out {tmp_path / 'report'} holds a report folder, not a sweep folder: choose a new folder"
    )


def test_a_file_in_the_way_of_the_outputs_folder_is_named(tmp_path: Path) -> None:
    """Where a file stands where a folder above the output should be, the refusal names that file."""
    (tmp_path / "f.txt").write_text("mine")
    out = tmp_path / "f.txt" / "sub" / "run"
    assert refusal(prepare_out, out, "run") == f"--out {out}: {tmp_path / 'f.txt'} is a file, not a folder"


def test_an_existing_run_is_replaced_only_with_overwrite(tmp_path: Path) -> None:
    """A run folder already at --out is refused unless --overwrite is given."""
    write(
        tmp_path / "run",
        {"summary.json": json.dumps({"engine": "paged", "mode": "sim"}), "config.json": "{}"},
    )
    assert refusal(prepare_out, tmp_path / "run", "run") == (
        f"--out {tmp_path / 'run'} holds a run folder already: add --overwrite to replace it, or pick another"
    )
    assert prepare_out(tmp_path / "run", "run", overwrite=True) == tmp_path / "run"


def test_json_is_written_indented_by_two(tmp_path: Path) -> None:
    """kvbench's JSON files are indented by two spaces and end in a newline (diffs stay readable)."""
    write_json(tmp_path / "a.json", {"a": [1]})
    assert (tmp_path / "a.json").read_text() == '{\n  "a": [\n    1\n  ]\n}\n'


def test_a_temporary_name_carries_the_pid_and_its_token(tmp_path: Path) -> None:
    """A temporary copy is named `.<name>.kvbench-<pid>-<token>`: the token given, else 8 hex digits."""
    pid = os.getpid()
    assert temp_path(tmp_path / "run", "old") == tmp_path / f".run.kvbench-{pid}-old"
    assert re.fullmatch(rf"\.run\.kvbench-{pid}-[0-9a-f]{{8}}", temp_path(tmp_path / "run").name)


def test_a_live_processs_temporary_copy_is_kept_and_the_process_left_alone(tmp_path: Path) -> None:
    """Clearing stale temporary copies keeps one whose process still runs, and sends that process
    no signal (it is only asked whether it exists). The child takes SIGHUP's default action even
    where the tests run ignoring it (under nohup), so a hangup would end it."""
    child = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        temp = tmp_path / f".run.kvbench-{child.pid}-abcd"
        temp.mkdir()
        remove_stale_temps(tmp_path / "run")
        time.sleep(0.2)
        assert temp.is_dir()
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_a_run_is_written_two_folders_below_any_existing_one(tmp_path: Path) -> None:
    """write_run_atomically makes the folders above --out that do not exist yet."""
    out = tmp_path / "a" / "b" / "run"
    write_run_atomically(out, lambda tmp: (tmp / "summary.json").write_text("{}"))
    assert files_under(out) == ["summary.json"]


def test_a_run_is_replaced_when_the_working_folder_is_on_another_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replacing a run moves its old copy beside it, not into the working folder: a run under
    tmp_path is replaced while the working folder is on /dev/shm (another filesystem)."""
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than tmp_path")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as cwd:
        monkeypatch.chdir(cwd)
        out = tmp_path / "run"
        write_run_atomically(out, lambda tmp: (tmp / "summary.json").write_text("1"))
        write_run_atomically(out, lambda tmp: (tmp / "summary.json").write_text("2"))
        assert (out / "summary.json").read_text() == "2"
        assert os.listdir(cwd) == []
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_a_failed_write_leaves_no_temporary_copy(tmp_path: Path) -> None:
    """Where writing a run raises, its half-written temporary copy is removed: nothing is left."""

    def fail(tmp: Path) -> None:
        (tmp / "summary.json").write_text("{}")
        raise RuntimeError("cut")

    with pytest.raises(RuntimeError):
        write_run_atomically(tmp_path / "run", fail)
    assert os.listdir(tmp_path) == []


def test_an_empty_table_and_one_of_exactly_min_bytes_are_packed(tmp_path: Path) -> None:
    """pack_table packs any table by default, even an empty one, and one of exactly `min_bytes`;
    either reads back as it was."""
    (tmp_path / "steps.csv").write_bytes(b"")
    assert pack_table(tmp_path / "steps.csv") is True
    assert table_bytes(tmp_path / "steps.csv") == b""
    (tmp_path / "requests.csv").write_bytes(b"a,b\n")
    assert pack_table(tmp_path / "requests.csv", min_bytes=4) is True
    assert not (tmp_path / "requests.csv").exists()
    assert table_bytes(tmp_path / "requests.csv") == b"a,b\n"


# ---------------------------------------------------------------- provenance: env.json's commit


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root: Path, *args: str) -> str:
    """git in `root`, away from the caller's git variables and the user's and system's settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    clean |= {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    who = {
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@a",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@a",
    }
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, env={**clean, **who}
    )
    return done.stdout.strip()


def checkout(root: Path, commit: bool = True) -> Path:
    """A git work tree at `root` holding kvbench/ (a source checkout), with one commit."""
    (root / "kvbench").mkdir(parents=True)
    (root / "kvbench" / "__init__.py").write_text("")
    git(root.parent, "init", "-q", str(root))
    if commit:
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "x")
    return root


@needs_git
def test_a_checkouts_commit_is_its_full_head_sha(tmp_path: Path) -> None:
    """env.json's git_sha is the full sha of the commit checked out where kvbench's sources are."""
    root = checkout(tmp_path / "src")
    assert checkout_sha(root) == git(root, "rev-parse", "HEAD")
    assert re.fullmatch(r"[0-9a-f]{40}", checkout_sha(root))


@needs_git
def test_a_repository_without_kvbench_or_a_commit_gives_unknown(tmp_path: Path) -> None:
    """A repository that holds no kvbench/ folder is not a checkout of kvbench, and a checkout
    with no commit yet has none to name: both give "unknown", never a sha or other text."""
    other = tmp_path / "other"
    other.mkdir()
    git(tmp_path, "init", "-q", str(other))
    git(other, "commit", "-q", "--allow-empty", "-m", "x")
    assert checkout_sha(other) == "unknown"
    assert checkout_sha(checkout(tmp_path / "unborn", commit=False)) == "unknown"


@needs_git
def test_kvbench_inside_another_projects_repository_gives_unknown(tmp_path: Path) -> None:
    """A kvbench folder whose own .git is no repository, inside another project's repository (an
    installed kvbench in a project's site-packages), is not that project's commit: "unknown"."""
    outer = checkout(tmp_path / "project")
    (outer / "site" / "kvbench").mkdir(parents=True)
    (outer / "site" / ".git").mkdir()
    assert checkout_sha(outer / "site") == "unknown"


@needs_git
def test_gits_environment_variables_do_not_redirect_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With GIT_DIR naming another repository (as inside a git hook), the commit recorded is still
    the checkout's own."""
    root = checkout(tmp_path / "src")
    other = checkout(tmp_path / "other")
    git(other, "commit", "-q", "--allow-empty", "-m", "y")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    assert checkout_sha(root) == git(root, "rev-parse", "HEAD") != git(other, "rev-parse", "HEAD")


def stand_in_git(folder: Path, body: str) -> None:
    """An executable `git` in `folder` that runs `body` (Python) instead of git."""
    folder.mkdir(exist_ok=True)
    (folder / "git").write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    (folder / "git").chmod(0o755)


def test_without_git_the_commit_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no git is on PATH the commit is "unknown", whatever the checkout is called and from
    wherever the command runs."""
    root = tmp_path / "XXXX"
    (root / "kvbench").mkdir(parents=True)
    (root / ".git").mkdir()
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.chdir(tmp_path)
    assert checkout_sha(root) == "unknown"


def test_a_git_that_fails_is_not_believed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A git that exits with an error gives "unknown", whatever it printed."""
    root = tmp_path / "src"
    (root / "kvbench").mkdir(parents=True)
    (root / ".git").mkdir()
    stand_in_git(tmp_path / "bin", f"print({str(root)!r}); sys.exit(1)")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert checkout_sha(root) == "unknown"


def test_a_git_that_hangs_gives_unknown_instead_of_hanging_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A git that never answers (a hung network filesystem, a lock) costs a few seconds and gives
    "unknown": writing a result does not wait for it. The stand-in answers after 20 s, long after
    the limit of 5 s, so this does not depend on the machine's speed."""
    root = tmp_path / "src"
    (root / "kvbench").mkdir(parents=True)
    (root / ".git").mkdir()
    stand_in_git(tmp_path / "bin", f"time.sleep(20); print({str(root)!r})")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert checkout_sha(root) == "unknown"


# ---------------------------------------------------------------- provenance: env.json


PACKAGES = ("torch", "triton", "transformers", "numpy")


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def test_environment_records_version_commit_host_command_and_packages_by_name() -> None:
    """env.json names exactly these fields: kvbench's version, the commit of kvbench's own checkout
    (not of the folder above it), Python, the platform, the command line, a UTC timestamp, and the
    versions of torch, triton, transformers and numpy; no GPU field where torch sees none."""
    from kvbench.version import __version__

    env = environment()
    assert set(env) == {"kvbench", "git_sha", "python", "platform", "command", "created_utc", "packages"}
    root = Path(kvbench.__file__).resolve().parents[1]
    assert env["git_sha"] == checkout_sha(root)
    if (root / ".git").exists() and shutil.which("git"):
        assert env["git_sha"] == git(root, "rev-parse", "HEAD")
    assert env["kvbench"] == __version__
    assert env["python"] == platform.python_version()
    assert env["platform"] == platform.platform()
    assert env["command"] == sys.argv
    assert datetime.fromisoformat(env["created_utc"]).utcoffset() == timedelta(0)
    assert env["packages"] == {name: installed(name) for name in PACKAGES}


def stand_in_torch(current: int = 1) -> SimpleNamespace:
    """A torch module as `_gpu` reads it, seeing two GPUs, the current one `current` (as
    torch.cuda.get_device_properties, None means the current device)."""
    cards = [SimpleNamespace(name=f"GPU {i}", total_memory=(i + 1) * 80 * 2**30) for i in range(2)]
    cuda = SimpleNamespace(
        is_available=lambda: True,
        current_device=lambda: current,
        get_device_properties=lambda device=None: cards[current if device is None else device],
    )
    return SimpleNamespace(cuda=cuda, version=SimpleNamespace(cuda="12.4"))


def test_environment_records_the_gpu_torch_sees_and_the_driver_nvml_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where torch is loaded and sees a GPU, env.json names the current card, its memory, torch's
    CUDA version and NVML's driver version; without NVML the driver is recorded as null."""
    monkeypatch.setitem(sys.modules, "torch", stand_in_torch())
    nvml = SimpleNamespace(nvmlInit=lambda: None, nvmlSystemGetDriverVersion=lambda: "550.54.15")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpu = {"gpu": "GPU 1", "gpu_memory_bytes": 160 * 2**30, "cuda": "12.4"}
    env = environment()
    assert {k: env[k] for k in ("gpu", "gpu_memory_bytes", "cuda", "driver")} == {
        **gpu,
        "driver": "550.54.15",
    }
    assert len(env) == 7 + 4
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    env = environment()
    assert {k: env[k] for k in ("gpu", "gpu_memory_bytes", "cuda", "driver")} == {**gpu, "driver": None}


# ---------------------------------------------------------------- tables and JSON


@dataclass
class One:
    name: str


@dataclass
class Two:
    step: int
    engine: str


def test_a_one_column_table_writes_each_value_whole(tmp_path: Path) -> None:
    """A dataclass of one field writes one column: a text value stays one cell, not one per letter."""
    write_csv(tmp_path / "one.csv", [One("ab"), One("c")], One)
    assert (tmp_path / "one.csv").read_bytes() == b"name\r\nab\r\nc\r\n"


def test_a_table_writes_every_field_and_extra_columns_in_first_seen_order(tmp_path: Path) -> None:
    """Every field of the row type is written, then the collectors' extra columns in the order first
    seen; a row without one of them leaves that cell empty."""
    write_csv(tmp_path / "two.csv", [Two(0, "paged"), Two(1, "x")], Two)
    assert (tmp_path / "two.csv").read_bytes() == b"step,engine\r\n0,paged\r\n1,x\r\n"
    extra = [{"copy_ms": 1.5}, {"gpu_ms": 2, "copy_ms": 3}]
    write_csv(tmp_path / "steps.csv", [Two(0, "paged"), Two(1, "paged")], Two, extra=extra)
    assert (tmp_path / "steps.csv").read_bytes() == (
        b"step,engine,copy_ms,gpu_ms\r\n0,paged,1.5,\r\n1,paged,3,2\r\n"
    )


def test_extra_columns_for_another_number_of_rows_are_refused_and_nothing_written(tmp_path: Path) -> None:
    """Extra columns for fewer or more rows than the table has are a bug in their collector: the
    write raises and leaves no file, rather than a table cut to the shorter of the two."""
    for extra in ([{"a": 1}], [{"a": 1}, {"a": 2}, {"a": 3}]):
        with pytest.raises(ValueError):
            write_csv(tmp_path / "steps.csv", [Two(0, "p"), Two(1, "p")], Two, extra=extra)
        assert os.listdir(tmp_path) == []


def test_a_json_file_that_is_no_object_is_refused_naming_what_it_is(tmp_path: Path) -> None:
    """read_json refuses a JSON value that is not an object in one line naming its JSON type."""
    for text, what in (
        ("[1]", "list"),
        ('"a"', "string"),
        ("true", "boolean"),
        ("null", "null"),
        ("1", "number"),
        ("1.5", "number"),
    ):
        (tmp_path / "a.json").write_text(text)
        assert (
            refusal(read_json, tmp_path / "a.json")
            == f"{tmp_path / 'a.json'}: expected a JSON object, got a JSON {what}"
        )


def test_a_json_file_not_utf8_or_nested_too_deeply_is_refused_naming_it(tmp_path: Path) -> None:
    """A file that is not UTF-8 is refused naming the first bad byte; one nested deeper than the
    parser can go is refused as such, not with a RecursionError."""
    (tmp_path / "a.json").write_bytes(b'{"a": "\xff"}')
    assert refusal(read_json, tmp_path / "a.json") == (
        f"{tmp_path / 'a.json'}: not UTF-8 text (byte 7): not a file kvbench wrote"
    )
    (tmp_path / "a.json").write_text("[" * 200_000)
    assert refusal(read_json, tmp_path / "a.json") == (
        f"{tmp_path / 'a.json'}: not valid JSON (nested too deeply): not a file kvbench wrote"
    )


@pytest.mark.skipif(not Path("/proc/self/mem").is_file(), reason="needs Linux's /proc/self/mem")
def test_a_json_file_that_cannot_be_read_is_refused_with_the_systems_reason() -> None:
    """A file that exists but cannot be read (here /proc/self/mem: reading its first byte fails)
    is refused naming it and the system's reason."""
    assert refusal(read_json, Path("/proc/self/mem")) == "/proc/self/mem: cannot read it (Input/output error)"


def test_a_figure_is_written_in_the_format_its_suffix_names(tmp_path: Path) -> None:
    """save_figure writes an .svg name as SVG and a .png name as PNG."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(1, 1))
    figure.add_subplot().plot([0, 1])
    save_figure(figure, tmp_path / "a.svg")
    save_figure(figure, tmp_path / "a.png")
    assert b"<svg" in (tmp_path / "a.svg").read_bytes()[:1000]
    assert (tmp_path / "a.png").read_bytes().startswith(b"\x89PNG")


# ---------------------------------------------------------------- outputs: earlier results recognised


def test_results_written_before_the_marker_are_recognised_by_their_content(tmp_path: Path) -> None:
    """A demo (demo.json rows naming engines), a report (report.html titled as kvbench's beside
    report.md), a reproduction (reproduce.md opening with its heading, then more), a calibration
    file with exactly its four keys and a kernel benchmark (kernels.csv and bandwidth.json) are
    kvbench's: each is taken again."""
    write(tmp_path / "demo", {"demo.json": json.dumps({"rows": [{"engine": "paged"}, {"engine": "orca"}]})})
    assert prepare_out(tmp_path / "demo", "demo") == tmp_path / "demo"
    write(
        tmp_path / "report",
        {"report.html": "<html><head><title>kvbench report</title></head></html>", "report.md": "# r\n"},
    )
    assert prepare_out(tmp_path / "report", "report") == tmp_path / "report"
    write(tmp_path / "repro", {"reproduce.md": "# kvbench reproduce\n\n| figure | verdict |\n"})
    assert prepare_out(tmp_path / "repro", "reproduce") == tmp_path / "repro"
    keys = {"model": "m", "runs": [], "rows": 0, "median_relative_error": 0.1}
    (tmp_path / "cost.json").write_text(json.dumps(keys))
    assert prepare_out(tmp_path / "cost.json", "calibration") == tmp_path / "cost.json"
    write(tmp_path / "kernels", {"kernels.csv": "a\n", "bandwidth.json": "{}"})
    assert prepare_out(tmp_path / "kernels", "kernels") == tmp_path / "kernels"


def users(path: Path, entries: str = "") -> str:
    noun = "folder" if path.is_dir() else "file"
    held = f" (it holds {entries})" if entries else ""
    return (
        f"--out {path} is a {noun} that kvbench did not write{held}; "
        f"kvbench never replaces one, with or without --overwrite: choose a new {noun}"
    )


def test_a_users_folder_that_only_resembles_a_result_is_refused(tmp_path: Path) -> None:
    """Near misses are a user's, never replaced: a demo.json whose rows name no engine, a
    summary.json naming an engine but no mode and no config.json beside it (even with
    --overwrite), a kernels.csv without bandwidth.json, and a kvbench.json that is a JSON list."""
    write(tmp_path / "demo", {"demo.json": json.dumps({"rows": [{"model": "m"}]})})
    assert refusal(prepare_out, tmp_path / "demo", "demo") == users(tmp_path / "demo", "demo.json")
    write(tmp_path / "run", {"summary.json": json.dumps({"engine": "paged"})})
    assert refusal(prepare_out, tmp_path / "run", "run", overwrite=True) == users(
        tmp_path / "run", "summary.json"
    )
    write(tmp_path / "kernels", {"kernels.csv": "a\n"})
    assert refusal(prepare_out, tmp_path / "kernels", "kernels") == users(tmp_path / "kernels", "kernels.csv")
    write(tmp_path / "report", {"kvbench.json": "[1]"})
    assert refusal(prepare_out, tmp_path / "report", "report") == users(tmp_path / "report", "kvbench.json")


def test_a_file_that_mentions_the_trace_format_after_its_first_line_is_a_users(tmp_path: Path) -> None:
    """A trace file names its format in its first line (JSONL, CSV) or in a Parquet footer: a
    user's notes naming kvbench-trace on a later line, and a Parquet file whose footer does not
    name it, are a user's files, not replaced by `trace make`."""
    (tmp_path / "notes.jsonl").write_text("my notes\nabout kvbench-trace\nend\n")
    assert refusal(prepare_out, tmp_path / "notes.jsonl", "trace") == users(tmp_path / "notes.jsonl")
    (tmp_path / "mine.parquet").write_bytes(b"PAR1" + b"\0" * 100 + b'{"pandas": 1}PAR1')
    assert refusal(prepare_out, tmp_path / "mine.parquet", "trace") == users(tmp_path / "mine.parquet")


def test_a_trace_or_plot_is_recognised_only_within_the_bytes_read(tmp_path: Path) -> None:
    """The recognisers read a bounded part of a file: a trace's header line within its first MiB,
    a Parquet footer within the last MiB, a plot's title and maker within its first 4096 bytes,
    a report's title within its first 4096 characters. A header, footer or tag ending one byte
    past that is not seen."""
    mib = 1 << 20
    header = b'{"format": "kvbench-trace", "version": 1, "pad": "'
    fits = header + b"x" * (mib - len(header) - 3) + b'"}\n'  # the line's newline is byte mib
    (tmp_path / "edge.jsonl").write_bytes(fits)
    assert prepare_out(tmp_path / "edge.jsonl", "trace") == tmp_path / "edge.jsonl"
    (tmp_path / "late.jsonl").write_bytes(fits[:-3] + b'xx"}\n')  # its closing brace: byte mib + 1
    assert refusal(prepare_out, tmp_path / "late.jsonl", "trace") == users(tmp_path / "late.jsonl")
    tag = b"kvbench-trace"
    (tmp_path / "far.parquet").write_bytes(b"PAR1\n" + tag + b"\0" * (mib - 3) + b"PAR1")
    assert refusal(prepare_out, tmp_path / "far.parquet", "trace") == users(tmp_path / "far.parquet")
    (tmp_path / "near.parquet").write_bytes(b"PAR1\n" + tag + b"\0" * (mib - 4 - len(tag)) + b"PAR1")
    assert prepare_out(tmp_path / "near.parquet", "trace") == tmp_path / "near.parquet"
    png = b"\x89PNG\r\n\x1a\n"
    chunks = b"tEXtTitle\x00kvbench trace plot: t" + b"tEXtSoftware\x00Matplotlib"
    (tmp_path / "late.png").write_bytes(png + b"\0" * (4097 - len(png) - len(chunks)) + chunks)
    assert refusal(prepare_out, tmp_path / "late.png", "plot") == users(tmp_path / "late.png")
    (tmp_path / "edge.png").write_bytes(png + b"\0" * (4096 - len(png) - len(chunks)) + chunks)
    assert prepare_out(tmp_path / "edge.png", "plot") == tmp_path / "edge.png"
    title = "<title>kvbench report</title>"
    write(tmp_path / "late", {"report.html": " " * (4097 - len(title)) + title, "report.md": ""})
    assert refusal(prepare_out, tmp_path / "late", "report") == users(
        tmp_path / "late", "report.html, report.md"
    )
    write(tmp_path / "edge", {"report.html": " " * (4096 - len(title)) + title, "report.md": ""})
    assert prepare_out(tmp_path / "edge", "report") == tmp_path / "edge"


def test_a_socket_at_the_output_path_is_refused_as_a_users_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path that cannot be opened to be read (a Unix socket) is no trace plot and no trace file:
    refused, not replaced."""
    monkeypatch.chdir(tmp_path)  # a short name: a socket's path is limited to about 100 bytes
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("s.png")
        assert refusal(prepare_out, Path("s.png"), "plot") == users(Path("s.png"))
        assert refusal(prepare_out, Path("s.png"), "trace") == users(Path("s.png"))


def test_the_current_folder_and_the_root_are_refused_as_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--out ''` (the current folder, even an empty one) and `--out /` are refused: kvbench writes
    a new folder, never into the one the command runs in."""
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    assert refusal(prepare_out, "", "run") == "--out .: name a new folder, not the current or a parent folder"
    assert (
        refusal(prepare_out, "/", "run") == "--out /: name a new folder, not the current or a parent folder"
    )


def test_a_stale_probe_of_a_process_that_is_gone_is_removed(tmp_path: Path) -> None:
    """Checking --out removes the probe folder that a killed kvbench process left in the output's
    folder, and leaves nothing of its own."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / f".probe.kvbench-{gone.pid}-abcd1234").mkdir()
    assert prepare_out(tmp_path / "run", "run") == tmp_path / "run"
    assert os.listdir(tmp_path) == []


def empty_proc_folder() -> Path | None:
    for entry in sorted(Path("/proc").iterdir()) if Path("/proc").is_dir() else []:
        try:
            if not entry.name.isdigit() and entry.is_dir() and not any(entry.iterdir()):
                return entry
        except OSError:
            continue
    return None


def test_a_folder_that_takes_no_new_entries_is_refused_naming_flag_folder_and_reason() -> None:
    """A new output below /proc, and an empty folder of /proc as the output, are refused before
    any work in one line naming the flag, the folder that cannot take the output and the system's
    reason (its words, not the exception with its temporary path)."""
    if not Path("/proc").is_dir():
        pytest.skip("needs Linux's /proc")
    reason = r"\(([A-Za-z][A-Za-z ]*)\)"
    below = refusal(prepare_out, "/proc/kvbench-out", "run")
    assert re.fullmatch(rf"--out /proc/kvbench-out: cannot write in /proc {reason}", below), below
    folder = empty_proc_folder()
    if folder is None:
        pytest.skip("no empty folder in /proc here")
    whole = refusal(prepare_out, folder, "run")
    assert re.fullmatch(
        rf"--out {re.escape(str(folder))}: cannot write in {re.escape(str(folder))} {reason}", whole
    ), whole


def test_an_earlier_reproduction_or_report_is_recognised_whatever_the_locale(tmp_path: Path) -> None:
    """reproduce.md and report.html are read as UTF-8, as kvbench wrote them: under the C locale
    with Python's UTF-8 mode off (an ASCII locale encoding), an earlier reproduction or report
    holding non-ASCII text is still kvbench's, not refused as a user's folder."""
    texts = {
        "repro/reproduce.md": "# kvbench reproduce\n\n| 1.05 \u00d7 | ok \u2014 |\n",
        "report/report.html": "<title>kvbench report</title><p>1.05 \u00d7</p>",
        "report/report.md": "# r\n",
    }
    for name, text in texts.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(text.encode("utf-8"))
    assert prepare_out(tmp_path / "repro", "reproduce") == tmp_path / "repro"  # this process's locale
    assert prepare_out(tmp_path / "report", "report") == tmp_path / "report"
    source = Path(kvbench.__file__).resolve().parents[1]
    locale = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    check = (
        "import sys; from kvbench.results.outputs import prepare_out; "
        "prepare_out(sys.argv[1], 'reproduce'); prepare_out(sys.argv[2], 'report'); print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, str(tmp_path / "repro"), str(tmp_path / "report")],
        capture_output=True,
        text=True,
        env={**os.environ, **locale, "PYTHONPATH": str(source)},
    )
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


def test_a_name_too_long_for_the_filesystem_is_refused_with_the_systems_reason(tmp_path: Path) -> None:
    """An output named longer than any filesystem takes (1,000 bytes) is refused before any work
    in one line naming the flag and the system's reason, not with an OSError."""
    out = tmp_path / ("x" * 1000)
    for kind in ("run", "demo"):
        assert refusal(prepare_out, out, kind) == f"--out {out}: cannot write there (File name too long)"


def test_a_temporary_copy_of_another_users_live_process_is_kept(tmp_path: Path) -> None:
    """Clearing stale copies in a folder shared between users keeps one whose process is alive but
    another user's (the system refuses to signal it, which says it exists). As root the clearing
    runs in a forked child that has become the user nobody; the copy belongs to this (root's)
    process."""
    if os.geteuid() != 0:
        try:
            os.kill(1, 0)
            pytest.skip("pid 1 is this user's: no other user's process to name")
        except PermissionError:
            pass
        (tmp_path / ".run.kvbench-1-abcd").mkdir()
        remove_stale_temps(tmp_path / "run")
        assert (tmp_path / ".run.kvbench-1-abcd").is_dir()
        return
    shared = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path is private to root
    try:
        shared.chmod(0o777)
        temps = [shared / f".run.kvbench-{pid}-abcd" for pid in (os.getpid(), 1)]  # two of root's
        for temp in temps:
            temp.mkdir(mode=0o777)
        remove_stale_temps(shared / "run")  # root: its own copy is skipped, pid 1 answers
        assert all(temp.is_dir() for temp in temps)
        child = os.fork()
        if child == 0:  # the child: nobody, clearing stale copies of shared/run
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                remove_stale_temps(shared / "run")
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert all(temp.is_dir() for temp in temps)
    finally:
        shutil.rmtree(shared)


@pytest.mark.skipif(not Path("/proc/self/mem").is_file(), reason="needs Linux's /proc/self/mem")
def test_a_table_that_cannot_be_read_is_refused_with_the_systems_reason() -> None:
    """A table file that exists but cannot be read (/proc/self/mem) is refused naming it and the
    system's reason."""
    assert (
        refusal(table_bytes, Path("/proc/self/mem")) == "/proc/self/mem: cannot read it (Input/output error)"
    )


def test_a_folder_is_a_kind_by_its_marker_or_by_what_an_older_kvbench_left(tmp_path: Path) -> None:
    """A kind's test (`_marked`) takes a folder whose marker names that kind, or, where the kind
    has one, a folder its test for results written before the marker recognises; a folder marked
    as another kind and a user's folder are neither. Called here, not only through KINDS: KINDS
    is built once, when kvbench.results.outputs is imported."""
    from kvbench.results import outputs

    write(tmp_path / "marked", {"kvbench.json": json.dumps({"kind": "sweep"})})
    write(tmp_path / "other", {"kvbench.json": json.dumps({"kind": "report"})})
    write(tmp_path / "old", {"sweep.json": json.dumps({"axes": {}, "base_config": {}})})
    write(tmp_path / "notes", {"notes.txt": "x"})
    folders = [tmp_path / name for name in ("marked", "other", "old", "notes")]
    by_marker = outputs._marked("sweep")
    by_marker_or_old = outputs._marked("sweep", outputs._old_sweep)
    assert [by_marker(folder) for folder in folders] == [True, False, False, False]
    assert [by_marker_or_old(folder) for folder in folders] == [True, False, True, False]


def test_a_marker_or_a_results_json_in_utf8_is_read_whatever_the_locale(tmp_path: Path) -> None:
    """kvbench.json and a result's JSON files are read as UTF-8: a run whose marker and
    summary.json hold non-ASCII text as it stands (rewritten by jq or an editor) is read the same
    under the C locale with Python's UTF-8 mode off (an ASCII locale encoding): the marker still
    lists kvbench's files, summary.json still reads, and the folder is still a run."""
    run = tmp_path / "run"
    marker = {"kind": "run", "files": ["summary.json", "config.json"], "note": "1.05 \u00d7"}
    summary = {"engine": "sim", "mode": "simulate", "model": "/m/caf\u00e9"}
    write(run, {"config.json": "{}"})
    for name, data in {"kvbench.json": marker, "summary.json": summary}.items():
        (run / name).write_bytes(json.dumps(data, ensure_ascii=False).encode("utf-8"))
    check = (
        "import sys; from pathlib import Path; from kvbench.results import outputs, ownership\n"
        "run = Path(sys.argv[1])\n"
        "print(sorted(ownership.listed(run)), ascii(outputs._json(run / 'summary.json')), "
        "outputs.is_run(run))"
    )
    expected = f"['config.json', 'summary.json'] {summary!a} True\n"
    from kvbench.results import outputs

    here = f"{sorted(listed(run))} {outputs._json(run / 'summary.json')!a} {outputs.is_run(run)}\n"
    assert here == expected  # this process's locale
    source = Path(kvbench.__file__).resolve().parents[1]
    locale = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    done = subprocess.run(
        [sys.executable, "-c", check, str(run)],
        capture_output=True,
        text=True,
        env={**os.environ, **locale, "PYTHONPATH": str(source)},
    )
    assert (done.returncode, done.stdout) == (0, expected), done.stderr


def test_a_name_too_long_for_the_filesystem_is_refused_naming_the_reason_among_several_outputs(
    tmp_path: Path,
) -> None:
    """`prepare_outs` (kvbench demo's outputs, checked together) refuses an output named longer
    than any filesystem takes in one line naming the flag and the system's reason, as
    prepare_out does, before anything is made."""
    out = tmp_path / ("x" * 1000)
    assert (
        refusal(prepare_outs, (out, "demo", False)) == f"--out {out}: cannot write there (File name too long)"
    )
    assert list(tmp_path.iterdir()) == []
