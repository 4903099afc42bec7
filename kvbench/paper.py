"""The PagedAttention paper's numbers that kvbench puts beside its own (PAPER.md).

Kwon et al., SOSP 2023, OPT-13B on one A100-40GB with a 12 GB KV cache; values read off
the figures' bar labels.
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
