"""The PagedAttention paper's numbers that kvbench puts beside its own (PAPER.md).

Kwon et al., SOSP 2023, OPT-13B on one A100-40GB with a 12 GB KV cache: Figures 2 and 13 read
off the figures' bar labels (the demo uses them too), Figure 12's digitized sustained rates,
Figures 14-17's sharing numbers, Figure 18b's best block sizes and Figure 19's overheads.
"""

from __future__ import annotations

# engine -> PagedAttention paper name
PAPER_NAMES = {
    "static": "FasterTransformer",
    "orca-max": "Orca (Max)",
    "orca-pow2": "Orca (Pow2)",
    "orca-oracle": "Orca (Oracle)",
    "paged": "vLLM",
}

# Figure 2: KV memory breakdown, % of the KV cache. "other" is the paper's
# "External frag. & Others" = the sum of kvbench's `occupancy.PAPER_OTHER` categories.
FIG2_OCCUPANCY = {
    "orca-max": {"token_states": 20.4, "reservation": 13.3, "internal_frag": 57.3, "other": 8.9},
    "orca-pow2": {"token_states": 26.8, "reservation": 17.9, "internal_frag": 13.6, "other": 41.6},
    "orca-oracle": {"token_states": 38.2, "reservation": 25.2, "internal_frag": 0.0, "other": 36.6},
    "paged": {"token_states": 96.3, "reservation": 1.0, "internal_frag": 1.0, "other": 1.6},
}

# Figure 13: mean batched requests, ShareGPT at 2 req/s and Alpaca at 30 req/s.
FIG13_BATCHED = {
    "sharegpt-paper": {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "paged": 30.42},
    "alpaca-paper": {"orca-max": 7.00, "orca-pow2": 43.24, "orca-oracle": 72.75, "paged": 132.44},
}
FIG13_RATE = {"sharegpt-paper": 2.0, "alpaca-paper": 30.0}

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
# Figure 19 end to end (section 7.3's text): at block sizes 16-64 recompute and swap perform
# comparably; small blocks make swapping slow (its per-preemption cost above recompute's)
FIG19_COMPARABLE_BLOCK_SIZES = (16, 32, 64)

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

# Table 1: the KV cache the paper's servers left, GiB, where it reproduces the table's slot count
# (and, for OPT-13B, Figure 2's 8.9 % left over by Orca (Max): floor(15,728 / 2048) = 7 requests).
# (model, GPU, GPUs) -> GiB. OPT-66B's 21 GB gives 9,557 slots, not the table's 9.7K: not used.
TABLE1_KV_GIB = {("opt-13b", "a100-40gb", 1): 12, ("opt-175b", "a100-80gb", 8): 264}
