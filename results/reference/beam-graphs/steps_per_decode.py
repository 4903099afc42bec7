"""Per decode step time of the Figure 15 Alpaca runs, before and after beam steps were graphed.

python results/reference/beam-graphs/steps_per_decode.py results/reference/beam-graphs
"""

import csv
import statistics as st
import sys
from pathlib import Path

for side in ("before", "after"):
    for run in ("n4", "k2", "k6"):
        rows = [
            r
            for r in csv.DictReader((Path(sys.argv[1]) / side / run / "steps.csv").read_text().splitlines())
            if r["kind"] == "decode"
        ]
        ms = [1e3 * float(r["duration_s"]) / int(r["num_steps"]) for r in rows]
        batch = st.mean(int(r["batch_size"]) for r in rows)
        print(
            f"{side:6s} {run}: {len(rows)} decode rows, mean {st.mean(ms):.2f} ms/step, "
            f"median {st.median(ms):.2f}, mean batch {batch:.1f}"
        )
