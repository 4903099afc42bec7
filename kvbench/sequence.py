"""Runtime state of one request inside an engine.

Lifecycle::

    WAITING --admit--> RUNNING --last token--> FINISHED
                          |  ^
                   preempt|  |re-admit (recompute the prompt and the tokens so far)
                          v  |
                        PREEMPTED       (or SWAPPED <-> RUNNING: K/V parked in host memory)

Token bookkeeping, for a request with prompt P and output O:

- `num_tokens` = P + tokens generated so far: every token the sequence knows.
- `num_computed` = tokens whose K/V is in the arena. A step computes the uncomputed tokens
  `[num_computed, num_tokens)` (the whole prompt at prefill, one token at decode) and samples
  one new token, so after every step `num_computed == num_tokens - 1`.
- The sequence finishes when it has generated O tokens, holding P + O - 1 slots
  (`Request.kv_len`).

Requests with several outputs (`n` parallel samples, or beam search of width k) are a
`SeqGroup`: one member per output, all of the same request. The leader (member 0) prefills
the prompt alone; at the end of that step the others are forked from it (the engine's
allocator shares or copies its K/V) and each continues with a token of its own. Parallel
samples then run as independent sequences; beams stay in lockstep, and after every step the
beam step (`engines.beam`) re-forks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from kvbench.requests import Request

if TYPE_CHECKING:
    from engines.beam import SyntheticScores


# `kvbench.modeling.sampling.sample` keys a row's noise by `request_id + seed * SEED_STRIDE`, so a
# sample keyed `request_id + s * SEED_STRIDE` draws what sample 0 draws under seed `seed + s`
SEED_STRIDE = 7919


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """Mutable per-request state; identity is the object (eq=False keeps hashing by id)."""

    request: Request
    status: SeqStatus = SeqStatus.WAITING
    num_tokens: int = 0  # prompt + generated tokens (set from the request)
    num_computed: int = 0  # tokens with K/V in the arena
    num_generated: int = 0  # output tokens sampled so far
    admitted_s: float | None = None  # first time it was scheduled (end of queueing)
    first_token_s: float | None = None
    finish_s: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    output_ids: list[int] = field(default_factory=list)  # sampled token ids (real runs only)
    # when each output token was sampled: the `ends` array (k,) of every segment the sequence ran
    # in, shared with the other sequences of that batch (one reference per segment, not one float
    # per token); `token_times` concatenates them
    step_ends: list[np.ndarray] = field(default_factory=list)
    sample: int = 0  # index in the request's group (0: the leader, and every single-output request)
    group: SeqGroup | None = None  # the request's outputs when it asks for several
    score: float = 0.0  # beams: cumulative log-probability of the output so far

    def __post_init__(self) -> None:
        self.num_tokens = self.request.prompt_len + self.num_generated

    @property
    def seq_id(self) -> int:
        return self.request.request_id

    @property
    def sample_key(self) -> int:
        """What seeded sampling keys this sequence's randomness by (the request id for sample 0)."""
        return self.request.request_id + SEED_STRIDE * self.sample

    @property
    def order(self) -> tuple[float, int, int]:
        """Arrival order: the request's arrival, then its id, then the member's index."""
        return self.request.arrival_s, self.request.request_id, self.sample

    @property
    def token_times(self) -> np.ndarray:
        """(num_generated,) when each output token was sampled, in order (the last is `finish_s`)."""
        return np.concatenate(self.step_ends) if self.step_ends else np.empty(0)

    @property
    def remaining(self) -> int:
        """Output tokens still to sample."""
        return self.request.output_len - self.num_generated

    def advance(
        self,
        num_steps: int,
        end_s: float,
        start_s: float | None = None,
        tokens: list[int] | None = None,
        ends: np.ndarray | None = None,
    ) -> bool:
        """Record `num_steps` consecutive steps of this sequence, run from `start_s` to `end_s`.

        Only the first step may be a prefill (many tokens); later ones are decodes, so after
        the call the sequence again has exactly one uncomputed token. The start of its first
        step is when the sequence left the queue (`admitted_s`). Each step samples one token at
        its end: `ends` (k,) are those end times (kept by reference, so the caller must not
        change the array); without it every step is taken to end at `end_s`. Returns whether
        it finished.
        """
        if self.admitted_s is None:
            self.admitted_s = start_s
        self.step_ends.append(ends if ends is not None else np.full(num_steps, end_s))
        if tokens is not None:
            self.output_ids += tokens
        self.num_tokens += num_steps
        self.num_computed = self.num_tokens - 1
        self.num_generated += num_steps
        if self.first_token_s is None:
            self.first_token_s = end_s
        if self.num_generated < self.request.output_len:
            return False
        self.status = SeqStatus.FINISHED
        self.finish_s = end_s
        return True

    def compute(self, num_tokens: int, start_s: float) -> None:
        """A prompt chunk that is not the prompt's last (chunked prefill): `num_tokens` more
        positions computed, no token sampled. Its first chunk's start ends its queueing."""
        if self.admitted_s is None:
            self.admitted_s = start_s
        self.num_computed += num_tokens
        assert self.num_computed < self.num_tokens, "the last chunk samples: advance, not compute"

    def copy_progress(self, parent: Sequence) -> None:
        """Become a fork of `parent`: its tokens (outputs included), times and score.

        The K/V is the allocator's business (`fork`); this copies what the sequence knows.
        """
        self.status = parent.status
        self.num_tokens, self.num_computed = parent.num_tokens, parent.num_computed
        self.num_generated = parent.num_generated
        self.admitted_s, self.first_token_s = parent.admitted_s, parent.first_token_s
        self.finish_s = parent.finish_s
        self.output_ids = list(parent.output_ids)
        self.step_ends = list(parent.step_ends)
        self.score = parent.score

    def swap_out(self) -> None:
        """Preempted by swapping: the K/V waits in host memory, nothing to recompute."""
        self.status = SeqStatus.SWAPPED
        self.num_preemptions += 1

    def preempt(self) -> None:
        """Drop the K/V (recompute later): the tokens stay known, none stay computed."""
        self.status = SeqStatus.PREEMPTED
        self.num_computed = 0
        self.num_preemptions += 1


@dataclass(eq=False)
class SeqGroup:
    """The outputs of one request asking for several: `n` samples, or beams of width `k`.

    Members are made up front (they are few) but only the leader runs until the prompt's
    prefill ends; `forked` says the others exist in the engine since then.
    """

    members: tuple[Sequence, ...]  # member i has `sample == i`; member 0 is the leader
    beam: bool  # beam search (re-forked every step) or parallel sampling (forked once)
    forked: bool = False
    synthetic: SyntheticScores | None = None  # simulated beams: the group's candidate source

    @property
    def width(self) -> int:
        return len(self.members)

    @property
    def leader(self) -> Sequence:
        return self.members[0]


def group_width(request: Request) -> int:
    """Sequences a request runs as: its beam width, or its number of samples."""
    return max(request.n, request.beam_width)


def width_at_admission(seq: Sequence) -> int:
    """Outputs an admission reserves memory for: every member's, when a group's leader first
    comes in (an allocator that shares nothing must hold the members' copies from the start,
    or a later admission could take the room their forks need)."""
    group = seq.group
    return group.width if group is not None and not group.forked else 1


def sequence_for(request: Request) -> Sequence:
    """The sequence a request starts as: alone, or the leader of its group of outputs."""
    leader = Sequence(request)
    width = group_width(request)
    if width > 1:
        members = (leader, *(Sequence(request, sample=i) for i in range(1, width)))
        group = SeqGroup(members, request.beam_width > 1)
        for member in members:
            member.group = group
    return leader
