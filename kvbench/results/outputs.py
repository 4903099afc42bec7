"""Where a command may write: `prepare_out` checks `--out` before any work starts.

Every command that writes (simulate, run, demo, report, calibrate, reproduce, sweep, trace
plot, trace make and convert, kernels) calls `prepare_out(path, kind, overwrite)` first, so a
mistyped or unusable `--out` costs a one-line error, not a ten-minute run that fails at the
end, and kvbench never replaces what it did not write:

- a new path, or an empty folder: written;
- a kvbench result of the same kind: a run is kept unless `--overwrite` says to replace it
  (it may have cost an hour of GPU time); a sweep or a reproduction resumes into it (their
  own commands decide how); a demo, a report, a calibration file, a trace plot, a trace
  file or a kernel benchmark is regenerated in place (each is a cheap function of kvbench's
  own inputs, and `make demo` must work twice);
- anything else (a user's folder or file, a result of another kind): refused, with or
  without `--overwrite`.

A kvbench result is recognised by what kvbench writes into it: a run folder by its
summary.json and config.json, a sweep by sweep.json, a calibration file by its fitted keys,
a trace plot by the text kvbench puts in the image, a trace file by its format header, a
kernel benchmark by its kernels.csv and bandwidth.json; a demo, report or reproduction folder
by the marker `kvbench.json` (`{"kind": ...}`) that kvbench writes into it first (older
ones by demo.json, report.html, reproduce.md).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.results.files import remove_stale_temps, temp_path, write_json
from kvbench.results.ownership import MARKER  # a demo, report or reproduction folder's {"kind": ...}

PLOT_TAG = "kvbench trace plot"  # in a trace plot's PNG and SVG metadata (kvbench/report/trace_plot.py)
# a PNG's Title chunk holding the tag, then the trace's name: tEXt (Latin-1), or iTXt (any other
# title: compression flag and method, language tag, translated keyword, then the text)
_PNG_TITLE = re.compile(
    rb"(tEXtTitle\x00|iTXtTitle\x00[\x00\x01]\x00[^\x00]*\x00[^\x00]*\x00)"
    + re.escape(PLOT_TAG.encode() + b": ")
)
REPLACE, RESUME, REFUSE = "replace", "resume", "refuse"  # what becomes of an existing result


@dataclass(frozen=True)
class Kind:
    """One kind of output: a folder or a file, how to recognise it, what a rerun does to it."""

    what: str  # for messages: "a run folder"
    folder: bool
    existing: str  # REPLACE, RESUME or REFUSE (without --overwrite)
    ours: Callable[[Path], bool]  # is this existing path a kvbench result of the kind?
    marked: bool = False  # prepare_out makes the folder and writes MARKER into it


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))  # kvbench writes UTF-8 whatever the locale
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # deep nesting: not kvbench's
        return None
    return data if isinstance(data, dict) else None


def _marked(kind: str, legacy: Callable[[Path], bool] | None = None) -> Callable[[Path], bool]:
    """Marked with `kind`, or (`legacy`) holding what kvbench wrote into that kind before the marker:
    recognised by the content kvbench gave those files, not by their names alone (a user's own
    report.md is not a kvbench report)."""

    def check(folder: Path) -> bool:
        marked = (_json(folder / MARKER) or {}).get("kind") == kind
        return marked or (legacy is not None and legacy(folder))

    return check


def _starts(path: Path, text: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(len(text)) == text
    except (OSError, UnicodeDecodeError):
        return False


def _old_demo(folder: Path) -> bool:
    rows = (_json(folder / "demo.json") or {}).get("rows")
    return isinstance(rows, list) and all(isinstance(r, dict) and "engine" in r for r in rows)


def _old_report(folder: Path) -> bool:
    try:
        head = (folder / "report.html").read_text(encoding="utf-8")[:4096]
    except (OSError, UnicodeDecodeError):
        return False
    return "<title>kvbench report</title>" in head and (folder / "report.md").is_file()


def _old_reproduction(folder: Path) -> bool:
    return _starts(folder / "reproduce.md", "# kvbench reproduce")


def _old_sweep(folder: Path) -> bool:
    return {"axes", "base_config"} <= set(_json(folder / "sweep.json") or {})


def is_run(folder: Path) -> bool:
    """A run folder as `kvbench.simulate.write_result` writes it."""
    summary = _json(folder / "summary.json") or {}
    return "engine" in summary and "mode" in summary and _json(folder / "config.json") is not None


def _is_calibration(path: Path) -> bool:
    return {"model", "runs", "rows", "median_relative_error"} <= set(_json(path) or {})


def _is_plot(path: Path) -> bool:
    """A PNG or SVG that kvbench's trace plot wrote: matplotlib's, titled `PLOT_TAG: <trace>` in its
    metadata (a PNG text chunk, an SVG's first <title>). The phrase elsewhere in a user's image, or
    a title of their own that merely contains it, is not kvbench's."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if head.startswith(b"\x89PNG\r\n\x1a\n"):  # a Latin-1 title in a tEXt chunk, any other in iTXt
        return _PNG_TITLE.search(head) is not None and b"Software\x00Matplotlib" in head
    title = head.find(b"<title>")  # the first one: the document's
    svg = head.startswith(b"<?xml") and b"<svg" in head and b"matplotlib" in head.lower()
    return svg and title >= 0 and head.startswith(b"<title>" + PLOT_TAG.encode() + b": ", title)


def _is_trace(path: Path) -> bool:
    """A trace file in kvbench's format (`workloads.tracefile`): its first line is the header object
    naming the format (JSONL; CSV after `# `), or a Parquet file's footer holds the header under the
    format's key. A line that only mentions the format's name is a user's file."""
    try:
        with open(path, "rb") as f:
            head = f.readline(1 << 20)
            f.seek(max(0, path.stat().st_size - (1 << 20)))
            tail = f.read()
    except OSError:
        return False
    if head.startswith(b"PAR1"):
        return tail.endswith(b"PAR1") and b"kvbench-trace" in tail
    try:
        header = json.loads(head.removeprefix(b"# ").decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(header, dict) and header.get("format") == "kvbench-trace"


def _is_kernels(folder: Path) -> bool:
    return (folder / "kernels.csv").is_file() and (folder / "bandwidth.json").is_file()


KINDS = {
    "run": Kind("a run folder", True, REFUSE, is_run),
    "sweep": Kind("a sweep folder", True, RESUME, _marked("sweep", _old_sweep)),
    "demo": Kind("a demo folder", True, REPLACE, _marked("demo", _old_demo), marked=True),
    "report": Kind("a report folder", True, REPLACE, _marked("report", _old_report)),
    "reproduce": Kind(
        "a reproduction folder", True, RESUME, _marked("reproduce", _old_reproduction), marked=True
    ),
    "calibration": Kind("a calibration file", False, REPLACE, _is_calibration),
    "plot": Kind("a trace plot", False, REPLACE, _is_plot),
    "trace": Kind("a trace file", False, REPLACE, _is_trace),
    "kernels": Kind("a kernel benchmark folder", True, REPLACE, _is_kernels),
}


def prepare_plot(out: Path | str, flag: str = "--out") -> list[Path]:
    """`prepare_out` for a figure's PNG and its SVG twin (`out` with either suffix: another one
    would be written under names the user did not give)."""
    out = Path(out)
    _named(out, "file", f"{flag} {shown(out)}")
    if out.suffix.lower() not in (".png", ".svg"):
        raise KvbenchError(
            f"{flag} {shown(out)}: name a .png or .svg file (kvbench writes the figure as both)"
        )
    return [prepare_out(out.with_suffix(suffix), "plot", flag=flag) for suffix in (".png", ".svg")]


def shown(path: Path | str) -> str:
    return str(path) or "''"


def prepare_out(path: Path | str, kind: str, overwrite: bool = False, flag: str = "--out") -> Path:
    """Check that `kind`'s output may go to `path` (see the module docstring); returns it.

    Raises a one-line `KvbenchError` naming `flag` where it may not. Nothing is written,
    except that a marked kind's folder is made and marked (so a rerun recognises it even if
    this one is interrupted).
    """
    spec = KINDS[kind]
    path = Path(path)
    where = f"{flag} {shown(path)}"
    _named(path, "folder" if spec.folder else "file", where)
    try:
        _check(path, spec, overwrite, where)
        if spec.marked and not path.is_dir():
            path.mkdir(parents=True)
        if spec.marked and not spec.ours(path):
            write_json(path / MARKER, {"kind": kind})
    except OSError as error:
        raise KvbenchError(f"{where}: cannot write there ({error.strerror or error})") from None
    return path


def prepare_outs(*outs: tuple[Path, str, bool]) -> list[Path]:
    """`prepare_out` for the several outputs of one command ((path, kind, overwrite) each): every
    refusal before any folder is probed or made, so a refused command changes nothing at all."""
    for path, kind, overwrite in outs:
        path = Path(path)
        where = f"--out {shown(path)}"
        _named(path, "folder" if KINDS[kind].folder else "file", where)
        try:
            _refusals(path, KINDS[kind], overwrite, where)
        except OSError as error:  # a name too long, a folder that cannot be listed: as prepare_out says it
            raise KvbenchError(f"{where}: cannot write there ({error.strerror or error})") from None
    return [prepare_out(path, kind, overwrite) for path, kind, overwrite in outs]


NAME_MAX = 255  # bytes in one file name (Linux and macOS file systems)
# what `files.temp_path` adds to a name, at its longest: its own additions with a 7-digit pid
# (Linux's most) in place of this process's
TEMP_EXTRA = len(temp_path(Path("x")).name) - len("x") - len(str(os.getpid())) + 7


def _named(path: Path, noun: str, where: str) -> None:
    if path.name in ("", ".", ".."):  # typer reads `--out ''` as "."
        raise KvbenchError(f"{where}: name a new {noun}, not the current or a parent folder")
    # a name the file system takes, but not with the temporary copy's additions: else the work is
    # done, then not written (a longer name is refused by the probes, with the system's reason)
    if NAME_MAX - TEMP_EXTRA < len(os.fsencode(path.name)) <= NAME_MAX:
        raise KvbenchError(
            f"{where}: a {noun} name of at most {NAME_MAX - TEMP_EXTRA} bytes (kvbench writes it first "
            f"under a temporary name {TEMP_EXTRA} bytes longer)"
        )


def _check(path: Path, spec: Kind, overwrite: bool, where: str) -> None:
    """Refusals first, then the probes: a refused path and its folder are left as they were."""
    ancestor = _refusals(path, spec, overwrite, where)
    if path.is_dir():
        _probe(path, where)
    _probe(ancestor, where)


def _refusals(path: Path, spec: Kind, overwrite: bool, where: str) -> Path:
    """Raise where `path` may not take `spec`'s output; returns its nearest existing folder."""
    if path.is_symlink():
        raise KvbenchError(f"{where} is a link: kvbench writes only paths it creates; give its target")
    ancestor = path.parent
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise KvbenchError(f"{where}: {shown(ancestor)} is a file, not a folder")
    if os.path.lexists(path):
        _check_existing(path, spec, overwrite, where)
    return ancestor


def _check_existing(path: Path, spec: Kind, overwrite: bool, where: str) -> None:
    noun = "folder" if spec.folder else "file"
    if spec.folder != path.is_dir():
        raise KvbenchError(
            f"{where} is a {'folder' if path.is_dir() else 'file'} that kvbench did not write "
            f"(it writes {spec.what} there); choose a new {noun}"
        )
    if spec.folder and not any(path.iterdir()):
        return
    if not spec.ours(path):
        other = next((k.what for k in KINDS.values() if k.folder == spec.folder and k.ours(path)), None)
        if other is not None:
            raise KvbenchError(f"{where} holds {other}, not {spec.what}: choose a new {noun}")
        listed = ", ".join(sorted(p.name for p in path.iterdir())[:3]) if spec.folder else ""
        raise KvbenchError(
            f"{where} is a {noun} that kvbench did not write{f' (it holds {listed})' if listed else ''}; "
            f"kvbench never replaces one, with or without --overwrite: choose a new {noun}"
        )
    if spec.existing == REFUSE and not overwrite:
        raise KvbenchError(
            f"{where} holds {spec.what} already: add --overwrite to replace it, or pick another"
        )


def _probe(folder: Path, where: str) -> None:
    """Fail now, not after the work, where `folder` takes no new entries (read-only, /proc)."""
    remove_stale_temps(folder / "probe")  # a probe of a process killed between its two lines
    probe = temp_path(folder / "probe")
    try:
        probe.mkdir()
    except OSError as error:
        raise KvbenchError(f"{where}: cannot write in {shown(folder)} ({error.strerror or error})") from None
    probe.rmdir()
