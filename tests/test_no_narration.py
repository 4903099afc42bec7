"""The project speaks of itself: code, docs and results describe kvbench and its measurements,
never the work that produced them (who asked for what, in which period, with which tools).

Every tracked text file is searched for phrases that only narration uses. The patterns are
precise rather than allow-listed: "ticket" alone is the split-KV merge's counter
(kernels/split_merge.py) and `ParallelSession` a class, so neither is matched; "ticket 12" or
"this ticket" is.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ipynb", ".json", ".csv", ".sh", ".yml", ".yaml"}
PATTERNS = (
    r"\bdevice\stool\b",
    r"\bdevice minutes\b",
    r"\bnvidia-h200-x\d\b",  # a machine kind's name, where a GPU's was meant
    r"\bsessions? ?\d",  # the word and a number, spaced or not (a folder named so, too)
    r"\b(this|that|previous|next|earlier|later|work) sessions?\b",
    r"\bsession['’]s (device|time|budget)\b",
    r"\b(the|this|that|a later|an earlier|later|earlier|next|previous) issues?\b",
    r"\bissue['’]s\b",
    r"\b(foundation|workloads|kernels|real-decoding|sweeps?|reports?) issues?\b",
    r"\bhelper agents?\b",
    r"\bwork periods?\b",
    r"\bsprints?\b",
    r"\btickets? #?\d",
    r"\b(this|that|the|a) ticket (asks|says|wants|requires|requests|asked)\b",
    r"\bthis ticket\b",
)
NARRATION = re.compile("|".join(PATTERNS), re.IGNORECASE)
THIS_FILE = Path(__file__).resolve()


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [ROOT / name for name in listed.decode().split("\0") if name]
    text = [p for p in paths if p.suffix in SUFFIXES or p.name == "Makefile"]
    return [p for p in text if p.is_file() and p != THIS_FILE]


def hits(text: str) -> list[tuple[int, str]]:
    return [
        (number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if NARRATION.search(line)
    ]


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_tracked_file_narrates_how_it_was_made():
    found = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(ROOT)}:{n}: {line[:160]}" for n, line in hits(text)]
    assert not found, "narration instead of a description of kvbench:\n" + "\n".join(found)


# the narrating examples are assembled at run time, so this file reads clean to any text search
@pytest.mark.parametrize(
    "line",
    [
        "measured with the device_tool on 2026-11-29".replace("_", " "),
        "(session_5, same GPU)".replace("_", " "),
        "the last 4 minutes of this_session".replace("_", " "),
        "a session's device time",
        "The next session found first-use costs",
        "the_issue_s reference workload".replace("the_", "the ").replace("_s", "'s"),
        "The_issue asks for 90 %".replace("_", " "),
        "fitting them is a later issue",
        "until the kernels issue lands",
        "see ticket 12",
        "on nvidia-h200-x2",
        "a helper agent wrote it",
        "in the next work period",
    ],
)
def test_narration_is_found(line):
    assert hits(line), line


@pytest.mark.parametrize(
    "line",
    [
        "takes a ticket for its (sequence, KV head)",  # the fused merge's counter
        "the program that draws the last ticket merges",
        "`ParallelSession` (rank 0 of a tensor-parallel group)",
        "tensor-parallel sessions, transformers' engines",
        "Triton issues a scalar atomic per program",
        "a runner over the session's arena",
        "the session holds opt-13b on 2 ranks",
        "until the session closes",
    ],
)
def test_technical_words_are_not_narration(line):
    assert not hits(line), line
