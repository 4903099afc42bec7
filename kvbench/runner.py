"""The runner seam: what executes a scheduled batch and says how long it took.

The engine loop's clock is *virtual*: it advances by the step durations a runner reports
and jumps over idle gaps to the next arrival. A GPU runner reports measured times, a
simulation runner modelled ones; the loop, the allocators and the schedulers cannot tell
them apart, so a simulated run and a real run produce the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engines.groups import Branches
from engines.scheduler import Batch


@dataclass(frozen=True)
class StepResult:
    durations: np.ndarray  # (k,) seconds, one per step run
    tokens: list[list[int]] | None = None  # per batch sequence, its k sampled ids (None: simulated)
    # real runs: what each branching row offers its group (`engines.groups.Branches`): a beam's
    # candidates, a parallel-sampling prompt's first token of every sample; None: simulated
    branches: Branches | None = None


def step_ends(start_s: float, durations: np.ndarray) -> np.ndarray:
    """Absolute end time of each step `[k]`, summed in order from `start_s`.

    Exactly the floating-point values a clock advanced one step at a time would take, so a
    multi-step segment cut at an arrival time cuts where a step-by-step run would.
    """
    return np.add.accumulate(np.concatenate(([start_s], durations)))[1:]


class Runner(Protocol):
    # True for a runner that addresses the arena (a real one): the engine allocates a
    # multi-step segment's slots before the run and trims what an early stop left unused.
    # A simulator only needs them counted afterwards, for the steps that did run.
    allocates_ahead: bool

    def run(self, batch: Batch, max_steps: int, start_s: float, until_s: float) -> StepResult:
        """Run between 1 and `max_steps` steps of `batch` from time `start_s`; their durations.

        Steps after the first are decode steps of the same sequences (the engine guarantees
        that nothing changes the batch before `max_steps`). The runner stops after the first
        step ending at or after `until_s` (`step_ends`), the next arrival that could change
        the batch. A runner that cannot predict its step times runs one step.
        """
        ...
