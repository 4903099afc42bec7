"""What kvbench sees of an external engine, turned into the same results as its own engines.

An external engine is watched from outside: for each request, when its computation started,
when each output token reached the host, and the token ids. From those, `build_result` makes
kvbench `Sequence`s (so requests.csv and the latency metrics are computed by the same code as
for every engine) and the time integrals it can honestly compute: busy time, batched requests,
and the part of the run during which some request waited. The KV occupancy categories are not
observable from outside, so the summary leaves them absent (`occupancy: {}`), never zero.

Time is the run's clock, as for kvbench's engines: seconds on the trace's time axis, starting at
0, jumping over idle gaps (nothing in flight, next arrival in the future) instead of sleeping
through them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from kvbench.config import Prepared
from kvbench.engine import EngineRun, OccupancyTotals, StepRecord
from kvbench.metrics.occupancy import Footprint
from kvbench.metrics.summary import request_record, summarize
from kvbench.requests import Request
from kvbench.sequence import Sequence
from kvbench.simulate import RunResult

_NO_FOOTPRINT = Footprint(0.0, 0.0, 0.0, 0.0, 0.0)  # occupancy is not observed
_NOTHING = OccupancyTotals(_NO_FOOTPRINT, 0.0, 0.0)


class RunClock:
    """The run's clock: wall time since the start, plus the idle gaps jumped over."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.offset = 0.0  # seconds jumped so far

    def now(self) -> float:
        return time.perf_counter() - self.start + self.offset

    def of(self, perf: float, offset: float) -> float:
        """A `time.perf_counter()` reading taken while the offset was `offset`, on the run's clock."""
        return perf - self.start + offset

    def jump_to(self, t: float) -> None:
        """Idle until `t`: move the clock there without waiting (only when nothing is in flight)."""
        self.offset += max(0.0, t - self.now())


@dataclass(frozen=True)
class Observed:
    """One request as an external engine served it (times on the run's clock)."""

    request: Request
    admitted_s: float  # its computation started (left the queue)
    held_until_s: float  # it left the batch (static batches hold finished requests until the end)
    token_times: np.ndarray  # (output_len,) when each output token reached the host
    output_ids: list[int]


def as_sequence(obs: Observed) -> Sequence:
    """A finished kvbench `Sequence` with the observed admission, token times and ids."""
    seq = Sequence(obs.request)
    times, ids = obs.token_times, obs.output_ids
    seq.advance(1, float(times[0]), obs.admitted_s, ids[:1], times[:1])  # the first token sets TTFT
    if len(times) > 1:
        seq.advance(len(times) - 1, float(times[-1]), None, ids[1:], times[1:])
    return seq


def integrals(observed: list[Observed]) -> tuple[OccupancyTotals, OccupancyTotals, int]:
    """Busy and saturated (someone waits) seconds with their running-request integrals, and the
    peak number of requests in flight; from each request's arrival, admission and exit."""
    arrival = np.sort([o.request.arrival_s for o in observed])  # (N,)
    admitted = np.sort([o.admitted_s for o in observed])  # (N,)
    left = np.sort([o.held_until_s for o in observed])  # (N,)
    edges = np.unique(np.concatenate([arrival, admitted, left]))  # every change of state is at one
    lo, width = edges[:-1], np.diff(edges)  # (E - 1,) segments [lo, lo + width)

    def count(times: np.ndarray) -> np.ndarray:  # (E - 1,) how many of `times` are <= each lo
        return np.searchsorted(times, lo, side="right")

    running = count(admitted) - count(left)  # in flight during each segment
    busy = running > 0
    saturated = busy & (count(arrival) > count(admitted))  # someone arrived and waits
    return (
        OccupancyTotals(_NO_FOOTPRINT, float(width[busy].sum()), float((running * width)[busy].sum())),
        OccupancyTotals(
            _NO_FOOTPRINT, float(width[saturated].sum()), float((running * width)[saturated].sum())
        ),
        int(running.max(initial=0)),
    )


def build_result(
    prepared: Prepared, observed: list[Observed], *, steps: tuple[StepRecord, ...] = (),
    num_slots: int | None = None, kv_source: str | None = None, preemptions_observed: bool = True,
    extra: dict,
) -> RunResult:  # fmt: skip
    """The run's `RunResult`: requests.csv rows, summary.json (`external: true`), observed steps.

    `num_slots`: the engine's KV capacity in token slots, if it has a fixed one (`kv_source` says
    what sized it)."""
    config = prepared.config
    observed = sorted(observed, key=lambda o: o.request.request_id)
    seqs = tuple(as_sequence(o) for o in observed)
    busy, saturated, peak = integrals(observed)
    run = EngineRun(seqs, steps, num_slots or 0, busy, saturated, peak)
    records = [request_record(seq) for seq in seqs]
    # summarize without integrals (it would split an unobserved footprint into categories), then
    # put back what was observed
    summary = summarize(
        replace(run, busy=_NOTHING, saturated=_NOTHING),
        records,
        percentiles=config.percentiles,
        slo=config.slo,
    )
    summary.update(
        busy_s=busy.seconds,
        saturated_s=saturated.seconds,
        num_steps=sum(row.num_steps for row in steps) if steps else None,
        mean_batched_requests=busy.running_seconds / busy.seconds if busy.seconds else 0.0,
        mean_batched_requests_saturated=sat_mean(saturated),
        peak_batched_requests=peak,
        num_slots=num_slots,
        occupancy={},
        occupancy_saturated={},
    )
    if not preemptions_observed:
        summary.update(num_preemptions=None, preempted_requests=None)
        records = [replace(record, num_preemptions=None) for record in records]
    summary = {
        "engine": config.engine,
        "model": config.model,
        "trace": prepared.trace.name,
        "trace_source": prepared.trace.source,
        "mode": "real",
        "external": True,
        "kv_budget_bytes": num_slots * prepared.model.kv_bytes_per_token if num_slots else None,
        "kv_budget_source": kv_source,  # None: the engine's cache grows as it likes (generate)
        "kv_bytes_per_token": prepared.model.kv_bytes_per_token,
        **extra,
        **summary,
    }
    return RunResult(prepared, run, records, summary)


def sat_mean(saturated: OccupancyTotals) -> float | None:
    return saturated.running_seconds / saturated.seconds if saturated.seconds else None
