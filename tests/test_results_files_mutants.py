"""Which paths kvbench removes, keeps or carries when it replaces a result folder, pinned at the
edges the results-files mutation scope found untested (results/mutation/results-files/).

Each test builds a folder in tmp_path and calls the functions of kvbench/results/ (ownership.py,
outputs.py, files.py, packed.py) on it, checking what is left on disk or the whole one-line refusal.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from kvbench.results.files import remove_stale_temps, temp_path, write_json, write_run_atomically
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
    no signal (it is only asked whether it exists)."""
    child = subprocess.Popen(["sleep", "30"])
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
