"""A long prompt's prefill on the H200, priced linearly and with a price per query-key pair.

    KVBENCH_TRACE_DIR=../shared/traces PYTHONPATH=. python results/reference/prefill-pairs-llama/make.py

The real Llama-3.1-8B runs of results/reference/mooncake-window-real (the first 30 s of Mooncake's
conversations, unfiltered, on an H200) prefilled prompts of 1,902 to 28,214 tokens alone in a
step. Each such step (steps.csv: kind prefill, batch_size 1; no prefix, no preemption in these
runs) scores t (t + 1) / 2 query-key pairs for a prompt of t tokens in every layer (all 32 are
full attention). Two step-time forms are fitted, with the relative objective of `kvbench
calibrate` (non-negative least squares of each step's error relative to its duration), on
paged's steps, and checked on orca-oracle's (held out: other requests' prompts):

    linear:  fixed + per_token x t              (what the cost model fitted until the pair term)
    pairs:   fixed + per_token x t + per_pair x t (t + 1) / 2

Writes table.md beside this file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.calibrate.fit import _nnls
from kvbench.results.files import write_text
from kvbench.results.load import load_run

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent / "mooncake-window-real" / "cells"


def single_prompt_steps(engine: str) -> pd.DataFrame:
    (cell,) = RUNS.glob(f"{engine}__*")
    steps = load_run(cell).steps
    return steps[(steps.kind == "prefill") & (steps.batch_size == 1)].sort_values("num_tokens")


def columns(steps: pd.DataFrame, pairs: bool) -> np.ndarray:
    t = steps.num_tokens.to_numpy(dtype=np.float64)  # [R] prompt tokens
    parts = [np.ones_like(t), t] + ([t * (t + 1) / 2] if pairs else [])
    return np.column_stack(parts)  # [R, 2 or 3]


def fit(steps: pd.DataFrame, pairs: bool) -> np.ndarray:
    d = steps.duration_s.to_numpy()
    a = columns(steps, pairs)
    constants, _ = _nnls(a / d[:, None], np.ones_like(d))  # each step's error relative to itself
    return constants


def main() -> None:
    fitted, held = single_prompt_steps("paged"), single_prompt_steps("orca-oracle")
    forms = {"linear": fit(fitted, False), "pairs": fit(fitted, True)}
    lines = [
        "| form | fixed ms | us a token | ns a pair | fitted steps: median / largest error"
        " | held-out steps: median / largest error |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    errors = {}
    for name, constants in forms.items():
        cells = []
        for steps in (fitted, held):
            predicted = columns(steps, name == "pairs") @ constants
            error = predicted / steps.duration_s.to_numpy() - 1  # [R]
            errors[name, len(steps)] = error
            cells.append(f"{100 * np.median(np.abs(error)):.1f} % / {100 * np.abs(error).max():.1f} %")
        pair = f"{1e9 * constants[2]:.3f}" if name == "pairs" else "-"
        fixed, token = f"{1e3 * constants[0]:.2f}", f"{1e6 * constants[1]:.2f}"
        lines.append(f"| {name} | {fixed} | {token} | {pair} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        f"Every step ({len(fitted)} fitted, paged; {len(held)} held out, orca-oracle), measured and"
        " predicted:",
        "",
        "| engine | prompt tokens | measured ms | us a token | linear: predicted ms | pairs: predicted ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for engine, steps in (("paged", fitted), ("orca-oracle", held)):
        linear = columns(steps, False) @ forms["linear"]
        paired = columns(steps, True) @ forms["pairs"]
        for row, lin, par in zip(steps.itertuples(), linear, paired, strict=True):
            lines.append(
                f"| {engine} | {row.num_tokens:,} | {1e3 * row.duration_s:.1f} |"
                f" {1e6 * row.duration_s / row.num_tokens:.1f} | {1e3 * lin:.1f} | {1e3 * par:.1f} |"
            )
    write_text(HERE / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
