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
from collections.abc import Iterable, Sequence
from dataclasses import astuple, fields
from datetime import UTC, datetime
from importlib import metadata
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
        "packages": {name: _version(name) for name in ("torch", "triton", "transformers", "numpy")},
        **_gpu(),
    }


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
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([field.name for field in fields(row_type)] + names)
        if not names:
            writer.writerows(astuple(row) for row in rows)
            return
        for row, columns in zip(rows, extra, strict=True):
            writer.writerow([*astuple(row), *(columns.get(name, "") for name in names)])


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
