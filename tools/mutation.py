"""Mutation testing of the engines, the metrics and trace validation (`make mutation`).

Runs mutmut (configured in setup.cfg) in a scratch copy of the *committed* tree, so the report
names the commit it tested and the work tree, shared by everyone editing it, is never mutated.
Writes `results/mutation/<scope>/`: `stats.json` (mutmut's counts), `survivors.md` (every
surviving mutant's diff, to be explained in docs/MUTATION.md as equivalent or a missing test)
and `run.json` (command, commit, date, paths, tests, seconds).

    python tools/mutation.py                      # everything setup.cfg lists
    python tools/mutation.py --scope engines --paths engines/
    python tools/mutation.py --paths engines/arena.py --max-children 2

Mutation testing is slow (every mutant reruns the tests that reach its function): run it with
`nice`, and narrow `--paths` on a shared machine. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / "build" / "mutation"  # ignored by git; one folder per scope, made and emptied here only


def committed_tree(into: Path) -> str:
    """Extract HEAD into `into`; return its commit id."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryFile() as archive:
        subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, stdout=archive, check=True)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(into, filter="data")
    return commit


def setting(config: Path, key: str) -> list[str]:
    """A list setting of setup.cfg's [mutmut] section."""
    parser = configparser.ConfigParser()
    parser.read(config)
    return [line for line in parser["mutmut"][key].split("\n") if line]


def narrow(config: Path, key: str, values: list[str]) -> list[str]:
    """Replace a list setting of the scratch copy's setup.cfg by `values` (if any); the setting."""
    if values:
        parser = configparser.ConfigParser()
        parser.read(config)
        parser["mutmut"][key] = "\n" + "\n".join(values)
        with open(config, "w") as f:
            parser.write(f)
    return setting(config, key)


def survivors(work: Path, env: dict) -> list[tuple[str, str]]:
    """(mutant, diff) of every mutant that survived."""
    listing = subprocess.run(
        [sys.executable, "-m", "mutmut", "results"], cwd=work, env=env, capture_output=True, text=True
    ).stdout
    names = re.findall(r"^\s*(\S+): survived$", listing, flags=re.MULTILINE)
    out = []
    for name in names:
        diff = subprocess.run(
            [sys.executable, "-m", "mutmut", "show", name], cwd=work, env=env, capture_output=True, text=True
        ).stdout
        out.append((name, diff.strip()))
    return out


# what a run writes into a scope's folder; the rest of it (equivalent.md) is written by hand
REPORT = ("run.json", "stats.json", "survivors.md")


def write_report(out: Path, run: dict, stats: dict, alive: list[tuple[str, str]]) -> None:
    """The scope's folder, written whole in a temporary folder and renamed into place. Its files
    a run does not write (`equivalent.md`: the survivors explained by hand) come along unchanged."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    for kept in sorted(out.iterdir()) if out.is_dir() else ():
        if kept.name in REPORT:
            continue
        if kept.is_dir():
            shutil.copytree(kept, tmp / kept.name)
        else:
            shutil.copy2(kept, tmp / kept.name)
    (tmp / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    (tmp / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    lines = [
        f"# Surviving mutants: {', '.join(run['paths'])}",
        "",
        f"Commit {run['commit']}, {run['date']}; `{run['command']}`.",
        ""
        if run["finished"]
        else f"Stopped at the time limit ({run['seconds']} s): mutants not run are not counted.",
        f"Killed {stats.get('killed', 0)} of {stats.get('total', 0)}; survived {len(alive)}; "
        f"no test reaches {stats.get('no_tests', 0)}; timed out {stats.get('timeout', 0)}.",
        "",
    ]
    for name, diff in alive:
        lines += [f"## {name}", "", "```diff", diff, "```", ""]
    (tmp / "survivors.md").write_text("\n".join(lines))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--paths", nargs="*", default=[], help="source paths to mutate (default: setup.cfg's)"
    )
    parser.add_argument("--scope", default="all", help="report folder name under results/mutation/")
    parser.add_argument("--tests", nargs="*", default=[], help="test files to run (default: setup.cfg's)")
    parser.add_argument("--time-limit", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--max-children", type=int, default=1, help="mutants run at once (CPU cores)")
    parser.add_argument(
        "--timeout-multiplier", type=float, default=None,
        help="a mutant's CPU limit is 2 x this x (its tests' seconds + 1) (default: setup.cfg's, else 15)",
    )  # fmt: skip
    args = parser.parse_args()
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.scope):
        parser.error(f"--scope must be a plain folder name, got {args.scope!r}")
    scratch = SCRATCH / args.scope  # scopes may run side by side
    if scratch.exists():
        shutil.rmtree(scratch)
    work = scratch / "tree"
    work.mkdir(parents=True)
    commit = committed_tree(work)
    paths = narrow(work / "setup.cfg", "source_paths", args.paths)
    narrow(work / "setup.cfg", "pytest_add_cli_args_test_selection", args.tests)
    if args.timeout_multiplier:  # a mutant that loops stops sooner
        config = configparser.ConfigParser()
        config.read(work / "setup.cfg")
        config["mutmut"]["timeout_multiplier"] = f"{args.timeout_multiplier:g}"
        with open(work / "setup.cfg", "w") as f:
            config.write(f)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = "python tools/mutation.py " + " ".join(
        [
            f"--scope {args.scope}",
            f"--max-children {args.max_children}",
            *([f"--time-limit {args.time_limit:g}"] if args.time_limit else []),
            *([f"--timeout-multiplier {args.timeout_multiplier:g}"] if args.timeout_multiplier else []),
            *(["--paths", *args.paths] if args.paths else []),
            *(["--tests", *args.tests] if args.tests else []),
        ]
    )
    started = time.monotonic()
    mutmut = subprocess.Popen(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children)],
        cwd=work, env=env, stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        mutmut.wait(timeout=args.time_limit)
        finished = True
    except subprocess.TimeoutExpired:  # stop mutmut and its workers (their own session); report what ran
        os.killpg(mutmut.pid, signal.SIGTERM)
        mutmut.wait()
        finished = False
    if finished and mutmut.returncode != 0:
        # e.g. a selected test already fails on the committed tree: no mutant ran, and a report
        # of "0 killed" would read as a result; the scope's last report stays as it was
        sys.exit(f"mutmut stopped with exit code {mutmut.returncode} (rerun it in {work}); no report written")
    seconds = time.monotonic() - started
    subprocess.run([sys.executable, "-m", "mutmut", "export-cicd-stats"], cwd=work, env=env, check=True)
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
    run = {
        "command": command,
        "commit": commit,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "paths": paths,
        "tests": setting(work / "setup.cfg", "pytest_add_cli_args_test_selection"),
        "seconds": round(seconds),
        "finished": finished,  # False: stopped at --time-limit, mutants not run are left out
        "python": sys.version.split()[0],
    }
    write_report(ROOT / "results" / "mutation" / args.scope, run, stats, survivors(work, env))
    print(f"results/mutation/{args.scope}: {stats}")


if __name__ == "__main__":
    main()
