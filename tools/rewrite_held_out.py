"""Rewrite a reproduction's held-out pages from its committed calibration/cost.json.

A real `kvbench reproduce` writes `calibration/held_out.md`, `held_out_sharing.md` and
`held_out_sets.json` beside the fit. When the way those pages are written changes, the
committed ones are rewritten from cost.json's `held_out` rows (every check the GPU's runs gave)
without refitting or replaying anything: the fitted constants and every error stay as they were
(`kvbench.reproduce.calibration.rewrite_held_out`).

    python tools/rewrite_held_out.py                 # every results/reproduce/*/calibration
    python tools/rewrite_held_out.py FOLDER [...]    # these reproduction folders
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvbench.calibrate.check import TARGET
from kvbench.errors import KvbenchError
from kvbench.reproduce.calibration import rewrite_held_out

ROOT = Path(__file__).resolve().parent.parent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folders", nargs="*", type=Path, help="reproduction folders (default: results/reproduce/*)"
    )
    args = parser.parse_args(argv)
    folders = args.folders or sorted(
        p.parent.parent for p in (ROOT / "results/reproduce").glob("*/calibration/cost.json")
    )
    for folder in folders:
        try:
            sets = rewrite_held_out(folder)
        except KvbenchError as error:  # a folder with no calibration: one line, nothing written
            print(f"error: {error}", file=sys.stderr)
            return 2
        for s in sets:
            loaded = "; ".join(
                f"{metric} {m['loaded']['within_target']} of {m['loaded']['runs']}"
                for metric, m in s.summary.items()
            )
            print(f"{folder}: {s.label}: loaded runs within {100 * TARGET:.0f} %: {loaded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
