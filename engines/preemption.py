"""Preemption: how a scheduler makes room when the allocator runs out, and brings victims back.

The newest running sequence (the latest arrival) gives up its memory first: swapped to host
memory when asked and possible, else dropped to be recomputed. A beam group is one victim (its
members' blocks are shared, so it is always recomputed) and comes back whole.
"""

from __future__ import annotations

from collections import deque

from engines.allocator import KVAllocator
from engines.groups import unit_start
from kvbench.sequence import SeqStatus, Sequence


class Preemption:
    """The `Scheduler`'s preemption mechanics (a mixin over its queues and allocator)."""

    allocator: KVAllocator
    running: list[Sequence]
    waiting: deque[Sequence]
    swapped: deque[Sequence]
    max_num_seqs: float
    num_preempted: int
    swap: bool
    _swaps: list[tuple[bool, int, int]]
    _unsettled: bool

    def _run(self, seq: Sequence) -> None:
        """Add `seq` to `running` in arrival order (the scheduler's own)."""
        raise NotImplementedError

    def _place_with_preemption(self) -> list[tuple[int, int]]:
        """Slots one by one in admission order, preempting the newest when out of room.

        `running[:placed]` have their slot; victims are taken from the end of the list
        (the newest admitted), possibly down to the sequence being placed itself. A beam
        group goes as one victim; if it is the one being placed, its members placed so far
        give their slots (and copies) back too.
        """
        alloc, running = self.allocator, self.running
        copies: list[tuple[int, int]] = []
        marks: list[int] = []  # len(copies) before each placed sequence's append
        placed, end = 0, len(running)
        while placed < end:
            seq = running[placed]
            while not alloc.can_append(seq):
                start = unit_start(running, end - 1)
                for victim in reversed(running[start:end]):
                    self._preempt(victim)
                end = start
                if end <= placed:
                    if end < placed:  # the unit being placed: undo its members' copies
                        del copies[marks[end] :]
                    placed = end
                    break
            else:
                marks.append(len(copies))
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
        beam = seq.group is not None and seq.group.beam
        if self.swap and not beam and self.allocator.can_swap_out(seq):
            self._swaps += [(True, device, host) for device, host in self.allocator.swap_out(seq)]
            seq.swap_out()
            _requeue(self.swapped, seq)
            return
        self.allocator.free(seq)
        seq.preempt()
        self.num_preempted += 1
        _requeue(self.waiting, seq)

    def _bring_back(self) -> None:
        """Swap in from the head of `swapped` while memory and `max_num_seqs` allow."""
        alloc = self.allocator
        while self.swapped and len(self.running) < self.max_num_seqs and alloc.can_swap_in(self.swapped[0]):
            seq = self.swapped.popleft()
            self._swaps += [(False, host, device) for host, device in alloc.swap_in(seq)]
            seq.status = SeqStatus.RUNNING
            self._run(seq)


def _requeue(queue: deque[Sequence], seq: Sequence) -> None:
    """Put a preempted sequence back near the head of `queue`, in arrival order.

    It is older than every request that never ran, so the scan stops within the few preempted
    ones at the head (one swapped back and preempted again may be newer than some of those).
    """
    position = 0
    while position < len(queue) and queue[position].order < seq.order:
        position += 1
    queue.insert(position, seq)
