"""Results on disk: the source of truth that plots, reports and notebooks read.

`<out>/config.json, env.json, steps.csv, requests.csv, summary.json` are written into a
temporary sibling folder and swapped in with renames, so a reader (or an interrupted
sweep) never sees a half-written run: the folder holds the previous complete result or
the new complete result.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import astuple, fields
from datetime import UTC, datetime
from pathlib import Path


def environment() -> dict:
    """What produced a result: versions, host, git SHA, command line."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except OSError:
        sha = None
    from kvbench import __version__

    return {
        "kvbench": __version__,
        "git_sha": sha,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "command": sys.argv,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_csv(path: Path, rows: Iterable, row_type: type) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([field.name for field in fields(row_type)])
        writer.writerows(astuple(row) for row in rows)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, allow_nan=True) + "\n")


def write_run_atomically(out: Path, write) -> None:
    """Call `write(tmp_dir)` and make its files appear at `out` all at once."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
