"""Trace loading speed: a 1,000,000-request trace read back from CSV and JSONL, and Mooncake.

Generates `sharegpt-paper` at 10 req/s (workloads.presets.make_trace) into a temporary folder,
writes it as kvbench CSV and JSONL, then reads each file with `read_trace` in a fresh Python
process, so that the reported peak RSS (ru_maxrss) is the load's own and not the generator's.
Also loads the shared Mooncake trace (12,031 rows) when shared/traces is present.
Targets on a 2-core machine: 1M rows loaded with stats in under 10 s and 1 GiB; Mooncake
under 2 s.

    python benchmarks/trace_load.py [--num-requests N]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared/traces"
MOONCAKE = SHARED_TRACES / "mooncake" / "conversation_trace.jsonl"
SUFFIXES = (".csv", ".jsonl")


def child_read(path: str) -> dict:
    """Child mode: read one file and compute its stats (`kvbench trace stats`); times, RSS, rows."""
    from workloads.stats import format_stats, trace_stats
    from workloads.tracefile import read_trace

    start = time.perf_counter()
    trace = read_trace(path)
    seconds = time.perf_counter() - start
    format_stats(trace_stats(trace))
    total = time.perf_counter() - start
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"seconds": seconds, "with_stats": total, "rss_mib": rss_mib, "rows": len(trace)}


def child_write(folder: str, num_requests: int) -> dict:
    """Child mode: generate the trace and write it as CSV and JSONL; the seconds each took."""
    from workloads.presets import make_trace
    from workloads.tracefile import write_trace

    start = time.perf_counter()
    trace = make_trace("sharegpt-paper", num_requests, rate=10.0, seed=0)
    seconds = {"generate": time.perf_counter() - start}
    for suffix in SUFFIXES:
        start = time.perf_counter()
        write_trace(trace, Path(folder) / f"trace{suffix}")
        seconds[suffix] = time.perf_counter() - start
    return seconds


def in_child(*args: str) -> dict:
    """Run this script in a fresh interpreter (a child's ru_maxrss would include its parent's
    memory if forked from a big process, so the parent stays small) and parse its JSON answer."""
    out = subprocess.run(
        [sys.executable, __file__, *args], cwd=ROOT, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=1_000_000)
    parser.add_argument("--child-read", help=argparse.SUPPRESS)
    parser.add_argument("--child-write", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_read:
        print(json.dumps(child_read(args.child_read)))
        return
    if args.child_write:
        print(json.dumps(child_write(args.child_write, args.num_requests)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        written = in_child("--child-write", folder, "--num-requests", str(args.num_requests))
        print(f"generated {args.num_requests:,} requests in {written['generate']:.1f} s")
        for suffix in SUFFIXES:
            path = Path(folder) / f"trace{suffix}"
            size_mib = path.stat().st_size / 2**20
            rows.append(
                (f"kvbench {suffix[1:]}", in_child("--child-read", str(path)), written[suffix], size_mib)
            )
    if MOONCAKE.is_file():
        size_mib = MOONCAKE.stat().st_size / 2**20
        rows.append(("mooncake jsonl", in_child("--child-read", str(MOONCAKE)), None, size_mib))
    else:
        print(f"({MOONCAKE} absent: Mooncake skipped)")
    print(f"{'file':<15} {'rows':>10} {'MiB':>7} {'write s':>8} {'read s':>7}", end=" ")
    print(f"{'+stats s':>8} {'peak RSS MiB':>13}")
    for label, got, write_s, size_mib in rows:
        write_text = f"{write_s:8.2f}" if write_s is not None else f"{'-':>8}"
        read_s, rss = got["seconds"], got["rss_mib"]
        print(
            f"{label:<15} {got['rows']:>10,} {size_mib:7.1f} {write_text} {read_s:7.2f} "
            f"{got['with_stats']:8.2f} {rss:13.0f}"
        )


if __name__ == "__main__":
    main()
