"""Jenga's page pool with parked blocks (`engines.caching_pages.CachingLcmPages`): admission
replays, on counts, what the takes and evictions that follow it do, so its answer must be exactly
whether they succeed. A mutation run of the module (scope `engines-caching-pages`,
docs/MUTATION.md) found the count replay pinned only where a wrong "yes" breaks a later take;
a wrong "no" (room a woken page or a split page leaves uncounted, the reserve met exactly) passed.

Here every answer is checked against the pool itself: from many small states reached by real
takes, parks, revivals and releases, a deep copy of the pool does what the admission describes
(hits revived, then each block taken, parked blocks evicted first where `victims` says), and
`admits` must say yes exactly when that succeeds with `reserve` pages free or idle left over.
"""

from __future__ import annotations

import copy
import random

import pytest

from engines.caching_pages import CachingLcmPages
from engines.hybrid import GroupShape

# a page of 6 bytes holds 3 blocks of group 0 (2 bytes) or 2 of group 1 (3 bytes); 5 pages
SHAPES = (GroupShape(2), GroupShape(3))
BLOCK_SIZE, PAGES = 1, 5


class Pool:
    """A `CachingLcmPages` and what the allocator keeps beside it: each block's group, the
    referenced blocks and the parked ones, least recently parked first."""

    def __init__(self) -> None:
        self.pages = CachingLcmPages(SHAPES, BLOCK_SIZE, PAGES * 6)
        self.group: dict[int, int] = {}
        self.held: list[int] = []
        self.parked: list[int] = []

    def take(self, group: int) -> bool:
        """One block of `group`, evicting as the allocator does; False if there is no room."""
        try:
            victims = self.pages.victims(group, iter(self.parked))
        except AssertionError:
            return False
        for block in victims:
            self.pages.evict(self.group.pop(block), block)
            self.parked.remove(block)
        if not self.pages.free and not self.pages._live_spare[group]:
            return False
        block = self.pages.take(group)
        self.group[block] = group
        self.held.append(block)
        return True

    def revive(self, block: int) -> None:
        self.pages.revive(self.group[block], block)
        self.parked.remove(block)
        self.held.append(block)

    def fits(self, phases, reserve: int) -> bool:
        """Whether these phases succeed on a copy, `reserve` pages free or idle left over."""
        trial = copy.deepcopy(self)
        for need, hits in phases:
            for block in hits:
                trial.revive(block)
            for group, n in enumerate(need):
                for _ in range(n):
                    if not trial.take(group):
                        return False
        return len(trial.pages.free) + len(trial.pages.idle) >= reserve


def states(seed: int, steps: int):
    """Pools after each of `steps` random operations (takes, parks, revivals, releases)."""
    rng, pool = random.Random(seed), Pool()
    for _ in range(steps):
        op = rng.random()
        if op < 0.4:
            pool.take(rng.randrange(len(SHAPES)))
        elif op < 0.7 and pool.held:
            block = pool.held.pop(rng.randrange(len(pool.held)))
            pool.pages.park(pool.group[block], block)
            pool.parked.append(block)
        elif op < 0.85 and pool.parked:
            pool.revive(rng.choice(pool.parked))
        elif pool.held:
            block = pool.held.pop(rng.randrange(len(pool.held)))
            pool.pages.release(pool.group.pop(block), block)
        pool.pages.check_parked({block: pool.group[block] for block in pool.parked})
        yield rng, pool


@pytest.mark.parametrize("seed", range(6))
def test_admission_says_yes_exactly_when_the_takes_it_replays_succeed(seed):
    asked = {True: 0, False: 0}
    for rng, pool in states(seed, 60):
        for _ in range(6):
            # hits in the first phase only: a later phase's hit could be evicted by an earlier
            # phase's takes, which the allocator never asks about
            hits = rng.sample(pool.parked, min(len(pool.parked), rng.randrange(3)))
            phases = [([rng.randrange(4) for _ in SHAPES], hits), ([rng.randrange(3) for _ in SHAPES], [])]
            phases = phases[: rng.randrange(1, 3)]
            reserve = rng.randrange(3)
            expected = pool.fits(phases, reserve)
            assert pool.pages.admits(phases_of(pool, phases), reserve) == expected, (phases, reserve)
            asked[expected] += 1
    assert asked[True] and asked[False]  # both answers were asked for


def phases_of(pool: Pool, phases):
    """The phases as `admits` takes them: hits as (group, block)."""
    return [(need, [(pool.group[block], block) for block in hits]) for need, hits in phases]
