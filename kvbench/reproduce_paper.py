"""The paper's numbers for the figures `kvbench reproduce` adds to kvbench.paper (PAPER.md).

Figures 2 and 13 live in `kvbench.paper` (the demo uses them too); these are Figure 12's
digitized sustained rates, Figures 14-17's sharing numbers, Figure 18b's best block sizes and
Figure 19's overheads.
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

# Figures 14-17: sharing (OPT-13B; LLaMA-13B for Figure 16)
FIG14_BEAM6_RATIO = 2.3  # vLLM over Orca (Oracle), sustained rate, Alpaca, beam width 6 (text)
FIG15_SAVED_PCT = {  # % of KV blocks saved by sharing; ShareGPT only as the text's range ends
    ("alpaca-paper", "parallel"): {2: 6.09, 4: 8.53, 6: 9.79},
    ("alpaca-paper", "beam"): {2: 37.56, 4: 53.13, 6: 55.16},
    ("sharegpt-paper", "parallel"): {2: 16.2, 6: 30.5},
    ("sharegpt-paper", "beam"): {2: 44.3, 6: 66.3},
}
FIG16_RATIO = {"fewshot-1": 1.67, "fewshot-5": 3.58}  # vLLM over Orca (Oracle), shared few-shot prefix
FIG17_RATIO = 2.0  # vLLM over the Orca baselines, chat (text; about 1.5 read off the figure)
