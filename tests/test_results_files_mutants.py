"""Which paths kvbench removes, keeps or carries when it replaces a result folder, pinned at the
edges the results-files mutation scope found untested (results/mutation/results-files/).

Each test builds a folder in tmp_path and calls kvbench/results/ownership.py's functions on it,
checking what is left on disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvbench.results.ownership import carry_foreign, files_under, foreign, listed, remove_owned


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
