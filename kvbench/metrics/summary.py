"""Per-request and per-run metrics, the same for simulated and real runs.

Definitions (vLLM's benchmark): TTFT = first token - arrival; E2EL = finish - arrival;
TPOT = (E2EL - TTFT) / (output_len - 1); ITL = the gaps between a request's consecutive
tokens (output_len - 1 of them; their mean is the request's TPOT, their maximum shows a
stall such as a preemption); queueing delay = first scheduled - arrival. Normalized latency
(the paper's metric) = mean over requests of E2EL / output_len.

Run distributions: TTFT, TPOT, E2EL and queueing delay are one value per request; ITL pools
every gap of every request, so it is weighted by tokens where TPOT is weighted by requests
(as vLLM reports them). Each gets mean, median, standard deviation (population, as numpy's
default) and the asked percentiles (numpy's linear interpolation). Goodput counts the
completed requests meeting *every* given SLO, per second of makespan.

Occupancy and batched requests are time-weighted over the *busy* part of the run (time
spent in steps; idle gaps between arrivals do not count), and again over its *saturated*
part (steps during which some request waited), which is the paper's Figure 2 setting.

A request with several outputs (parallel samples, beams) is one row: it finishes with its last
output (E2EL, TPOT), its first token and inter-token gaps are its leader's (every output's
first token comes from the same prefill), and each sample's tokens count as output tokens (a
beam search returns one output). `sharing_saved_fraction` is the paper's Fig. 15 measure:
slots saved by sharing over the slots the sequences would hold without it, time-weighted.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from kvbench.engine import EngineRun, OccupancyTotals
from kvbench.errors import KvbenchError
from kvbench.flag_ranges import check_distinct
from kvbench.metrics.latency import ItlTable, distribution, percentile_key
from kvbench.metrics.occupancy import categories
from kvbench.sequence import Sequence

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in seconds (`--slo ttft=0.5,tpot=0.05`); None: not asked for.

    A request meets the SLO when each given metric is at most its bound. A one-token output
    has no TPOT and so cannot miss a TPOT objective (vLLM counts its TPOT as 0).
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None

    def given(self) -> dict[str, float]:
        """The objectives asked for, by summary key (`ttft_s`, ...)."""
        bounds = {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2el_s": self.e2el_s}
        return {key: bound for key, bound in bounds.items() if bound is not None}

    def met_by(self, record: RequestRecord) -> bool:
        # NaN (undefined TPOT) compares false with `>`, so it never misses
        return not any(getattr(record, key) > bound for key, bound in self.given().items())


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
    max_itl_s: float  # longest gap between two consecutive tokens; NaN for one-token outputs
    prefix_hit_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    num_outputs: int = 1  # outputs returned: n parallel samples, 1 for beam search


def inter_token_latencies(token_times: np.ndarray) -> np.ndarray:
    """(n - 1,) gaps between consecutive token times (n,)."""
    return np.diff(token_times)


def request_record(seq: Sequence, max_itl: float | None = None) -> RequestRecord:
    """The request's row; `max_itl` is its longest inter-token gap if already known."""
    r = seq.request
    assert seq.finish_s is not None and seq.first_token_s is not None and seq.admitted_s is not None
    if max_itl is None:
        itl = inter_token_latencies(seq.token_times)
        max_itl = float(itl.max()) if len(itl) else math.nan
    finish, preemptions, outputs = seq.finish_s, seq.num_preemptions, 1
    if seq.group is not None:  # done with the last output; beams are preempted together
        finish = max(member.finish_s for member in seq.group.members)
        outputs = 1 if seq.group.beam else seq.group.width
        if not seq.group.beam:
            preemptions = sum(member.num_preemptions for member in seq.group.members)
    e2el = finish - r.arrival_s
    ttft = seq.first_token_s - r.arrival_s
    tpot = (e2el - ttft) / (r.output_len - 1) if r.output_len > 1 else math.nan  # undefined
    return RequestRecord(
        r.request_id,
        r.arrival_s,
        r.prompt_len,
        r.output_len,
        seq.admitted_s,
        seq.first_token_s,
        finish,
        preemptions,
        seq.admitted_s - r.arrival_s,
        ttft,
        tpot,
        e2el,
        e2el / r.output_len,
        max_itl,
        seq.num_cached_tokens,
        outputs,
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
    return statistics.fmean(defined) if defined else math.nan


def goodput(done: Seq[RequestRecord], slo: Slo, makespan: float) -> dict:
    """Requests per second meeting every given SLO, and their share of the completed requests."""
    good = sum(slo.met_by(r) for r in done)
    return {
        "slo": slo.given(),
        "good_requests": good,
        "goodput": good / makespan if makespan else 0.0,
        "goodput_fraction": good / len(done) if done else math.nan,
    }


def latency_summary(
    done: Seq[RequestRecord],
    itls: ItlTable,
    makespan: float,
    percentiles: Seq[float] = DEFAULT_PERCENTILES,
    slo: Slo = Slo(),
) -> dict:
    """Latency distributions and goodput of a table of requests and their pooled ITLs."""
    out = {
        "percentiles": list(percentiles),
        "normalized_latency_s": _mean([r.normalized_latency_s for r in done]),
    }
    out.update(distribution("ttft_s", [r.ttft_s for r in done], percentiles))
    out.update(distribution("tpot_s", [r.tpot_s for r in done], percentiles))
    out.update(distribution("itl_s", itls.values, percentiles, itls.counts))
    out.update(distribution("e2el_s", [r.e2el_s for r in done], percentiles))
    out.update(distribution("queueing_s", [r.queueing_s for r in done], percentiles))
    if slo.given():
        out.update(goodput(done, slo, makespan))
    return out


def summarize(
    run: EngineRun,
    done: list[RequestRecord],
    itls: ItlTable | None = None,
    *,
    percentiles: Seq[float] = DEFAULT_PERCENTILES,
    slo: Slo = Slo(),
    hits_by_group: Mapping[str, int] | None = None,
) -> dict:
    """The run-level numbers of summary.json (engine and model names are added by the caller).

    `itls`: the run's inter-token latencies (`ItlTable.of(run.sequences)`), if already built.
    `hits_by_group`: an allocator caching per KV group (`hybrid-prefix`, `jenga-prefix`): the
    tokens each group reused for the completed requests (`prefix_hits_by_group`).
    """
    start = min((r.arrival_s for r in done), default=0.0)
    makespan = max((r.finish_s for r in done), default=0.0) - start
    output_tokens = sum(r.output_len * r.num_outputs for r in done)
    prompt_tokens = sum(r.prompt_len for r in done)
    itls = ItlTable.of(run.sequences) if itls is None else itls
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
        **latency_summary(done, itls, makespan, percentiles, slo),
        **prefix_cache_summary(done, hits_by_group),
        "num_preemptions": sum(r.num_preemptions for r in done),
        "preempted_requests": sum(r.num_preemptions > 0 for r in done),
        "num_slots": run.num_slots,
        "occupancy": occupancy_fractions(busy, run.num_slots),
        "occupancy_saturated": occupancy_fractions(sat, run.num_slots),
        "sharing_saved_fraction": sharing_saved_fraction(busy),
        "sharing_saved_fraction_saturated": sharing_saved_fraction(sat),
    }


def sharing_saved_fraction(totals: OccupancyTotals) -> float:
    """Slots saved by sharing / slots held without sharing, time-weighted (the paper's Fig. 15).

    Without sharing every sequence would hold its own copy of what it maps, so the slots held
    would be the slots held now plus those saved. 0 without sharing (or without steps).
    """
    without = totals.footprint.granted + totals.saved
    return totals.saved / without if without else 0.0


def prefix_cache_summary(done: Seq[RequestRecord], hits_by_group: Mapping[str, int] | None = None) -> dict:
    """Prompt tokens served from the prefix cache at first admission, and their share of all.

    Only full blocks are cached, so the hit tokens are whole blocks; a re-admission after a
    recompute preemption finding its own blocks is not counted (it is not reuse between
    requests). 0 for engines without a prefix cache.

    `prefix_hit_tokens_by_group` (allocators with a cache per KV group): the tokens each group
    reused. A full-attention group's equal `prefix_hit_tokens`; a sliding-window group's are the
    hit blocks inside its window only (the ones below it it never reads, nor takes).
    """
    prompt = sum(r.prompt_len for r in done)
    hits = sum(r.prefix_hit_tokens for r in done)
    out = {"prefix_hit_tokens": hits, "prefix_cache_hit_rate": hits / prompt if prompt else 0.0}
    if hits_by_group is not None:
        out["prefix_hit_tokens_by_group"] = dict(hits_by_group)
    return out


def check_metric_options(percentiles: Seq[float], slo: Slo) -> None:
    """Refuse percentiles outside (0, 100] and objectives that are not positive seconds."""
    if not percentiles:
        raise KvbenchError("--percentiles needs at least one value in (0, 100]")
    for p in percentiles:
        if not 0 < p <= 100:  # NaN fails too
            raise KvbenchError(f"--percentiles must be in (0, 100], got {p:g}")
    for key, bound in slo.given().items():
        if not (math.isfinite(bound) and bound > 0):
            raise KvbenchError(
                f"--slo {key.removesuffix('_s')} must be a positive number of seconds, got {bound}"
            )


def parse_percentiles(text: str) -> tuple[float, ...]:
    """`--percentiles 50,90,99.9` -> (50.0, 90.0, 99.9), sorted; a value given twice is refused."""
    values = []
    for item in text.split(","):
        try:
            values.append(float(item))
        except ValueError:
            raise KvbenchError(f"--percentiles: {item.strip()!r} is not a number (e.g. 50,90,99)") from None
    check_distinct("--percentiles", [item.strip() for item in text.split(",")], float)
    keys: dict[str, float] = {}
    for value in values:  # two percentiles one summary key would name: one would overwrite the other
        key = percentile_key(value)
        if key in keys:
            raise KvbenchError(
                f"--percentiles: {keys[key]:.10g} and {value:.10g} both name the {key} columns (a percentile "
                "is named to 6 significant digits): give percentiles that differ within them"
            )
        keys[key] = value
    percentiles = tuple(sorted(values))
    check_metric_options(percentiles, Slo())
    return percentiles


def parse_slo(text: str | None) -> Slo:
    """`--slo ttft=0.5,tpot=0.05,e2el=20` (seconds) -> Slo; None or "" -> no objectives."""
    if not (text or "").strip():
        return Slo()
    bounds: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep:
            raise KvbenchError(
                f"--slo: expected metric=seconds ({', '.join(SLO_METRICS)}), got {item.strip()!r}"
            )
        if name not in SLO_METRICS:
            raise KvbenchError(f"--slo: unknown metric {name!r}; choose from {', '.join(SLO_METRICS)}")
        if name in bounds:
            raise KvbenchError(f"--slo: {name} is given twice")
        try:
            bounds[name] = float(value)
        except ValueError:
            raise KvbenchError(f"--slo {name}: {value!r} is not a number of seconds") from None
    slo = Slo(**{f"{name}_s": bound for name, bound in bounds.items()})
    check_metric_options(DEFAULT_PERCENTILES, slo)
    return slo


def format_slo(slo: Slo) -> str:
    """The `--slo` text that parses back to `slo` ("" for none)."""
    return ",".join(f"{key.removesuffix('_s')}={bound!r}" for key, bound in slo.given().items())
