"""Contiguous allocation (the paper's Orca and FasterTransformer): one extent per request.

At admission a request reserves its whole future in one extent, sized by a reservation
policy; it never grows, so a running sequence never waits for memory, but everything it
reserved and does not yet use is lost to other requests until it finishes.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from engines.allocator import Extent
from engines.arena import SlotArena
from kvbench.occupancy import Footprint
from kvbench.requests import Request
from kvbench.sequence import Sequence


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
        self._asked = 0
        self._granted = 0
        self._target = 0  # sum of min(asked, kv_len): policies never ask below kv_len

    def can_ever_hold(self, request: Request) -> bool:
        return self.arena.can_ever_fit(self.policy.slots(request))

    def can_allocate(self, seq: Sequence) -> bool:
        return self.arena.can_fit(self.policy.slots(seq.request))

    def allocate(self, seq: Sequence) -> None:
        asked = self.policy.slots(seq.request)
        granted = self.arena.grant_size(asked)
        extent = Extent(self.arena.alloc(asked), asked, granted)
        self._extents[seq] = extent
        self._asked += asked
        self._granted += granted
        self._target += min(asked, seq.request.kv_len)

    def can_append(self, seq: Sequence) -> bool:
        return True  # the extent already covers the sequence's whole future

    def append(self, seq: Sequence) -> list[tuple[int, int]]:
        assert seq.num_tokens <= self._extents[seq].asked, "sequence outgrew its reservation"
        return []

    def append_all(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        return []  # every extent already covers its sequence's whole future

    def free(self, seq: Sequence) -> None:
        extent = self._extents.pop(seq)
        self.arena.release(extent.start)
        self._asked -= extent.asked
        self._granted -= extent.granted
        self._target -= min(extent.asked, seq.request.kv_len)

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

    def external_frag(self, head: Sequence | None) -> int:
        if head is None:
            return 0
        asked = self.policy.slots(head.request)
        if self.arena.can_fit(asked):
            return 0
        return self.arena.free_slots_unusable_for(asked)

    def addressing(self, seq: Sequence) -> Extent:
        return self._extents[seq]

    def check_integrity(self) -> None:
        self.arena.check_integrity({e.start: e.granted for e in self._extents.values()})
        assert self._asked == sum(e.asked for e in self._extents.values())
        assert self._granted == sum(e.granted for e in self._extents.values())
        for seq, extent in self._extents.items():
            assert seq.num_computed <= extent.asked, f"seq {seq.seq_id} overflows its extent"
            assert extent.asked >= seq.request.kv_len, f"seq {seq.seq_id} under-reserved"
