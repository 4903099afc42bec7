"""The README's own commands work: every `kvbench ...` line of its ```sh blocks runs, in order, in a
fresh folder, with the public traces taken from KVBENCH_TRACE_DIR (the project's shared copies),
and then its ```python blocks read the results back there.

A line is left out only for a reason in SKIPPED (CUDA, a user's checkpoint, elided options, a Ray
cluster); `make` and `pip` lines are not kvbench commands. Nothing is shrunk here: a command too
slow for the suite is made smaller in the README itself, where the reader sees it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SHARED = ROOT.parent / "shared" / "traces"

SKIPPED = {  # a substring of the command -> why this suite cannot run it
    "--device cuda": "needs a CUDA GPU",
    "/path/to/": "needs a user's checkpoint",
    "runs/gpu": "reads the CUDA runs above",
    "...": "options elided",
    "--executor ray": "needs a Ray cluster",
}


def sh_commands(text: str) -> list[str]:
    """The commands of the ```sh blocks: continuation lines joined, comments kept for shlex."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M):
        joined = re.sub(r"\\\n\s*", " ", block)
        commands += [line.strip() for line in joined.splitlines() if line.strip()]
    return commands


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def skip_reason(command: str) -> str | None:
    return next((why for part, why in SKIPPED.items() if part in command), None)


def test_the_readme_lists_commands_to_run():
    commands = [c for c in sh_commands(README.read_text()) if c.startswith("kvbench ")]
    run = [c for c in commands if skip_reason(c) is None]
    assert len(run) >= 12, run  # the parser found the blocks
    assert "../shared" not in README.read_text()  # a fresh clone has no such folder
    assert any(c.startswith("kvbench trace fetch ") for c in run)
    assert len(commands) - len(run) == 7  # the CUDA, checkpoint and elided lines: see SKIPPED
    assert "make demo" in README.read_text() and "make test" in README.read_text()
    assert python_blocks(README.read_text())  # the tour reads results back in Python


def test_the_readme_reads_in_five_minutes():
    """The README is a front page: what kvbench answers, the two commands, a tour, links; the
    details live in docs/."""
    size = len(README.read_text())
    assert size <= 8000, f"README.md has {size} characters; move details to docs/ (at most 8,000)"


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not present at {SHARED}")
def test_the_readme_commands_run(tmp_path):
    # the reader's environment: no KVBENCH_ settings, and no TRITON_INTERPRET (the suite sets it so
    # kernel tests run on a CPU; a reader's CPU run takes the PyTorch attention, 10x faster)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVBENCH_") and k != "TRITON_INTERPRET"}
    env.update(KVBENCH_TRACE_DIR=str(SHARED), KVBENCH_CACHE_DIR=str(tmp_path / "cache"))
    env["KVBENCH_TRACE_URL"] = "http://127.0.0.1:9"  # the discard port: nothing may be downloaded
    work = tmp_path / "work"
    work.mkdir()
    ran = []
    for command in sh_commands(README.read_text()):
        args = shlex.split(command, comments=True)
        if not args or args[0] != "kvbench" or skip_reason(command):  # a comment line, make, pip
            continue
        proc = subprocess.run(
            [sys.executable, "-m", "kvbench", *args[1:]],
            cwd=work, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        ran.append(command)
    assert len(ran) >= 12
    assert not (tmp_path / "cache").exists()  # the copies served every name
    made = ("runs/paged/summary.json", "runs/azure/summary.json", "runs/paged/report/report.html",
            "runs/sweep/sustained.csv", "mooncake.png", "mooncake.parquet")  # fmt: skip
    for name in made:
        assert (work / name).is_file(), name
    for code in python_blocks(README.read_text()):
        proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{code}\n{proc.stderr[-2000:]}"
