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

from engines.scheduler import Batch


@dataclass(frozen=True)
class StepResult:
    durations: np.ndarray  # (k,) seconds, one per step run
    tokens: list[list[int]] | None = None  # per batch sequence, its k sampled ids (None: simulated)


class Runner(Protocol):
    def run(self, batch: Batch, max_steps: int, until_s: float) -> StepResult:
        """Run between 1 and `max_steps` steps of `batch`; return their durations (and tokens).

        Steps after the first are decode steps of the same sequences (the engine guarantees
        that nothing changes the batch before `max_steps`). The runner stops after the first
        step that ends at or past `until_s` seconds from now, the next arrival that could
        change the batch. A runner that cannot predict its step times runs one step.
        """
        ...
