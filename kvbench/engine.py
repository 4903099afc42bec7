"""The engine loop shared by every engine: admit arrivals -> schedule -> run -> update -> record.

An engine is an allocator x scheduler pair (see `engines/`) driving a `Runner`. The loop
reads as the numbered steps below; everything engine-specific sits behind the scheduler.

Multi-step segments: a decode batch stays the same until a sequence finishes, a paged
sequence cannot get a block, or an arrival could be admitted. Up to that horizon the
loop lets a runner that can predict step times (the simulator) run many steps in one
call and writes one row for them (`num_steps`); occupancy is integrated exactly over the
segment (`kvbench.occupancy.segment_integral`), so results equal a step-by-step run's.
A GPU runner runs one step per call, as does the loop with `coalesce=False`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engines.scheduler import Scheduler
from kvbench.errors import KvbenchError
from kvbench.occupancy import Footprint, categories, segment_integral
from kvbench.requests import Trace
from kvbench.runner import Runner
from kvbench.sequence import Sequence

_ZERO = Footprint(0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One row of steps.csv: `num_steps` consecutive steps of one batch (1 in real runs)."""

    step: int  # index of the row's first step
    num_steps: int
    start_s: float
    duration_s: float
    kind: str  # "prefill" | "decode"
    batch_size: int
    num_tokens: int  # tokens fed through the model over the row's steps
    num_waiting: int  # after scheduling: requests that arrived and wait
    num_running: int  # resident, unfinished requests
    num_preempted: int  # waiting requests that lost their K/V
    # occupancy after the row's last step, in slots (sum to the arena's num_slots)
    token_states: int
    reservation: int
    internal_frag: int
    allocator_overhead: int
    external_frag: int
    free: int


@dataclass(frozen=True)
class OccupancyTotals:
    """Time integrals over a set of steps: slot-seconds per footprint total, running-seconds."""

    footprint: Footprint
    seconds: float
    running_seconds: float  # integral of the number of running requests


class _Integrator:
    """Running sums for `OccupancyTotals` (mutable, local to one run)."""

    def __init__(self) -> None:
        self.footprint = _ZERO
        self.seconds = self.running_seconds = 0.0

    def add(self, footprint: Footprint, seconds: float, running: int) -> None:
        self.footprint = self.footprint + footprint
        self.seconds += seconds
        self.running_seconds += running * seconds

    def totals(self) -> OccupancyTotals:
        return OccupancyTotals(self.footprint, self.seconds, self.running_seconds)


@dataclass(frozen=True)
class EngineRun:
    """What one engine did with one trace: sequences (final state), rows and integrals."""

    sequences: tuple[Sequence, ...]
    steps: tuple[StepRecord, ...]
    num_slots: int
    busy: OccupancyTotals  # every step
    saturated: OccupancyTotals  # steps during which a request waited
    peak_running: int


class Engine:
    """Glues a scheduler (which owns the allocator) to a runner."""

    def __init__(self, scheduler: Scheduler, runner: Runner, *, coalesce: bool = True) -> None:
        self.scheduler = scheduler
        self.allocator = scheduler.allocator
        self.runner = runner
        self.coalesce = coalesce

    def check_fits(self, trace: Trace) -> None:
        """Refuse a trace with a request that could never run, instead of waiting forever."""
        for request in trace.requests:
            if not self.allocator.can_ever_hold(request):
                raise KvbenchError(
                    f"request {request.request_id} (prompt {request.prompt_len} + output "
                    f"{request.output_len} tokens) cannot fit the KV arena of "
                    f"{self.allocator.num_slots} slots under this engine even alone; "
                    "raise --kv-cache-gib or pick a larger --emulate-gpu"
                )

    def run(self, trace: Trace) -> EngineRun:
        self.check_fits(trace)
        sched, alloc = self.scheduler, self.allocator
        seqs = tuple(Sequence(request) for request in trace.requests)
        clock, arrived, step = 0.0, 0, 0
        rows: list[StepRecord] = []
        busy, saturated = _Integrator(), _Integrator()
        peak = 0
        while arrived < len(seqs) or sched.has_work():
            # 1. admit every request that has arrived by now to the waiting queue
            while arrived < len(seqs) and seqs[arrived].request.arrival_s <= clock:
                sched.add(seqs[arrived])
                arrived += 1
            # 2. schedule one step (allocations made); idle: jump to the next arrival
            batch = sched.schedule()
            if batch is None:
                if arrived == len(seqs):
                    raise RuntimeError("scheduler stalled with work left")  # a bug, not input
                clock = seqs[arrived].request.arrival_s
                continue
            # 3. how far the batch may run unchanged, then run it
            max_steps = 1
            if self.coalesce and not batch.is_prefill:
                first_finish = min([seq.remaining for seq in batch.seqs])
                max_steps = alloc.growth_horizon(batch.seqs, first_finish)
            until = math.inf
            if arrived < len(seqs) and not sched.waiting:
                until = seqs[arrived].request.arrival_s - clock
            durations = self.runner.run(batch, max_steps, until)  # (k,) seconds
            k = len(durations)
            growth = alloc.grow(batch.seqs, k) if k > 1 else None
            num_tokens = batch.num_tokens + (k - 1) * len(batch.seqs)
            # 4. advance the sequences and measure memory before anyone leaves
            end = clock + float(durations.sum())
            finished = []
            for seq in batch.seqs:
                if seq.admitted_s is None:
                    seq.admitted_s = clock
                if seq.advance(k, end):
                    finished.append(seq)
            head = sched.waiting[0] if sched.waiting else None
            fp = alloc.footprint()
            fp = Footprint(fp.tokens, fp.target, fp.asked, fp.granted, alloc.external_frag(head))
            integral = segment_integral(fp, durations, len(batch.seqs), growth)
            running = len(sched.running)
            peak = max(peak, running)
            busy.add(integral, end - clock, running)
            if sched.waiting:
                saturated.add(integral, end - clock, running)
            rows.append(
                StepRecord(
                    step,
                    k,
                    clock,
                    end - clock,
                    "prefill" if batch.is_prefill else "decode",
                    len(batch.seqs),
                    num_tokens,
                    len(sched.waiting),
                    running,
                    sched.num_preempted,
                    *map(int, categories(fp, alloc.num_slots).values()),
                )
            )
            # 5. release the finished (per the scheduler's policy) and move the clock
            sched.update(finished)
            clock, step = end, step + k
        return EngineRun(seqs, tuple(rows), alloc.num_slots, busy.totals(), saturated.totals(), peak)
