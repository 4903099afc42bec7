"""The demo job: every engine on the paper's setting, side by side with the paper.

Simulated (the default on a machine without a GPU): OPT-13B, a 12 GiB KV budget (the paper's
A100-40GB), the `sharegpt-paper` trace at the paper's Figure 13 rate (2 req/s, which saturates
every contiguous engine), step times from the roofline cost model.

Real (on a CUDA GPU): the same comparison with real decoding, made small enough to take about
two minutes: OPT-1.3B with a 3 GiB KV arena, which holds 16,384 token slots like the paper's
OPT-13B / 12 GiB (15,728), so the engines batch about as the paper's did; the rate is raised to
64 req/s because a 1.3B model on a modern GPU decodes far faster than OPT-13B on an A100, and
the contiguous engines must still be saturated for the comparison to mean anything (at 8 req/s
on the H200 only static was; at 64 req/s every contiguous engine is past its sustained rate in
`results/reproduce/quick-real-opt-1.3b/fig12`).

Occupancy is time-weighted over each run's saturated part (steps during which a request
waited for admission), the setting of the paper's Figure 2.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.config import RunConfig
from kvbench.metrics.occupancy import PAPER_OTHER
from kvbench.paper import FIG2_OCCUPANCY, FIG13_BATCHED, FIG13_RATE, PAPER_NAMES
from kvbench.report.format import percent, significant
from kvbench.report.tables import markdown_table
from kvbench.results.files import write_json, write_run_atomically, write_text
from kvbench.results.outputs import prepare_outs
from kvbench.simulate import simulate, write_result
from kvbench.sweep.cell import config_differences
from workloads.spec import WorkloadSpec

DEMO_ENGINES = ("static", "orca-max", "orca-pow2", "orca-oracle", "paged")


@dataclass(frozen=True)
class DemoRow:
    engine: str
    batched: float  # mean running requests over busy time (the paper's Figure 13 average)
    saturated_share: float  # fraction of busy time with a request waiting
    normalized_latency_s: float
    occupancy: dict[str, float]  # percent, Figure 2 grouping


def _row(s: dict) -> DemoRow:
    """A run's row of the side-by-side table, from its summary (in memory or summary.json).

    Occupancy is the saturated-weighted one (the paper's Figure 2 setting); a run in which no
    request ever waited has none, and its cells are NaN (shown "-"), never the busy-weighted
    figure in its place.
    """
    saturated = s["occupancy_saturated"]
    occ = saturated or dict.fromkeys(("token_states", "reservation", "internal_frag"), math.nan)
    other = sum(occ.get(c, 0.0) for c in PAPER_OTHER) if saturated else math.nan
    grouped = {
        "token_states": occ["token_states"],
        "reservation": occ["reservation"],
        "internal_frag": occ["internal_frag"],
        "other": other,
    }
    batched = s["mean_batched_requests"]
    return DemoRow(
        s["engine"],
        batched,
        s["saturated_s"] / s["busy_s"],
        s["normalized_latency_s"],
        {k: 100 * v for k, v in grouped.items()},
    )


def run_engine(config: RunConfig, out: Path, real: bool, reuse: Sequence[Path] = ()) -> DemoRow:
    """One engine's run written to `out`, as a row of the side-by-side table (`run_summary`)."""
    return _row(run_summary(config, out, real, reuse))


def run_summary(config: RunConfig, out: Path, real: bool, reuse: Sequence[Path] = ()) -> dict:
    """One run written to `out`; its summary.

    Shared by the demo and `kvbench reproduce` (Figures 2, 13 and 15), so all read a run alike.
    A finished run of exactly this config in a `reuse` folder (`out` itself included) is read,
    not rerun: an interrupted `kvbench reproduce` resumes, and figures that share runs pay for
    them once. The demo reuses nothing: it measures.
    """
    for folder in reuse:
        if (folder / "summary.json").is_file() and not config_differences(config, folder):
            if folder != out:  # whole or not at all, like a run written here
                write_run_atomically(out, functools.partial(_copy_into, folder))
            return json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    if real:
        from kvbench.real.run import run_real

        result = run_real(config)
    else:
        result = simulate(config)
    write_result(result, out)
    return result.summary


def _copy_into(source: Path, folder: Path) -> None:
    """The source run's bytes, at the time they are written here (`shutil.copy`, not `copy2`):
    whatever picks a call's new files by time (tools/device_call.sh) must see a copy as new."""
    shutil.copytree(source, folder, copy_function=shutil.copy, dirs_exist_ok=True)


REAL = {"model": "opt-1.3b", "kv_cache_gib": 3.0, "rate": 64.0}  # see the module docstring


def run_demo(
    out: Path, num_requests: int = 1000, seed: int = 0, trace: str = "sharegpt-paper", real: bool = False
) -> list[DemoRow]:
    """Every engine into `out/<engine>`, then demo.json and demo.md; a previous demo there is
    replaced (`kvbench.results.outputs`), anything else refused before the first run: the folder,
    each engine's run folder and the report's."""
    engines = [(out / engine, "run", True) for engine in DEMO_ENGINES]
    prepare_outs((out, "demo", False), *engines, (out / "report", "report", False))
    rows = []
    for engine in DEMO_ENGINES:
        if real:
            workload = WorkloadSpec(trace, num_requests=num_requests, seed=seed, rate=REAL["rate"])
            config = RunConfig(
                engine=engine, model=REAL["model"], workload=workload, kv_cache_gib=REAL["kv_cache_gib"],
                device="cuda",
            )  # fmt: skip
        else:
            workload = WorkloadSpec(trace, num_requests=num_requests, seed=seed, rate=FIG13_RATE[trace])
            config = RunConfig(engine=engine, workload=workload, kv_cache_gib=12.0)
        rows.append(run_engine(config, out / engine, real))
    write_json(out / "demo.json", {"rows": [row.__dict__ for row in rows]})
    write_text(out / "demo.md", format_table(rows, trace) + "\n")
    return rows


def _pair(ours: float, paper: float | None) -> str:
    """kvbench's number beside the paper's, both with the one decimal the paper gives."""
    mine = "  -  " if math.isnan(ours) else f"{ours:5.1f}"
    return f"{mine} ({paper:5.1f})" if paper is not None else f"{mine} (   - )"


def table_cells(rows: list[DemoRow], trace: str = "sharegpt-paper") -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the side-by-side table: kvbench's number, the paper's in parentheses.

    One set of cells for demo.md (`format_table`) and the terminal (`kvbench.report.format`).
    """
    header = [
        "engine", "paper name", "batched req.", "token states %", "reservation %", "internal frag. %",
        "ext. frag. & other %", "saturated %", "norm. latency s/tok",
    ]  # fmt: skip
    body = []
    for row in rows:
        fig2 = FIG2_OCCUPANCY.get(row.engine, {})
        paper_batched = FIG13_BATCHED.get(trace, {}).get(row.engine)
        body.append([
            row.engine,
            PAPER_NAMES.get(row.engine, "-"),
            _pair(row.batched, paper_batched),
            *(
                _pair(row.occupancy[k], fig2.get(k))
                for k in ("token_states", "reservation", "internal_frag", "other")
            ),
            percent(row.saturated_share),
            significant(row.normalized_latency_s),
        ])  # fmt: skip
    return header, body


def format_table(rows: list[DemoRow], trace: str = "sharegpt-paper") -> str:
    """Markdown table: kvbench's number, the paper's in parentheses."""
    return markdown_table(*table_cells(rows, trace))
