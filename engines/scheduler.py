"""Schedulers: who runs in the next step. Two policies over one set of mechanics.

Both keep a FCFS `waiting` queue and an admission-ordered `running` list, admit from the
head of the queue only (no request overtakes an earlier one), give every running sequence
the slot its next token needs, and preempt the newest running sequence (recompute) when
the allocator cannot. They differ in *when* they admit and *when* memory comes back:

- `IterationScheduler` (Orca, vLLM): admits at any step the head fits; a step with new
  prompts runs them alone (prefill first, as the paper's vLLM); frees a sequence's memory
  the step it finishes.
- `RequestScheduler` (FasterTransformer-style static batching): admits only when idle, up
  to B earliest arrivals; the batch runs until all of them finish, and their memory is
  freed together then.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from dataclasses import dataclass

from engines.allocator import KVAllocator
from kvbench.sequence import SeqStatus, Sequence


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int | None = None  # cap on running sequences (B); None: engine default
    max_num_batched_tokens: int | None = None  # cap on prompt tokens per prefill step
    preemption: str = "recompute"  # or "swap": park a victim's blocks in host memory


@dataclass(frozen=True, slots=True)
class Batch:
    """One step's work: the sequences whose uncomputed tokens go through the model."""

    seqs: tuple[Sequence, ...]
    is_prefill: bool
    num_tokens: int  # tokens fed through the model: whole prompts, or one per sequence
    num_context: int  # K/V tokens attended (each sequence's length after the step)
    steps_to_finish: int = 1  # decode steps until the first sequence finishes
    block_copies: tuple[tuple[int, int], ...] = ()  # (src, dst) copy-on-write before the step
    # block copies between device and host, in the order they were scheduled (which matters:
    # a block freed by one swap may be taken by the next): (to_host, source block, target block)
    swaps: tuple[tuple[bool, int, int], ...] = ()


class Scheduler:
    """Shared mechanics; subclasses set the admission and release policy."""

    #: cap on tokens prefilled in one step (inf: a static batch is prefilled whole)
    token_cap: float = math.inf

    def __init__(self, allocator: KVAllocator, max_num_seqs: float, preemption: str = "recompute") -> None:
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.held: list[Sequence] = []  # finished, memory not yet returned
        self.num_preempted = 0  # waiting sequences that lost their K/V
        self.swapped: deque[Sequence] = deque()  # preempted by swapping, oldest first
        self.swap = preemption == "swap"
        self._swaps: list[tuple[bool, int, int]] = []  # copies the next batch must do first
        self._unsettled = False  # this step preempted or ended a swap-out period

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.held or self.swapped)

    def admission_open(self) -> bool:
        raise NotImplementedError

    def release(self, finished: list[Sequence]) -> None:
        """Return memory of sequences that left `running` (policy-specific)."""
        raise NotImplementedError

    def schedule(self) -> Batch | None:
        """Swap back or admit what fits (a prefill step), else grow the running (decode).

        Swapped sequences arrived before every waiting one, so nothing is admitted while any
        is swapped out (FCFS).
        """
        self._unsettled = False
        if self.swapped:
            self._bring_back()
            if not self.running:  # a drained static batch may still hold memory: free it, retry
                self.release([])
                self._bring_back()
            self._unsettled |= not self.swapped  # all back: the next step may admit again
        elif prefill := self._admit():
            return prefill
        if not self.running:
            return None
        if decode := self._make_room():
            return decode
        self.release([])  # every running sequence was preempted: start over
        return self.schedule()

    def settled(self) -> bool:
        """Whether the next steps repeat this decode batch until a finish or an arrival.

        Memory only shrinks while a decode batch runs, so a request that cannot be let in now
        cannot later. The one exception is this step itself: a preemption freed blocks after
        this step's admission check, and bringing the last swapped sequence back reopened
        admission; then ask whether the next step would let someone in.
        """
        if not self._unsettled or len(self.running) >= self.max_num_seqs:
            return True
        if self.swapped:
            return not self.allocator.can_swap_in(self.swapped[0])
        head = self.waiting[0] if self.waiting else None
        return head is None or not self.admission_open() or not self.allocator.can_allocate(head)

    def update(self, finished: list[Sequence]) -> None:
        """After a step: drop the sequences that finished in it and release their memory."""
        if finished:
            self.running = [seq for seq in self.running if seq.status is SeqStatus.RUNNING]
            self.release(finished)

    def check_integrity(self) -> None:
        """Assert the queue invariants that make "preempt the newest" FCFS-fair.

        Admission takes the queue's head and victims go back to it newest-first, so both
        `waiting` and `running` stay in arrival order, every waiter arrived after every
        running request it has not overtaken, and "newest admitted" is "latest arrived".
        """
        for queue in (list(self.waiting), self.running, list(self.swapped)):
            keys = [_arrival(seq) for seq in queue]
            assert keys == sorted(keys), "a queue is out of arrival order"
        assert all(seq.status is SeqStatus.RUNNING for seq in self.running)
        assert all(seq.status in (SeqStatus.WAITING, SeqStatus.PREEMPTED) for seq in self.waiting)
        assert all(seq.status is SeqStatus.FINISHED for seq in self.held)
        assert all(seq.status is SeqStatus.SWAPPED for seq in self.swapped)
        assert self.num_preempted == sum(seq.status is SeqStatus.PREEMPTED for seq in self.waiting)
        assert len(self.running) <= self.max_num_seqs

    def _admit(self) -> Batch | None:
        """Admit from the head of the queue while memory and caps allow: a prefill batch."""
        if not self.admission_open():
            return None
        admitted: list[Sequence] = []
        tokens = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if tokens + seq.num_tokens > self.token_cap:
                break
            if not self.allocator.can_allocate(seq):
                break
            self.waiting.popleft()
            self.num_preempted -= seq.status is SeqStatus.PREEMPTED
            self.allocator.allocate(seq)
            seq.status = SeqStatus.RUNNING
            self._run(seq)
            admitted.append(seq)
            tokens += seq.num_tokens
        return self._batch(tuple(admitted), True, tokens, tokens) if admitted else None

    def _make_room(self) -> Batch | None:
        """Give every running sequence its next slot; the decode batch, None if none remain."""
        running = self.running
        copies = self.allocator.append_all(running)
        if copies is None:
            copies = self._place_with_preemption()
        if not running:
            return None
        context = sum([seq.num_tokens for seq in running])
        shortest = min([seq.request.output_len - seq.num_generated for seq in running])
        return self._batch(tuple(running), False, len(running), context, shortest, tuple(copies))

    def _batch(self, seqs, is_prefill, num_tokens, num_context, steps=1, copies=()) -> Batch:
        """A batch carrying the swaps scheduled since the last one (they run before it)."""
        swaps = tuple(self._swaps)
        self._swaps.clear()
        return Batch(seqs, is_prefill, num_tokens, num_context, steps, copies, swaps)

    def _bring_back(self) -> None:
        """Swap in from the head of `swapped` while memory and `max_num_seqs` allow."""
        alloc = self.allocator
        while self.swapped and len(self.running) < self.max_num_seqs and alloc.can_swap_in(self.swapped[0]):
            seq = self.swapped.popleft()
            self._swaps += [(False, host, device) for host, device in alloc.swap_in(seq)]
            seq.status = SeqStatus.RUNNING
            self._run(seq)

    def _run(self, seq: Sequence) -> None:
        """Add to `running` in arrival order, so "preempt the newest" means the latest arrival.

        Usually an append; a recomputed request re-admitted after newer swapped ones came back
        is older than they are.
        """
        if not self.running or _arrival(self.running[-1]) < _arrival(seq):
            self.running.append(seq)
        else:
            insort(self.running, seq, key=_arrival)

    def _place_with_preemption(self) -> list[tuple[int, int]]:
        """Slots one by one in admission order, preempting the newest when out of room.

        `running[:placed]` have their slot; victims are taken from the end of the list
        (the newest admitted), possibly down to the sequence being placed itself.
        """
        alloc, running = self.allocator, self.running
        copies: list[tuple[int, int]] = []
        placed, end = 0, len(running)
        while placed < end:
            seq = running[placed]
            while not alloc.can_append(seq):
                end -= 1
                self._preempt(running[end])
                if end == placed:
                    break
            else:
                if cow := alloc.append(seq):
                    copies += cow
                placed += 1
        del running[placed:]
        return copies

    def _preempt(self, seq: Sequence) -> None:
        """Swap the K/V out if asked and there is host room, else drop it to recompute later.

        Either way the victim goes back near the head of its queue, in arrival order.
        """
        self._unsettled = True
        if self.swap and self.allocator.can_swap_out(seq):
            self._swaps += [(True, device, host) for device, host in self.allocator.swap_out(seq)]
            seq.swap_out()
            _requeue(self.swapped, seq)
            return
        self.allocator.free(seq)
        seq.preempt()
        self.num_preempted += 1
        _requeue(self.waiting, seq)


def _arrival(seq: Sequence) -> tuple[float, int]:
    return seq.request.arrival_s, seq.seq_id


def _requeue(queue: deque[Sequence], seq: Sequence) -> None:
    """Put a preempted sequence back near the head of `queue`, in arrival order.

    It is older than every request that never ran, so the scan stops within the few preempted
    ones at the head (one swapped back and preempted again may be newer than some of those).
    """
    position = 0
    while position < len(queue) and _arrival(queue[position]) < _arrival(seq):
        position += 1
    queue.insert(position, seq)


class IterationScheduler(Scheduler):
    """Continuous batching: admission at every step, memory freed at each finish."""

    def __init__(self, allocator: KVAllocator, config: SchedulerConfig) -> None:
        super().__init__(allocator, config.max_num_seqs or 256, config.preemption)
        self.token_cap = config.max_num_batched_tokens or math.inf

    def admission_open(self) -> bool:
        return True

    def release(self, finished: list[Sequence]) -> None:
        for seq in finished:
            self.allocator.free(seq)


class RequestScheduler(Scheduler):
    """Static batching: a new batch only when the previous one has fully drained."""

    def __init__(self, allocator: KVAllocator, config: SchedulerConfig) -> None:
        super().__init__(allocator, config.max_num_seqs or math.inf, config.preemption)

    def admission_open(self) -> bool:
        return not self.running and not self.held

    def release(self, finished: list[Sequence]) -> None:
        self.held += finished
        if not self.running:
            for seq in self.held:
                self.allocator.free(seq)
            self.held.clear()
