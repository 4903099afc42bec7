"""Trace items: what a user asks for, frozen before any engine sees it.

A `Request` carries the *true* output length from the trace: every engine generates exactly
that many tokens (EOS is ignored), so engines do the same work and differ only in memory
management and scheduling (DESIGN.md, principles 1 and 2).

The optional fields describe sharing (DESIGN.md: the paged allocator's prefix cache, parallel
sampling and beam search). They are carried by every trace format; engines that do not share
KV simply compute every request's whole prompt, as the paper's Orca does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from hashlib import blake2b
from typing import NamedTuple

MAX_ARRIVAL_S = 10**9
"""The latest arrival time a trace may hold, in seconds (about 31.7 years).

The simulator keeps time as float64 seconds and adds step times of microseconds to milliseconds
to it. float64 carries 53 bits, so at t seconds it resolves t * 2**-52: 1.2e-7 s at 1e9 s, still
finer than a microsecond, but 0.25 s at 1e15 s, where a step added to the clock vanishes and
latencies read 0. A trace whose arrivals pass this bound would be replayed silently wrong.
"""


def too_late(after: str = "") -> str:
    """The refusal of an arrival past MAX_ARRIVAL_S (`after`: what it is counted from)."""
    years = "(about 31.7 years): later, float64 time cannot resolve a step"
    return f"must be at most {MAX_ARRIVAL_S:,} s{after} {years}"


class Request(NamedTuple):
    """One request of a trace; immutable.

    A NamedTuple rather than a frozen dataclass: equally immutable, and about ten times
    faster to build, which is most of the time of loading a million-request trace.
    """

    request_id: int
    arrival_s: float  # seconds from the start of the trace
    prompt_len: int  # tokens in the prompt
    output_len: int  # tokens to generate (>= 1), from the trace
    prompt_ids: tuple[int, ...] | None = None  # real token ids when the trace has them
    prefix_group: str | None = None  # requests of a group share their first prefix_len tokens
    prefix_len: int = 0  # length of that shared prefix (<= prompt_len)
    block_hashes: tuple[int, ...] | None = None  # content hashes of the prompt's hash blocks
    conversation_id: str | None = None  # multi-turn chat: which conversation
    turn: int | None = None  # and which turn of it (0-based)
    n: int = 1  # parallel samples of the same prompt
    beam_width: int = 1  # beam search width (1: no beam search)

    @property
    def kv_len(self) -> int:
        """Token slots this request ever fills: prompt + output - 1.

        The last sampled token is returned to the user but never fed back through the
        model, so its K/V is never written.
        """
        return self.prompt_len + self.output_len - 1

    @property
    def total_len(self) -> int:
        """Prompt plus output tokens: what a model's maximum length must admit."""
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class Trace:
    """An ordered workload: requests sorted by arrival time, ids unique."""

    name: str
    requests: tuple[Request, ...]
    source: str = ""  # where it came from (preset, file, spec), for reports
    hash_block_size: int | None = None  # tokens per `block_hashes` entry (Mooncake: 512)
    meta: dict = field(default_factory=dict, compare=False)  # free-form provenance (JSON-able)

    def __len__(self) -> int:
        return len(self.requests)


def group_number(name: str) -> int:
    """A prefix group's name as a 64-bit int, the same in every process (`hash` of a str is
    salted per process): what the prefix cache's keys and the group's shared prompt ids derive
    from, so both name the same content."""
    return int.from_bytes(blake2b(name.encode(), digest_size=8).digest())
