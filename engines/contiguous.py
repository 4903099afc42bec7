"""Contiguous allocation (the paper's Orca and FasterTransformer): one extent per request.

At admission a request reserves its whole future in one extent, sized by a reservation
policy; it never grows, so a running sequence never waits for memory, but everything it
reserved and does not yet use is lost to other requests until it finishes.

A request with several outputs (n samples, k beams) reserves one extent per output at
admission, as a non-paged system must: nothing is shared. The leader's extent holds the
prompt; the others wait in the group's pool until `fork` hands one to a member and asks for
the parent's K/V to be copied into it (the prompt, and for beams the outputs so far). A beam
that is pruned gives its extent back to the pool; the pool returns to the arena when the
group's last member leaves.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from engines.allocator import Extent, SlotCopy
from engines.arena import SlotArena
from kvbench.metrics.occupancy import Footprint
from kvbench.requests import Request
from kvbench.sequence import SeqGroup, Sequence, group_width, width_at_admission


class ReservationPolicy(Protocol):
    """How many slots a request reserves at admission."""

    def slots(self, request: Request) -> int: ...


@dataclass(frozen=True, slots=True)
class MaxReservation:
    """Reserve the model's maximum length: what a system that cannot predict output does."""

    max_len: int  # 2048 for OPT

    def slots(self, request: Request) -> int:
        return self.max_len


@dataclass(frozen=True, slots=True)
class Pow2Reservation:
    """Reserve the prompt plus the next power of two of the true output, at most the max length.

    The paper's Orca (Pow2) "reserves 32 positions for outputs if the true output length is
    25": the over-reservation is on the output, at most 2x. (Rounding the *whole* length up
    to a power of two would equal Oracle under a buddy arena, which rounds it anyway.) No
    system reserves past the model's maximum length, so neither does this one.
    """

    max_len: int

    def slots(self, request: Request) -> int:
        return min(self.max_len, request.prompt_len + (1 << (request.output_len - 1).bit_length()) - 1)


@dataclass(frozen=True, slots=True)
class OracleReservation:
    """Reserve exactly the true length: the best a contiguous system could ever do."""

    def slots(self, request: Request) -> int:
        return request.kv_len


class ContiguousAllocator:
    """Extents from a `SlotArena`, sized by a `ReservationPolicy`. See `KVAllocator`."""

    def __init__(self, arena: SlotArena, policy: ReservationPolicy) -> None:
        self.num_slots = arena.num_slots
        self.arena = arena
        self.policy = policy
        self._extents: dict[Sequence, Extent] = {}
        self._pools: dict[SeqGroup, list[Extent]] = {}  # reserved extents no member holds now
        self._resident: dict[SeqGroup, int] = {}  # members holding an extent, per group
        self._asked = 0
        self._granted = 0
        self._target = 0  # sum of min(asked, kv_len): policies never ask below kv_len

    def can_ever_hold(self, request: Request) -> bool:
        slots = self.policy.slots(request)
        extents = self.num_slots // self.arena.grant_size(slots)  # how many an empty arena grants
        return self.arena.can_ever_fit(slots) and extents >= group_width(request)

    def can_allocate(self, seq: Sequence) -> bool:
        width = width_at_admission(seq)
        slots = self.policy.slots(seq.request)
        return self.arena.can_fit(slots) if width == 1 else self.arena.can_fit_many(slots, width)

    def can_allocate_all(self, seqs: Seq[Sequence]) -> bool:
        assert len({seq.request for seq in seqs}) == 1, "one request's sequences at a time"
        return self.arena.can_fit_many(self.policy.slots(seqs[0].request), len(seqs))

    def allocate(self, seq: Sequence) -> None:
        """An extent for `seq`; for a group's leader at admission, one for every member."""
        asked = self.policy.slots(seq.request)
        granted = self.arena.grant_size(asked)
        width = width_at_admission(seq)
        extents = [Extent(self.arena.alloc(asked), asked, granted) for _ in range(width)]
        self._extents[seq] = extents[0]
        if seq.group is not None:
            self._pools.setdefault(seq.group, []).extend(reversed(extents[1:]))  # popped in grant order
            self._resident[seq.group] = self._resident.get(seq.group, 0) + 1
        self._asked += width * asked
        self._granted += width * granted
        self._target += width * min(asked, seq.request.kv_len)

    def fork(self, parent: Sequence, child: Sequence) -> list[SlotCopy]:
        """Give `child` an extent of the group's pool; the parent's K/V must be copied into it."""
        assert child not in self._extents, f"seq {child.seq_id} is already resident"
        extent = self._pools[child.group].pop()
        self._extents[child] = extent
        self._resident[child.group] += 1
        return [(self._extents[parent].start, extent.start, parent.num_computed)]

    def can_append(self, seq: Sequence) -> bool:
        return True  # the extent already covers the sequence's whole future

    def append(self, seq: Sequence) -> list[tuple[int, int]]:
        assert seq.num_tokens <= self._extents[seq].asked, "sequence outgrew its reservation"
        return []

    def append_all(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        return []  # every extent already covers its sequence's whole future

    def free(self, seq: Sequence) -> None:
        extent = self._extents.pop(seq)
        group = seq.group
        if group is None:
            self._release(extent, seq.request)
            return
        self._pools[group].append(extent)
        self._resident[group] -= 1
        if not self._resident[group]:  # the group's last member: the whole reservation goes
            del self._resident[group]
            for pooled in self._pools.pop(group):
                self._release(pooled, seq.request)

    def _release(self, extent: Extent, request: Request) -> None:
        self.arena.release(extent.start)
        self._asked -= extent.asked
        self._granted -= extent.granted
        self._target -= min(extent.asked, request.kv_len)

    def can_swap_out(self, seq: Sequence) -> bool:
        return False  # contiguous engines never preempt: the reservation covers the future

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        raise NotImplementedError("contiguous extents are never swapped")

    def can_swap_in(self, seq: Sequence) -> bool:
        return False

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        raise NotImplementedError("contiguous extents are never swapped")

    def growth_horizon(self, seqs: Seq[Sequence], max_steps: int) -> int:
        return max_steps

    def grow(self, seqs: Seq[Sequence], num_steps: int) -> None:
        return None

    def trim(self, num_steps: int) -> None:
        return None

    def footprint(self) -> Footprint:
        tokens = sum(seq.num_computed for seq in self._extents)
        return Footprint(tokens, self._target, self._asked, self._granted)

    def sharing_saved(self) -> int:
        return 0  # every sequence holds its own copy

    def external_frag(self, head: Sequence | None) -> int:
        if head is None:
            return 0
        if self.can_allocate(head):
            return 0
        return self.arena.free_slots_unusable_for(self.policy.slots(head.request))

    def addressing(self, seq: Sequence) -> Extent:
        return self._extents[seq]

    def check_integrity(self) -> None:
        pooled = [extent for pool in self._pools.values() for extent in pool]
        held = list(self._extents.values()) + pooled
        self.arena.check_integrity({e.start: e.granted for e in held})
        assert self._asked == sum(e.asked for e in held)
        assert self._granted == sum(e.granted for e in held)
        for seq, extent in self._extents.items():
            assert seq.num_computed <= extent.asked, f"seq {seq.seq_id} overflows its extent"
            assert extent.asked >= seq.request.kv_len, f"seq {seq.seq_id} under-reserved"
        for group, pool in self._pools.items():
            resident = sum(member in self._extents for member in group.members)
            assert resident == self._resident[group] > 0, "a group's resident count is wrong"
            assert resident + len(pool) == group.width, "a group lost an extent"
