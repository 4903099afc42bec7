"""Repeat the timing-sensitive tests many times, idle and under CPU load, on 2-core lanes.

The CI machine has 2 cores; a test that depends on the machine's speed shows it there, under
load. This script emulates that box on a larger host: each *lane* is a pair of cores the tests
are pinned to (`taskset`), and a *loaded* lane also runs two busy loops pinned to the same
pair. Lanes run side by side; each runs the whole selection (`SELECTION`, one pytest process
per line) again and again until `--minutes` would be exceeded, and records every run as one
line of `runs.csv` under `--out` (lane, loaded, run, seconds, exit code of each selection).
A later call with the same `--out` adds runs, so the count can be built across calls.

    python tools/repeat_tests.py --out build/repeat --lanes 4 --loaded-lanes 4 --minutes 8
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the tests whose outcome once depended on the machine's speed (docs/TESTING.md); test_stats's
# `slow` million-request test (over 2 minutes a run) is left out of the repeats
PREEMPTION = "preemption or swap or virtual or prefix_hit"
SELECTION = (
    ("tests/test_modeling.py", "tests/test_prefix_cache.py", "-k", PREEMPTION),
    ("tests/test_sweep_executor.py",),
    ("tests/test_sweep.py", "tests/test_realtraces.py", "-k", "killed or loads_fast or stopped"),
    ("tests/test_stats.py", "-m", "not slow"),
    ("tests/test_tensor_parallel.py",),
    ("tests/test_sweep_ray.py",),
)
FIELDS = ("lane", "cores", "loaded", "run", "seconds", *(f"rc{i}" for i in range(len(SELECTION))), "ok")
lock = threading.Lock()


def run_once(cores: str, selections=SELECTION) -> tuple[float, list[int]]:
    start = time.monotonic()
    codes = []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    for selection in selections:
        command = ["taskset", "-c", cores, sys.executable, "-m", "pytest", "-p", "no:xdist", "-p",
                   "no:cacheprovider", "-q", *selection]  # fmt: skip
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        # 5: nothing selected (a module skipped whole), not a failure
        codes.append(0 if proc.returncode == 5 else proc.returncode)
        if codes[-1]:
            sys.stderr.write(f"lane {cores}: {' '.join(selection)} failed\n{proc.stdout[-3000:]}\n")
    return time.monotonic() - start, codes


def lane(index: int, cores: str, loaded: bool, deadline: float, out: Path, first_run: int,
         selections=SELECTION, runs: int | None = None) -> None:
    loops = []
    if loaded:
        busy = [sys.executable, "-c", "while 1: pass"]
        loops = [subprocess.Popen(["taskset", "-c", cores, *busy]) for _ in range(2)]
    try:
        run, longest = first_run, 0.0
        while time.monotonic() + longest * 1.1 < deadline and (runs is None or run - first_run < runs):
            seconds, codes = run_once(cores, selections)
            codes += [None] * (len(SELECTION) - len(codes))  # selections not run: empty cells
            longest = max(longest, seconds)
            row = dict(zip(FIELDS, (index, cores, loaded, run, round(seconds, 1), *codes, not any(codes)),
                           strict=True))  # fmt: skip
            with lock, open(out / "runs.csv", "a", newline="") as f:
                csv.DictWriter(f, FIELDS).writerow(row)
            run += 1
    finally:
        for loop in loops:
            loop.kill()


def _rows(table: Path) -> list[dict]:
    with open(table, newline="") as f:
        return list(csv.DictReader(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lanes", type=int, default=4, help="idle 2-core lanes")
    parser.add_argument("--loaded-lanes", type=int, default=4, help="2-core lanes with two busy loops each")
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--only", help="repeat only the selections whose first file name contains this")
    parser.add_argument("--runs", type=int, default=None, help="stop a lane after this many runs")
    args = parser.parse_args()
    selections = [s for s in SELECTION if args.only is None or args.only in s[0]]
    if not selections:
        parser.error(f"--only {args.only!r} matches no selection")
    args.out.mkdir(parents=True, exist_ok=True)
    table = args.out / "runs.csv"
    done = _rows(table) if table.is_file() else []
    if not done:
        with open(table, "w", newline="") as f:
            csv.DictWriter(f, FIELDS).writeheader()
    deadline = time.monotonic() + args.minutes * 60
    threads = []
    for index in range(args.lanes + args.loaded_lanes):
        cores = f"{2 * index},{2 * index + 1}"
        first = sum(1 for row in done if row["lane"] == str(index))
        threads.append(threading.Thread(
            target=lane, args=(index, cores, index >= args.lanes, deadline, args.out, first, selections,
                               args.runs)
        ))  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = _rows(table)
    for loaded in ("False", "True"):
        mine = [row for row in rows if row["loaded"] == loaded]
        green = sum(row["ok"] == "True" for row in mine)
        print(f"{'loaded' if loaded == 'True' else 'idle'}: {green}/{len(mine)} runs green")


if __name__ == "__main__":
    main()
