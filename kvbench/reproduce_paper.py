"""The paper's numbers for the figures `kvbench reproduce` adds to kvbench.paper (PAPER.md).

Figures 2 and 13 live in `kvbench.paper` (the demo uses them too); these are Figure 12's
digitized sustained rates, Figure 18b's best block sizes and Figure 19's overheads.
"""

from __future__ import annotations

# Figure 12, OPT-13B: req/s where normalized latency first crosses 0.5 s/token (digitized)
FIG12_SUSTAINED = {
    "sharegpt-paper": {
        "static": 0.23,
        "orca-max": 0.52,
        "orca-pow2": 0.77,
        "orca-oracle": 1.10,
        "paged": 1.93,
    },
    "alpaca-paper": {"static": 2.53, "orca-max": 3.85, "orca-pow2": 16.1, "orca-oracle": 21.1, "paged": 28.1},
}
FIG12_THRESHOLD_S = 0.5  # s/token: the digitization's criterion for "sustained"
RATIO_BASELINES = ("orca-oracle", "orca-max", "static")  # paged / each of these

# Figure 18b: the block sizes the paper finds best (end-to-end normalized latency)
FIG18B_BEST = {"sharegpt-paper": (16, 128), "alpaca-paper": (16, 32)}

# Figure 19 (digitized, ms): recompute flat ~36-39; swap in+out by block size
FIG19_SWAP_MS = {1: 137.0, 16: 40.0, 256: 33.0}
FIG19_RECOMPUTE_MS = 37.5  # middle of the flat 36-39 ms
