"""Which kvbench commits the runs of a results folder ran at, and whether the code they ran differs.

A figure that pools runs (seeds, engines, repeats) compares them only if they ran the same
code. Runs made across several sessions record each its own commit (`env.json` `git_sha`), and
most commits between them change docs, results or tests, not what a run executes. This groups a
folder's runs by commit and, against the earliest of those commits, lists the files a run
executes that differ: the engines, the kernels, the model and runner code, the workload readers
(`RUN_CODE`). Figure 12's Alpaca panel is the case that made it: seeds whose small prefills cost
13.3 ms and 11.3 ms because a commit between them changed the runner's uploads
(results/reproduce/opt-13b-h200/README.md).

    python tools/cell_commits.py FOLDER [FOLDER ...]

A folder holding real runs is judged by them alone (its placement simulations left out), and
runs a seed set aside (`<seed>/earlier/`) are left out unless that folder is named itself.
Reads the repository's history with git (the folder's commits must be in it). Prints one line
per commit (runs, first and last run folder) and the run code that differs; exits 0 when every
run ran the same run code, 1 when some differ, 2 on a folder that does not exist or holds no run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvbench.reproduce.rows import SET_ASIDE
from kvbench.results.files import read_json
from kvbench.results.load import runs_below

ROOT = Path(__file__).resolve().parent.parent
# what a run executes: a change elsewhere (docs, results, tests, tools, reports) cannot move a number
RUN_CODE = (
    "engines",
    "kernels",
    "workloads",
    "kvbench/real",
    "kvbench/modeling",
    "kvbench/kvspec",
    "kvbench/parallel",
    "kvbench/vmm",
    "kvbench/engine.py",
    "kvbench/sequence.py",
    "kvbench/requests.py",
    "kvbench/config.py",
    "kvbench/budget.py",
    "kvbench/models.py",
    "kvbench/cost_model.py",
    "kvbench/simulate.py",
    "kvbench/runner.py",
)


def compared(folder: Path) -> list[Path]:
    """The runs below `folder` a figure compares: where any is real, its real runs only (a real
    figure's placement simulations ran on a CPU, often at other commits, and compare nothing), and
    never the runs a seed set aside (`<seed>/earlier/`: made at other run code, kept as evidence;
    name that folder itself to see them)."""
    runs = [run for run in runs_below(folder) if SET_ASIDE not in run.relative_to(folder).parts]
    real = [run for run in runs if read_json(run / "summary.json").get("mode") == "real"]
    return real or runs


def commits_of(folders: list[Path]) -> dict[str, list[Path]]:
    """Run folders by the commit their env.json records ("unknown" without one)."""
    by_commit: dict[str, list[Path]] = defaultdict(list)
    for folder in folders:
        for run in compared(folder):
            env = run / "env.json"
            sha = json.loads(env.read_text()).get("git_sha") if env.is_file() else None
            by_commit[sha or "unknown"].append(run)
    return dict(by_commit)


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def in_history(repo: Path, sha: str) -> bool:
    return sha != "unknown" and git(repo, "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0


def ordered(repo: Path, shas: list[str]) -> list[str]:
    """Known commits oldest first (an ancestor has fewer commits behind it than its descendants,
    however close their times), then the ones git does not know."""
    known = [s for s in shas if in_history(repo, s)]
    depth = {s: int(git(repo, "rev-list", "--count", s).stdout.strip()) for s in known}
    return sorted(known, key=lambda s: (depth[s], s)) + sorted(s for s in shas if s not in depth)


def run_code_changes(repo: Path, base: str, sha: str) -> list[str]:
    """Files of `RUN_CODE` that differ between two commits."""
    out = git(repo, "diff", "--name-only", base, sha, "--", *RUN_CODE)
    return [line for line in out.stdout.splitlines() if line]


def report(folders: list[Path], repo: Path = ROOT) -> tuple[list[str], bool]:
    """The printed lines, and whether every run ran the same run code."""
    by_commit = commits_of(folders)
    shas = ordered(repo, list(by_commit))
    base = next((s for s in shas if in_history(repo, s)), None)
    lines, same = [], True
    for sha in shas:
        runs = by_commit[sha]
        where = f"{len(runs)} run{'s' if len(runs) != 1 else ''} ({runs[0].name} .. {runs[-1].name})"
        if not in_history(repo, sha):
            lines.append(f"{sha[:12]:12s} {where}: not in this repository's history, its code unknown")
            same = False
            continue
        changed = run_code_changes(repo, base, sha) if sha != base else []
        same &= not changed
        what = (
            "the same run code as the earliest"
            if not changed
            else (f"run code differs from {base[:12]} in {len(changed)} files: {', '.join(changed)}")
        )
        lines.append(f"{sha[:12]:12s} {where}: {what}")
    return lines, same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args()
    for folder in args.folders:
        if not folder.is_dir() or not runs_below(folder):
            print(f"error: {folder}: no run folder (summary.json and config.json) below it", file=sys.stderr)
            return 2
    lines, same = report(args.folders)
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
