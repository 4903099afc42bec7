"""Which files in a result folder kvbench wrote, so that replacing the folder replaces only those.

kvbench replaces a run, a report or a sweep's cells whole (a new copy swapped in by renames,
`files.write_run_atomically`), but a user may have put files of their own inside one: notes beside
a run, a figure in a report's plots/, a spreadsheet in a sweep's cells/. Those are not kvbench's to
delete. kvbench's own files are known by name:

- a run's tables (`RUN_FILES`, packed or not) in the folder replaced, where it holds a run's
  summary.json and config.json, and in the runs below it only where kvbench writes runs there (a
  sweep's cells/: `remove_owned`): a run a user copied into a report, a demo's engine folder or
  another run is theirs, whatever files it holds;
- whatever the replacing copy writes: a file at a path kvbench writes now is an older copy of its
  own;
- the files a folder's marker (`kvbench.json`) lists under "files" (a report's figures, so that a
  figure the new report no longer draws goes with the old report);
- kvbench's temporary copies (`.<name>.kvbench-<pid>-<token>`, `files.temp_path`).

Everything else in the old folder moves into its replacement at the same path: the user finds
their file where they left it, and nothing kvbench did not write is ever deleted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

TABLES = ("steps.csv", "requests.csv")  # packed as .csv.gz in committed results (kvbench/results/packed.py)
RUN_FILES = frozenset({"config.json", "env.json", "summary.json", *TABLES, *(f"{t}.gz" for t in TABLES)})
MARKER = "kvbench.json"  # {"kind": ..., "files": [...]}: kvbench/results/outputs.py
# `files.temp_path`'s names: `.<name>.kvbench-<pid>-<token>` (`files.remove_stale_temps` reads the pid)
TEMP = re.compile(r"\.(?P<name>.+)\.kvbench-(?P<pid>\d+)-[0-9a-z]+")


def is_temp(name: str) -> bool:
    """A temporary copy kvbench writes beside a file or folder before renaming it into place."""
    return TEMP.fullmatch(name) is not None


def listed(folder: Path) -> frozenset[str]:
    """The paths (relative, '/'-separated) that `folder`'s marker says kvbench wrote there."""
    try:
        files = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8")).get("files", [])
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, RecursionError):
        return frozenset()
    return frozenset(f for f in files if isinstance(f, str)) if isinstance(files, list) else frozenset()


def files_under(folder: Path) -> list[str]:
    """Every file and link under `folder`, relative and '/'-separated, sorted (what a marker lists)."""
    folder = Path(folder)
    found = []
    for root, dirs, files in os.walk(folder):
        base = Path(root).relative_to(folder)
        found += [(base / name).as_posix() for name in files]
        found += [(base / name).as_posix() for name in dirs if (Path(root) / name).is_symlink()]
    return sorted(found)


def foreign(old: Path, new: Path | None = None, *, nested_runs: bool = False) -> list[str]:
    """The entries of `old` kvbench did not write (see the module docstring), relative to it: files
    and links, and folders holding nothing at all. `new`: the copy about to replace `old`.
    `nested_runs`: the run folders below `old` are kvbench's (a sweep's cells/), not only `old`."""
    old = Path(old)
    ours = listed(old) | {MARKER}
    found = []
    for root, dirs, files in os.walk(old):
        base = Path(root).relative_to(old)
        links = [name for name in dirs if (Path(root) / name).is_symlink()]
        dirs[:] = [name for name in dirs if name not in links and not is_temp(name)]
        empty = [name for name in dirs if not any((Path(root) / name).iterdir())]
        where = nested_runs or base == Path(".")
        run = where and {"summary.json", "config.json"} <= set(files)  # a run folder kvbench writes
        for name in [*files, *links, *empty]:
            relative = (base / name).as_posix()
            if is_temp(name) or relative in ours or (run and name in RUN_FILES):
                continue
            if new is None or not os.path.lexists(Path(new) / relative):
                found.append(relative)
    return sorted(found)


def carry_foreign(old: Path, new: Path) -> list[str]:
    """Move what kvbench did not write in `old` into `new`, at the same relative paths, before
    `new` replaces `old`; returns those paths."""
    moved = foreign(old, new)
    for relative in moved:
        target = Path(new) / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(Path(old) / relative, target)
    return moved


def remove_owned(path: Path) -> None:
    """Remove `path` as far as kvbench wrote it: a file, or a folder's own files and the folders they
    leave empty; whatever else it holds stays where it is. A sweep removes its cells/ so: the run
    folders below `path` are kvbench's."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        path.unlink(missing_ok=True)
        return
    kept = set(foreign(path, nested_runs=True))
    for root, dirs, files in os.walk(path, topdown=False):
        base = Path(root).relative_to(path)
        for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]:
            if (base / name).as_posix() not in kept:
                (Path(root) / name).unlink()
        for name in dirs:
            folder = Path(root) / name
            if is_temp(name) and folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder)
            elif _emptied(folder, (base / name).as_posix(), kept):
                folder.rmdir()
    if not any(path.iterdir()):
        path.rmdir()


def _emptied(folder: Path, relative: str, kept: set[str]) -> bool:
    """A folder left empty by removing kvbench's files (not a user's empty folder, not a link)."""
    return folder.is_dir() and not folder.is_symlink() and relative not in kept and not any(folder.iterdir())
