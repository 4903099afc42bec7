"""Pack the large run tables of committed results: `steps.csv` and `requests.csv` of at least
`--min-kib` become `steps.csv.gz` and `requests.csv.gz` (`kvbench.results.packed`), which every
kvbench reader takes in their place.

Why: the repository travels whole to the GPU machine, within a size limit, and real runs at the
paper's rates write megabytes of rows each. Only run folders kvbench wrote (summary.json and
config.json beside the table) are touched; a table already packed is left as it is.

    python tools/pack_results.py [FOLDER ...]        # default: results/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvbench.results.load import runs_below
from kvbench.results.packed import pack_table

TABLES = ("steps.csv", "requests.csv")
ROOT = Path(__file__).resolve().parent.parent


def pack(folders: list[Path], min_bytes: int) -> tuple[int, int, int]:
    """(tables packed, bytes before, bytes after) over every run folder below `folders`."""
    packed = before = after = 0
    for run in (r for folder in folders for r in runs_below(folder)):
        for name in TABLES:
            table = run / name
            size = table.stat().st_size if table.is_file() else 0
            if pack_table(table, min_bytes):
                packed += 1
                before += size
                after += table.with_name(name + ".gz").stat().st_size
    return packed, before, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, default=[ROOT / "results"])
    parser.add_argument("--min-kib", type=int, default=128, help="pack tables of at least this size")
    args = parser.parse_args()
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        sys.exit(f"error: FOLDER {missing[0]}: not a folder")
    packed, before, after = pack(args.folders, args.min_kib * 1024)
    print(f"packed {packed} tables: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
