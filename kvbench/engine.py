"""The engine loop shared by every engine: admit arrivals -> schedule -> run -> update -> record.

An engine is an allocator x scheduler pair (see `engines/`) driving a `Runner`. The loop
reads as the numbered steps below; everything engine-specific sits behind the scheduler.

Multi-step segments: a decode batch stays the same until a sequence finishes, a paged
sequence cannot get a block, or an arrival could be admitted. Up to that horizon the
loop lets a runner run many steps in one call and writes one row for them (`num_steps`);
occupancy is integrated exactly over the segment (`kvbench.metrics.occupancy.segment_integral`),
so results equal a step-by-step run's. The simulator predicts step times; a GPU runner
keeps the segment on the device and stops at the first step ending past the next arrival.
`coalesce=False` runs one step per call.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, replace
from itertools import pairwise

import numpy as np

from engines.allocator import measure
from engines.hybrid import GroupShape
from engines.scheduler import Batch, Scheduler
from engines.windows import shared_terms, window_terms
from kvbench.cost_model import KvReads
from kvbench.errors import KvbenchError
from kvbench.metrics.occupancy import Footprint, Growth, segment_integral, whole_slots, window_integral
from kvbench.requests import Trace
from kvbench.runner import Runner, step_ends
from kvbench.sequence import Sequence, group_width, sequence_for

_ZERO = Footprint(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One row of steps.csv: `num_steps` consecutive steps of one batch (1 in real runs)."""

    step: int  # index of the row's first step
    num_steps: int
    start_s: float
    duration_s: float
    kind: str  # "prefill" | "decode" | "mixed" (chunked prefill: prompt chunks beside the decodes)
    batch_size: int
    num_tokens: int  # tokens fed through the model over the row's steps
    context_tokens: int  # K/V positions attended over the row's steps (what attention reads)
    # slots of K/V read over the row's steps: context_tokens less what window layers skip, weighted
    # by their share of a slot's bytes (`kvbench.cost_model.KvReads`); = context_tokens without them
    kv_tokens_read: float
    swapped_blocks: int  # blocks copied between device and host before the row's first step
    num_waiting: int  # after scheduling: requests that arrived and wait
    num_running: int  # resident, unfinished requests
    num_preempted: int  # waiting requests that lost their K/V
    num_swapped: int  # preempted requests whose K/V waits in host memory
    # occupancy after the row's last step, in slots (sum to the arena's num_slots)
    token_states: int
    outside_window: int  # of the token states, those window layers hold older than their window
    reservation: int
    internal_frag: int
    allocator_overhead: int
    mapped_idle: int
    external_frag: int
    free: int
    # slots the sequences' mappings count beyond the distinct slots held: what sharing saves
    shared_saved: int = 0
    # vmm: driver pages mapped and unmapped since the previous row (what the cost model charges)
    mapped_pages: int = 0
    unmapped_pages: int = 0
    # prefill and mixed rows: query-key pairs their attention scores (`KvReads.pairs`); 0 for decodes
    attention_pairs: float = 0.0


@dataclass(frozen=True)
class OccupancyTotals:
    """Time integrals over a set of steps: slot-seconds per footprint total, running-seconds."""

    footprint: Footprint
    seconds: float
    running_seconds: float  # integral of the number of running requests
    saved: float = 0.0  # slot-seconds sharing saved (held without sharing = granted + saved)


class _Integrator:
    """Running sums for `OccupancyTotals` (mutable, local to one run)."""

    def __init__(self) -> None:
        self.footprint = _ZERO
        self.seconds = self.running_seconds = self.saved = 0.0

    def add(self, footprint: Footprint, seconds: float, running: int, saved: int) -> None:
        self.footprint = self.footprint + footprint
        self.seconds += seconds
        self.running_seconds += running * seconds
        self.saved += saved * seconds

    def totals(self) -> OccupancyTotals:
        return OccupancyTotals(self.footprint, self.seconds, self.running_seconds, self.saved)


@dataclass(frozen=True)
class EngineRun:
    """What one engine did with one trace: sequences (final state), rows and integrals.

    `sequences` has one per request: a request with several outputs is its group's leader
    (`seq.group.members` has them all).
    """

    sequences: tuple[Sequence, ...]
    steps: tuple[StepRecord, ...]
    num_slots: int
    busy: OccupancyTotals  # every step
    saturated: OccupancyTotals  # steps during which a request waited
    peak_running: int


class Engine:
    """Glues a scheduler (which owns the allocator) to a runner."""

    def __init__(
        self, scheduler: Scheduler, runner: Runner, *, coalesce: bool = True,
        windows: tuple[GroupShape, ...] | None = None,
    ) -> None:  # fmt: skip
        self.scheduler = scheduler
        self.allocator = scheduler.allocator
        self.runner = runner
        self.coalesce = coalesce
        # the model's KV groups, for `outside_window` (None: the allocator's own, if it has any)
        shapes = windows if windows is not None else getattr(self.allocator, "shapes", ())
        self.windows = shapes if any(s.window for s in shapes) else ()
        self.reads = KvReads.of(self.windows)  # what steps.csv's kv_tokens_read leaves out

    def check_fits(self, trace: Trace) -> None:
        """Refuse a trace with a request that could never run, instead of waiting forever."""
        arrivals = [request.arrival_s for request in trace.requests]
        if any(later < earlier for earlier, later in pairwise(arrivals)):
            raise ValueError(f"trace {trace.name}: requests must be sorted by arrival time")
        seats = self.scheduler.max_num_seqs
        for request in trace.requests:
            if group_width(request) > seats:
                raise KvbenchError(
                    f"request {request.request_id} asks for {group_width(request)} outputs (n or beam "
                    f"width), more than --max-num-seqs {seats} sequences can run at once"
                )
            if not self.allocator.can_ever_hold(request):
                outputs = f", {group_width(request)} outputs" if group_width(request) > 1 else ""
                raise KvbenchError(
                    f"request {request.request_id} (prompt {request.prompt_len} + output "
                    f"{request.output_len} tokens{outputs}) cannot fit the KV arena of "
                    f"{self.allocator.num_slots} slots under this engine even alone (after its "
                    "reservation policy and --watermark); raise --kv-cache-gib or pick a larger --emulate-gpu"
                )

    def run(self, trace: Trace) -> EngineRun:
        self.check_fits(trace)
        sched, alloc = self.scheduler, self.allocator
        log = _RunLog(trace, alloc.num_slots)
        while log.pending() or sched.has_work():
            # 1. queue every request that has arrived by now
            for seq in log.arrivals_until(log.clock):
                sched.add(seq)
            # 2. schedule one step (its allocations made); idle: jump to the next arrival
            batch = sched.schedule()
            if batch is None:
                if not log.pending():
                    raise RuntimeError("scheduler stalled with work left")  # a bug, not input
                log.clock = log.next_arrival()
                continue
            # 3. run it, for as many steps as the batch provably stays the same
            max_steps = 1
            if self.coalesce and not batch.is_prefill and sched.settled():
                max_steps = alloc.growth_horizon(batch.seqs, batch.steps_to_finish)
            until = log.next_arrival() if log.pending() and not sched.waiting else math.inf
            ahead = self.runner.allocates_ahead and max_steps > 1
            growth = alloc.grow(batch.seqs, max_steps) if ahead else None
            result = self.runner.run(batch, max_steps, log.clock, until)
            durations = result.durations  # (k,) seconds
            k = len(durations)
            skipped = float(self.reads.skipped(batch, k).sum())  # before the sequences advance
            pairs = self.reads.pairs(batch)  # a prefill's query-key pairs (0 for decodes), likewise
            if not ahead and k > 1:
                growth = alloc.grow(batch.seqs, k)
            alloc.trim(k)  # give back what steps past k would have used; the rest is final
            if ahead and growth is not None:
                growth = Growth(growth.asked[:k], growth.target[:k])
            # 4. advance the sequences, then measure memory before anyone leaves
            ends = step_ends(log.clock, durations)  # (k,) as a step-by-step clock would read
            end = float(ends[-1])
            tokens = result.tokens or [None] * len(batch.seqs)
            if batch.chunks is None:
                finished = [
                    seq
                    for seq, ids in zip(batch.seqs, tokens, strict=True)
                    if seq.advance(k, end, log.clock, ids, ends)
                ]
            else:
                finished = _advance_chunks(batch, tokens, end, log.clock, ends)
            if batch.has_groups:  # parallel samples fork after their prompt, beams after every step
                sched.branch(batch, result.branches)
            fp = measure(alloc, sched.waiting[0] if sched.waiting else None)
            if sched.held:  # finished requests a static batch still holds: their K/V is dead weight
                # (shared slots count once in the footprint: bounded so that a shared dead prefix
                # cannot make token states negative; exact without sharing)
                dead = min(sum(seq.num_computed for seq in sched.held), fp.tokens)
                fp = replace(fp, tokens=fp.tokens - dead, target=fp.target - dead)
            fp, outside = self._outside_window(fp, batch, durations, sched)
            integral = segment_integral(fp, durations, len(batch.seqs), growth, outside)
            integral = replace(integral, outside=min(integral.outside, integral.tokens))
            # what is shared changes only between segments (forks, copy-on-write, admissions, frees)
            log.record(batch, durations, ends, fp, integral, alloc.sharing_saved(), sched, skipped, pairs)
            # 5. release the finished (per the scheduler's policy)
            sched.update(finished)
        return log.result()

    def _outside_window(
        self, fp: Footprint, batch: Batch, durations: np.ndarray, sched: Scheduler
    ) -> tuple[Footprint, float | None]:
        """`fp` with its outside-window slots, and their integral over the segment (None: constant).

        The batch's sequences computed a token every step; other running ones stood still. A
        static batch's finished sequences are left out: their tokens are no token states any
        more. A slot sequences share counts once (`shared_terms`); the caller bounds both
        by the token states.
        """
        if not self.windows:
            return fp, None
        moving = window_terms(self.allocator, self.windows, batch.seqs)
        in_batch = set(batch.seqs)
        others = [s for s in sched.running if s not in in_batch]
        still = window_terms(self.allocator, self.windows, others)
        shared = shared_terms(self.allocator, self.windows, sched.running)
        outside = min(moving.slots + still.slots + shared.slots, fp.tokens)
        fp = replace(fp, outside=outside)
        if len(durations) == 1:
            return fp, None
        if others and len(shared.scale):  # a multi-step segment is a decode of every running sequence
            raise RuntimeError("a shared block's holders did not all move through a multi-step segment")
        held = window_integral(moving.scale, moving.behind, durations)
        held += window_integral(shared.scale, shared.behind, durations)
        return fp, held + still.slots * float(durations.sum())


def _advance_chunks(batch: Batch, tokens: list, end: float, start: float, ends: np.ndarray) -> list[Sequence]:
    """Advance a mixed step's sequences (one step): a chunk short of its prompt's end only
    computes; decode rows and last chunks sample their token. Returns those that finished."""
    finished = []
    for seq, ids, samples, hi in zip(batch.seqs, tokens, batch.samples(), batch.computed_to(), strict=True):
        if not samples:
            seq.compute(hi - seq.num_computed, start)
        elif seq.advance(1, end, start, ids, ends):
            finished.append(seq)
    return finished


class _RunLog:
    """The loop's clock, arrival cursor, rows and integrals (mutable, local to one run)."""

    def __init__(self, trace: Trace, num_slots: int) -> None:
        self.seqs = tuple(sequence_for(request) for request in trace.requests)
        self.arrivals = [request.arrival_s for request in trace.requests]
        self.num_slots = num_slots
        self.clock = 0.0
        self.arrived = 0
        self.step = 0
        self.rows: list[StepRecord] = []
        self.busy, self.saturated = _Integrator(), _Integrator()
        self.peak = 0
        self.driver = (0, 0)  # the allocator's driver pages mapped and unmapped at the last row

    def pending(self) -> bool:
        return self.arrived < len(self.seqs)

    def next_arrival(self) -> float:
        return self.arrivals[self.arrived]

    def arrivals_until(self, t: float) -> tuple[Sequence, ...]:
        first, self.arrived = self.arrived, bisect_right(self.arrivals, t, lo=self.arrived)
        return self.seqs[first : self.arrived]

    def record(
        self, batch: Batch, durations: np.ndarray, ends: np.ndarray, end: Footprint, integral: Footprint,
        saved: int, sched: Scheduler, skipped: float, pairs: float,
    ) -> None:  # fmt: skip
        k, seconds = len(durations), float(ends[-1]) - self.clock
        running = len(sched.running)
        self.peak = max(self.peak, running)
        self.busy.add(integral, seconds, running, saved)
        if sched.waiting:
            self.saturated.add(integral, seconds, running, saved)
        # requests that arrived by the last step's start wait too (a step-by-step run would
        # have queued them); they cannot change the batch, see `until`
        last_start = float(ends[-2]) if k > 1 else self.clock
        late = bisect_right(self.arrivals, last_start) - self.arrived
        driver = getattr(sched.allocator, "driver_totals", (0, 0))  # vmm only
        mapped, unmapped = driver[0] - self.driver[0], driver[1] - self.driver[1]
        self.driver = driver
        context = k * batch.num_context + len(batch.seqs) * k * (k - 1) // 2
        self.rows.append(
            StepRecord(
                self.step, k, self.clock, seconds, batch.kind,
                len(batch.seqs), batch.num_tokens + (k - 1) * len(batch.seqs),
                context, context - skipped if skipped else context, len(batch.swaps),
                len(sched.waiting) + late,
                running, sched.num_preempted, len(sched.swapped),
                *whole_slots(end, self.num_slots), saved, mapped, unmapped, pairs,
            )
        )  # fmt: skip
        self.clock = float(ends[-1])
        self.step += k

    def result(self) -> EngineRun:
        return EngineRun(
            self.seqs,
            tuple(self.rows),
            self.num_slots,
            self.busy.totals(),
            self.saturated.totals(),
            self.peak,
        )
