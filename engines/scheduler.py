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
- `ChunkedScheduler` (`engines.chunked`, `--chunked-prefill`): `IterationScheduler`'s admission
  and release, but each step runs every decode and fills a token budget with prompt chunks.

A request with several outputs (`engines.groups`) is admitted through its leader, counting
all its outputs against `max_num_seqs`; after its prompt's prefill the other members join
`running`. Parallel samples are then independent sequences. A beam group is one unit: its
members are always scheduled, preempted (by recompute: their blocks are shared, so they
cannot be swapped) and re-admitted together, and a step with beams is a single step.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from functools import partial

from engines.allocator import KVAllocator, SlotCopy
from engines.batch import DEFAULT_MAX_NUM_SEQS, Batch, SchedulerConfig
from engines.groups import Branches, admission_unit, branch, groups_in, seats_taken
from engines.preemption import Preemption
from kvbench.sequence import SeqStatus, Sequence

__all__ = ["Batch", "IterationScheduler", "RequestScheduler", "Scheduler", "SchedulerConfig"]


class Scheduler(Preemption):
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
        self._copies: list[SlotCopy] = []  # forks' K/V copies the next batch must do first
        self._block_slots = getattr(allocator, "block_size", 0)  # slots a block copy moves
        self._maps = (0, 0)  # the allocator's driver calls when the last batch was made
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

    def branch(self, batch: Batch, branches: Branches | None) -> None:
        """Fork (and prune) the groups that ran in `batch`, after its sequences advanced."""
        for group in groups_in(batch.seqs):
            joined, copies = branch(group, self.allocator, branches)
            for seq in joined:
                self._run(seq)
            self._copies += copies

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
            keys = [seq.order for seq in queue]
            assert keys == sorted(keys), "a queue is out of arrival order"
        for group in groups_in(self.running):  # forked beams are scheduled as one unit
            if group.beam and group.forked:
                assert all(beam.status is SeqStatus.RUNNING for beam in group.members)
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
        tokens = context = 0
        seats = len(self.running)  # running sequences once the admitted groups have forked
        while self.waiting and seats < self.max_num_seqs:
            seq = self.waiting[0]
            unit = admission_unit(seq)
            need = sum([member.num_tokens for member in unit])
            # (a preempted beam group may exceed the token cap: it then comes back alone)
            if (admitted and tokens + need > self.token_cap) or seats + seats_taken(seq) > self.max_num_seqs:
                break
            alloc = self.allocator
            if not (alloc.can_allocate_all(unit) if len(unit) > 1 else alloc.can_allocate(seq)):
                break
            for member in unit:
                self.waiting.popleft()
                self.num_preempted -= member.status is SeqStatus.PREEMPTED
                self.allocator.allocate(member)
                member.status = SeqStatus.RUNNING
                self._run(member)
                admitted.append(member)
                tokens += member.num_tokens - member.num_computed  # a prefix cache hit is not fed again
                context += member.num_tokens
            seats += seats_taken(seq)
        return self._batch(tuple(admitted), True, tokens, context) if admitted else None

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
        if any(seq.group is not None and seq.group.beam for seq in running):
            shortest = 1  # beams are re-forked after every step
        return self._batch(tuple(running), False, len(running), context, shortest, tuple(copies))

    def _batch(self, seqs, is_prefill, num_tokens, num_context, steps=1, copies=()) -> Batch:
        """A batch carrying the swaps and fork copies scheduled since the last one (they run first)."""
        swaps, slot_copies = tuple(self._swaps), tuple(self._copies)
        self._swaps.clear()
        self._copies.clear()
        copied = len(copies) * self._block_slots + sum([n for _, _, n in slot_copies])
        groups = any(seq.group is not None for seq in seqs)
        maps = getattr(self.allocator, "driver_calls", (0, 0))  # vmm: (pages mapped, unmapped) so far
        mapped, unmapped = maps[0] - self._maps[0], maps[1] - self._maps[1]
        self._maps = maps
        plan = getattr(self.allocator, "map_plan", None)
        return Batch(
            seqs, is_prefill, num_tokens, num_context, steps, copies, swaps, slot_copies, copied, groups,
            mapped, unmapped, None if plan is None or is_prefill else partial(plan, seqs),
        )  # fmt: skip

    def _run(self, seq: Sequence) -> None:
        """Add to `running` in arrival order, so "preempt the newest" means the latest arrival.

        Usually an append; a recomputed request re-admitted after newer swapped ones came back
        is older than they are.
        """
        if not self.running or self.running[-1].order < seq.order:
            self.running.append(seq)
        else:
            insort(self.running, seq, key=_order)


def _order(seq: Sequence) -> tuple[float, int, int]:
    return seq.order


class IterationScheduler(Scheduler):
    """Continuous batching: admission at every step, memory freed at each finish."""

    def __init__(self, allocator: KVAllocator, config: SchedulerConfig) -> None:
        super().__init__(allocator, config.max_num_seqs or DEFAULT_MAX_NUM_SEQS, config.preemption)
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
