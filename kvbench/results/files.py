"""Results on disk: the source of truth that plots, reports and notebooks read.

`<out>/config.json, env.json, steps.csv, requests.csv, summary.json` are written into a
temporary sibling folder and swapped in with renames, so a reader (or an interrupted
sweep) never sees a half-written run: the folder holds the previous complete result or
the new complete result. Every other file kvbench writes goes through a temporary file
beside it and a rename (`atomic_open`), for the same reason.

Temporary copies are named `.<name>.kvbench-<pid>-<token>`: a process killed mid-write
leaves one behind, and the next write to the same path removes those whose process is
gone (never anything else). Folders and files get the umask's permissions, as `mkdir`
and `open` would give them.

Where a command writes is checked before it works (`kvbench.results.outputs.prepare_out`).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from datetime import UTC, datetime
from importlib import metadata
from operator import attrgetter
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.results.ownership import TEMP, carry_foreign


def environment() -> dict:
    """What produced a result: versions, host, kvbench's own commit, command line."""
    from kvbench.version import __version__

    package = Path(__file__).resolve().parents[1]  # kvbench/, as kvbench.__file__'s folder
    return {
        "kvbench": __version__,
        "git_sha": checkout_sha(package.parent),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "command": sys.argv,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "packages": {name: _version(name) for name in ("torch", "triton", "transformers", "numpy")},
        **_gpu(),
    }


def checkout_sha(root: Path) -> str:
    """The commit checked out at `root`, where `root` is the top of a git work tree holding
    kvbench/ (a source checkout of kvbench), else "unknown".

    Only that folder counts: an installed kvbench sits inside site-packages, which may lie in
    some other project's repository, and the current directory may be any repository at all;
    their commits say nothing about the code that ran. Git's environment variables (GIT_DIR,
    set inside hooks, and the like) are dropped for the same reason.
    """
    root = Path(root).resolve()
    if not (root / "kvbench").is_dir() or not (root / ".git").exists():
        return "unknown"
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, env=env
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != root:
        return "unknown"
    return git("rev-parse", "--verify", "HEAD") or "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _gpu() -> dict:
    """The GPU a run used, if torch is loaded and sees one (a simulation does not load torch)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return {}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info = {"gpu": props.name, "gpu_memory_bytes": props.total_memory, "cuda": torch.version.cuda}
    try:
        import pynvml

        pynvml.nvmlInit()
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # NVML is optional: the driver version is then unknown
        info["driver"] = None
    return info


def write_csv(path: Path, rows: Iterable, row_type: type, extra: Sequence[dict] = ()) -> None:
    """Rows of a dataclass, plus optional extra columns per row (collectors' measurements)."""
    names = list(dict.fromkeys(key for columns in extra for key in columns))  # first-seen order
    header = [field.name for field in fields(row_type)]
    # a shallow tuple of the row's scalar fields: `dataclasses.astuple` deep-copies every value,
    # which made writing a long run's steps.csv cost as much as simulating it
    values = attrgetter(*header) if len(header) > 1 else lambda row: (getattr(row, header[0]),)
    with atomic_open(path, newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header + names)
        if not names:
            writer.writerows(values(row) for row in rows)
            return
        for row, columns in zip(rows, extra, strict=True):
            writer.writerow([*values(row), *(columns.get(name, "") for name in names)])


def read_json(path: Path) -> dict:
    """A JSON object from `path`; a missing file is `{}`, a broken one a one-line error naming it.

    Here, beside `write_json`, rather than with the table readers (`kvbench.results.load`): the
    cost-model file is read on every simulation's path, which should not import pandas.
    """
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise KvbenchError(f"{path}: not UTF-8 text (byte {error.start}): not a file kvbench wrote") from None
    except json.JSONDecodeError as error:
        raise KvbenchError(f"{path}: not valid JSON ({error}): truncated or not kvbench's") from None
    except RecursionError:
        raise KvbenchError(f"{path}: not valid JSON (nested too deeply): not a file kvbench wrote") from None
    except OSError as error:
        raise KvbenchError(f"{path}: cannot read it ({error.strerror})") from None
    if not isinstance(data, dict):
        raise KvbenchError(f"{path}: expected a JSON object, got a JSON {_json_type(data)}")
    return data


def _json_type(value) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2, allow_nan=True) + "\n")


def write_text(path: Path, text: str) -> None:
    """`path.write_text(text)`, but a reader sees the old file or the new one, never half."""
    with atomic_open(path) as f:
        f.write(text)


def temp_path(path: Path, token: str | None = None) -> Path:
    """A temporary sibling of `path` that names this process (see the module docstring)."""
    path = Path(path)
    return path.with_name(f".{path.name}.kvbench-{os.getpid()}-{token or secrets.token_hex(4)}")


def remove_stale_temps(path: Path) -> None:
    """Remove the temporary copies of `path` left by kvbench processes that are gone."""
    path = Path(path)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.kvbench-*"):
        found = TEMP.fullmatch(stale.name)
        if found is None or found["name"] != path.name:
            continue
        if int(found["pid"]) == os.getpid() or _alive(int(found["pid"])):
            continue
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    return True


@contextmanager
def atomic_open(path: Path, newline: str | None = None, binary: bool = False) -> Iterator:
    """A file open for writing (text, or bytes with `binary`) that appears at `path` whole when
    the block ends, and not at all if it raises: written beside it, renamed over it."""
    path = Path(path)
    remove_stale_temps(path)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask decides, as open()
    try:
        # text as UTF-8, as every reader reads it back, whatever the locale's encoding
        text = {} if binary else {"encoding": "utf-8", "newline": newline}
        with os.fdopen(fd, "wb" if binary else "w", **text) as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_figure(fig, path: Path, **savefig) -> None:
    """`fig.savefig(path, **savefig)`, atomically; the format is the suffix's (`.png`, `.svg`)."""
    path = Path(path)
    with atomic_open(path, binary=True) as f:
        fig.savefig(f, format=path.suffix.removeprefix("."), **savefig)


def write_run_atomically(out: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp_dir)` and make its files appear at `out` all at once.

    `out`, if it exists, is a folder kvbench wrote (the commands check with `prepare_out`):
    kvbench's files in it are replaced, and anything else a user put there moves into the new
    copy at the same path (`kvbench.results.ownership`).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    tmp = temp_path(out)
    tmp.mkdir()  # not tempfile.mkdtemp: that one is private (0700) to its user
    try:
        write(tmp)
        if out.is_dir() and not out.is_symlink():
            carry_foreign(out, tmp)
            old = temp_path(out, "old")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)  # fails on a file or a link: never replaced silently
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
