"""tools/device_tree.sh: the working tree a GPU call copies, cut to the results folders it names.

Checked on a git repository made here: the folders not kept leave the working tree while git
still sees a clean checkout (nothing of theirs is lost or shows as deleted), the kept folder (but
the runs a seed set aside in it, `earlier/`) and everything outside results/ stay, a folder that
does not exist is refused in one line with exit code 2, and `restore` brings every file back.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "device_tree.sh"
FILES = {
    "engines/paged.py": "a = 1\n",
    "results/README.md": "index\n",
    "results/reproduce/opt/fig12/runs.csv": "x\n1\n",
    "results/reproduce/opt/fig12/seed-0/earlier/alpaca/runs.csv": "x\n0\n",
    "results/reproduce/quick/runs.csv": "x\n2\n",
    "results/reference/vmm/runs.csv": "x\n3\n",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for path, text in FILES.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "results")
    return repo


def device_tree(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, capture_output=True, text=True)


def present(repo: Path) -> set[str]:
    return {path for path in FILES if (repo / path).exists()}


def test_keep_leaves_only_the_named_results_folder_and_git_sees_no_change(tmp_path):
    repo = checkout(tmp_path)
    done = device_tree(repo, "keep", "results/reproduce/opt/")
    assert done.returncode == 0, done.stderr
    assert present(repo) == {"engines/paged.py", "results/README.md", "results/reproduce/opt/fig12/runs.csv"}
    assert git(repo, "status", "--porcelain") == ""
    assert "3 tracked files out of the tree" in done.stdout  # the set-aside runs of the kept folder too
    # what a call brings back into the kept folder is seen by git as usual
    (repo / "results/reproduce/opt/fig12/new.csv").write_text("x\n4\n")
    assert git(repo, "status", "--porcelain").split() == ["??", "results/reproduce/opt/fig12/new.csv"]
    done = device_tree(repo, "restore")
    assert done.returncode == 0, done.stderr
    assert present(repo) == set(FILES)
    assert (repo / "results/reference/vmm/runs.csv").read_text() == "x\n3\n"


def test_a_folder_that_does_not_exist_is_refused_and_nothing_changes(tmp_path):
    repo = checkout(tmp_path)
    done = device_tree(repo, "keep", "results/reproduce/opt", "results/reference/missing")
    assert done.returncode == 2
    assert done.stderr.strip() == "device_tree.sh: no folder results/reference/missing"
    assert present(repo) == set(FILES)
    assert device_tree(repo, "sideways").returncode == 2
