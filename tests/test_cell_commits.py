"""tools/cell_commits.py: the commits a results folder's runs ran at, and whether their run code differs.

Checked on a git repository made here: a commit that changes only docs keeps the run code, one
that changes an engine does not, and a run whose commit the history lacks is reported as unknown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import load_script

ROOT = Path(__file__).resolve().parent.parent


def tool():
    return load_script("tools/cell_commits.py")


def commit(repo: Path, path: str, text: str) -> str:
    file = repo / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for args in (["add", path], ["commit", "-q", "-m", path]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env, capture_output=True)
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def new_repo(tmp_path: Path) -> Path:
    """An empty git repository the commits of a test go into."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def run_folder(root: Path, name: str, sha: str | None, mode: str | None = None) -> None:
    folder = root / "cells" / name
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"mode": mode} if mode else {}))
    (folder / "config.json").write_text("{}")
    if sha is not None:
        (folder / "env.json").write_text(json.dumps({"git_sha": sha}))


def test_runs_are_grouped_by_commit_and_run_code_changes_named(tmp_path):
    repo = new_repo(tmp_path)
    first = commit(repo, "engines/paged.py", "a = 1\n")
    docs = commit(repo, "docs/NOTE.md", "words\n")
    engine = commit(repo, "engines/paged.py", "a = 2\n")
    results = tmp_path / "results"
    run_folder(results, "paged__seed-0", first)
    run_folder(results, "paged__seed-1", docs)
    run_folder(results, "static__seed-1", docs)
    lines, same = tool().report([results], repo)
    assert same and len(lines) == 2
    assert lines[0].startswith(first[:12]) and "1 run (" in lines[0]
    assert "2 runs" in lines[1] and "the same run code as the earliest" in lines[1]
    run_folder(results, "paged__seed-2", engine)
    run_folder(results, "orca__seed-2", None)  # no env.json: its commit unknown
    lines, same = tool().report([results], repo)
    assert not same
    assert lines[2].startswith(engine[:12]) and "differs from" in lines[2] and "engines/paged.py" in lines[2]
    assert lines[3].startswith("unknown") and "its code unknown" in lines[3]


def test_a_folder_without_runs_is_one_line_and_exit_code_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "cell_commits.py"), str(tmp_path / "nothing")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nothing'}: no run folder (summary.json and config.json) below it"
    ]


def test_a_real_figure_is_judged_by_its_real_runs_not_its_placements_nor_runs_set_aside(tmp_path):
    """Figure 12's layout: a seed's placement simulations (CPU, an older commit), the real panel
    run again at one run code, and the earlier panel set aside in `earlier/`: only the real runs
    of the panel count, and the set-aside ones are reported when their folder is named."""
    repo = new_repo(tmp_path)
    placed = commit(repo, "engines/paged.py", "a = 1\n")
    earlier = commit(repo, "kvbench/real/run.py", "b = 1\n")
    now = commit(repo, "kvbench/real/run.py", "b = 2\n")
    seed = tmp_path / "fig12" / "seed-0"
    run_folder(seed / "alpaca-paper.placement", "paged__rate-60", placed, "simulated")
    run_folder(seed / "alpaca-paper", "paged__rate-64", now, "real")
    run_folder(seed / "alpaca-paper", "static__rate-5", now, "real")
    run_folder(seed / "earlier" / "alpaca-paper", "paged__rate-59", earlier, "real")
    lines, same = tool().report([tmp_path / "fig12"], repo)
    assert same and lines == [
        f"{now[:12]} 2 runs (paged__rate-64 .. static__rate-5): the same run code as the earliest"
    ]
    lines, same = tool().report([tmp_path / "fig12", seed / "earlier"], repo)
    assert not same and len(lines) == 2 and lines[0].startswith(earlier[:12])
    assert "run code differs from" in lines[1] and "kvbench/real/run.py" in lines[1]
    # a folder of simulations alone is judged by them
    lines, _ = tool().report([seed / "alpaca-paper.placement"], repo)
    assert lines == [
        f"{placed[:12]} 1 run (paged__rate-60 .. paged__rate-60): the same run code as the earliest"
    ]
