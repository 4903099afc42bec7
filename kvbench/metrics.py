"""Per-request and per-run metrics, the same for simulated and real runs.

Definitions (vLLM's benchmark): TTFT = first token - arrival; E2EL = finish - arrival;
TPOT = (E2EL - TTFT) / (output_len - 1); queueing delay = first scheduled - arrival.
Normalized latency (the paper's metric) = mean over requests of E2EL / output_len.
Occupancy and batched requests are time-weighted over the *busy* part of the run (time
spent in steps; idle gaps between arrivals do not count), and again over its *saturated*
part (steps during which some request waited), which is the paper's Figure 2 setting.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from kvbench.engine import EngineRun, OccupancyTotals
from kvbench.occupancy import categories
from kvbench.sequence import Sequence


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One row of requests.csv."""

    request_id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    admitted_s: float
    first_token_s: float
    finish_s: float
    num_preemptions: int
    queueing_s: float
    ttft_s: float
    tpot_s: float  # NaN for one-token outputs (no time per output token), left out of means
    e2el_s: float
    normalized_latency_s: float  # E2EL / output_len


def request_record(seq: Sequence) -> RequestRecord:
    r = seq.request
    assert seq.finish_s is not None and seq.first_token_s is not None and seq.admitted_s is not None
    e2el = seq.finish_s - r.arrival_s
    ttft = seq.first_token_s - r.arrival_s
    tpot = (e2el - ttft) / (r.output_len - 1) if r.output_len > 1 else float("nan")  # undefined
    return RequestRecord(
        r.request_id,
        r.arrival_s,
        r.prompt_len,
        r.output_len,
        seq.admitted_s,
        seq.first_token_s,
        seq.finish_s,
        seq.num_preemptions,
        seq.admitted_s - r.arrival_s,
        ttft,
        tpot,
        e2el,
        e2el / r.output_len,
    )


def occupancy_fractions(totals: OccupancyTotals, num_slots: int) -> dict[str, float]:
    """Time-weighted mean fraction of the arena in each category (sums to 1)."""
    if totals.seconds == 0:
        return {}
    capacity = num_slots * totals.seconds
    return {k: v / capacity for k, v in categories(totals.footprint, capacity).items()}


def _mean(values: list[float]) -> float:
    """Mean of the defined values (NaN marks an undefined metric, e.g. TPOT of one token)."""
    defined = [v for v in values if v == v]
    return statistics.fmean(defined) if defined else float("nan")


def summarize(run: EngineRun, done: list[RequestRecord]) -> dict:
    """The run-level numbers of summary.json (engine and model names are added by the caller)."""
    start = min((r.arrival_s for r in done), default=0.0)
    makespan = max((r.finish_s for r in done), default=0.0) - start
    output_tokens = sum(r.output_len for r in done)
    prompt_tokens = sum(r.prompt_len for r in done)
    busy, sat = run.busy, run.saturated
    return {
        "num_requests": len(run.sequences),
        "completed": len(done),
        "makespan_s": makespan,
        "busy_s": busy.seconds,
        "saturated_s": sat.seconds,
        "num_steps": sum(row.num_steps for row in run.steps),
        "request_throughput": len(done) / makespan if makespan else 0.0,
        "output_token_throughput": output_tokens / makespan if makespan else 0.0,
        "total_token_throughput": (prompt_tokens + output_tokens) / makespan if makespan else 0.0,
        "mean_batched_requests": busy.running_seconds / busy.seconds if busy.seconds else 0.0,
        "mean_batched_requests_saturated": sat.running_seconds / sat.seconds if sat.seconds else None,
        "peak_batched_requests": run.peak_running,
        "normalized_latency_s": _mean([r.normalized_latency_s for r in done]),
        "mean_ttft_s": _mean([r.ttft_s for r in done]),
        "mean_tpot_s": _mean([r.tpot_s for r in done]),
        "mean_e2el_s": _mean([r.e2el_s for r in done]),
        "mean_queueing_s": _mean([r.queueing_s for r in done]),
        "num_preemptions": sum(r.num_preemptions for r in done),
        "preempted_requests": sum(r.num_preemptions > 0 for r in done),
        "num_slots": run.num_slots,
        "occupancy": occupancy_fractions(busy, run.num_slots),
        "occupancy_saturated": occupancy_fractions(sat, run.num_slots),
    }
