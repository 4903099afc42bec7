"""tools/device_call.sh: the GPU jobs a device call runs by name. Its header is the only list a
user reads before spending device time, so every job it names must exist, every job must be
named, and each job's results folder must be the one its entry says (a job writing elsewhere
would leave its runs where no README and no `device_tree.sh keep` looks)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "tools" / "device_call.sh").read_text()
HEADER = SCRIPT.split("\nset -u\n", 1)[0]
ENTRY = re.compile(r"^#   ([a-z0-9][a-z0-9<>-]*)(?:\s|$)", re.M)


def documented() -> dict[str, str]:
    """Each job the header names -> its entry's text (to the next job's line)."""
    starts = list(ENTRY.finditer(HEADER))
    ends = [m.start() for m in starts[1:]] + [HEADER.index("# Traces are read")]
    return {
        m.group(1).replace("<s>", "*"): HEADER[m.start() : end] for m, end in zip(starts, ends, strict=True)
    }


def cases() -> dict[str, str]:
    """Each job of the `case` -> the folder it writes ('' for none)."""
    found = {}
    for block in re.finditer(r"^    ([a-z0-9*|-]+)\)\n(.*?);;", SCRIPT, re.M | re.S):
        folder = re.search(r"^\s*folder=(\S*)", block.group(2), re.M)
        for job in block.group(1).split("|"):
            found[job] = folder.group(1) if folder else ""
    return found


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "tools" / "device_call.sh")]).returncode == 0


def test_every_job_is_named_in_the_header_and_every_named_job_runs():
    assert set(documented()) == set(cases()) - {"*"} and len(documented()) > 20  # "*": an unknown job


def test_each_jobs_folder_is_the_one_its_entry_names():
    entries = documented()
    for job, folder in cases().items():
        folder = folder.replace("$job", job).replace("${card:-gpu}", "<card>")  # h100 or h200: the card
        if folder:
            assert folder in re.sub(r"\s*\n#\s*", " ", entries[job]), f"{job}: writes {folder}"
