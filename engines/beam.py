"""Beam search, one step at a time: which beams survive, and which member slot each one takes.

A beam group keeps k member sequences (slots) for its whole life. After every step, each of
the b live beams offers its best candidates (token, log-probability); the next k beams are
the k best (beam score + candidate log-probability) over all of them::

    beams (b)      candidates (b, c)        next beams (k), best first
    0: -1.2   ->   (7, -0.1) (3, -2.0)  ->  (parent 0, token 7, -1.3)
    1: -1.5   ->   (4, -0.3) (9, -0.4)      (parent 1, token 4, -1.8)  (parent 1, token 9, -1.9)

A beam chosen m times as a parent keeps its slot for its best child (nothing moves); its other
m - 1 children take the slots of beams nobody chose, which the allocator re-forks from the
parent (paged: share its blocks, copy-on-write the last; contiguous: copy its whole K/V).

The same `beam_step` runs in real decoding (candidates from the model's log-softmax) and in
simulation (`SyntheticScores`: seeded random log-probabilities, the same for every engine),
so a simulated run measures what the real allocators do under a beam search's fork-and-prune
pattern, with synthetic scores.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

SIM_VOCAB = 64  # simulated candidates: tokens per synthetic next-token distribution
SIM_LOGIT_SCALE = 2.0  # their logits ~ N(0, scale^2): top-1 probability ~0.3 on average


@dataclass(frozen=True, slots=True)
class BeamChoice:
    parent: int  # index of the beam it extends
    token: int
    score: float  # cumulative log-probability with the token


def beam_step(scores: Seq[float], tokens: np.ndarray, logprobs: np.ndarray, width: int) -> list[BeamChoice]:
    """The `width` best continuations, best first.

    scores (b,) the beams' cumulative log-probabilities; tokens, logprobs (b, c) each beam's
    candidates, best first. Ties go to the lower beam index, then the better-ranked candidate,
    so every engine picks the same. (Plain Python: b x c is a few dozen pairs.)
    """
    pairs = [
        (-(score + logprob), beam, rank)
        for beam, (score, row) in enumerate(zip(scores, np.asarray(logprobs).tolist(), strict=True))
        for rank, logprob in enumerate(row)
    ]
    token_rows = np.asarray(tokens).tolist()
    return [
        BeamChoice(beam, token_rows[beam][rank], -neg) for neg, beam, rank in heapq.nsmallest(width, pairs)
    ]


def assign_slots(parents: Seq[int], num_slots: int) -> tuple[list[int], list[int]]:
    """The member slot of each new beam, and the slots no new beam continues (to re-fork).

    The best child of each parent stays in the parent's slot; the other children take the
    unchosen slots in ascending order.
    """
    slot_of = [-1] * len(parents)
    kept: set[int] = set()
    for index, parent in enumerate(parents):
        if parent not in kept:
            kept.add(parent)
            slot_of[index] = parent
    unchosen = [slot for slot in range(num_slots) if slot not in kept]
    spare = iter(unchosen)
    slot_of = [slot if slot >= 0 else next(spare) for slot in slot_of]
    return slot_of, unchosen


class SyntheticScores:
    """Seeded synthetic candidates for one beam group's steps, in order.

    Each beam of each step draws its own next-token distribution: logits ~ N(0,
    SIM_LOGIT_SCALE^2) over SIM_VOCAB tokens, of which the `count` best are offered. A group's
    steps happen once each, in order (a recomputed group does not repeat one), so every engine
    draws the same candidates for the same step. Steps are drawn `chunk` at a time: numpy's
    per-call cost, not the arithmetic, is what a simulated beam step would otherwise pay.
    """

    def __init__(self, request_id: int, width: int, count: int, chunk: int = 32) -> None:
        self._rng = np.random.default_rng([0x6265616D, request_id])
        self.width, self.count, self.chunk = width, count, chunk
        self._tokens = self._logprobs = np.empty((0, width, count))
        self._next = 0

    def next(self, num_beams: int) -> tuple[np.ndarray, np.ndarray]:
        """The next step's tokens, logprobs (num_beams, count), best first."""
        if self._next == len(self._tokens):
            self._tokens, self._logprobs = self._draw()
            self._next = 0
        step = self._next
        self._next += 1
        return self._tokens[step, :num_beams], self._logprobs[step, :num_beams]

    def _draw(self) -> tuple[np.ndarray, np.ndarray]:
        logits = self._rng.standard_normal((self.chunk, self.width, SIM_VOCAB)) * SIM_LOGIT_SCALE  # (s, k, V)
        top = logits.max(axis=-1, keepdims=True)
        normalizer = top + np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))  # (s, k, 1)
        tokens = np.argsort(-logits, axis=-1, kind="stable")[..., : self.count]  # (s, k, c) best first
        return tokens, np.take_along_axis(logits, tokens, axis=-1) - normalizer
