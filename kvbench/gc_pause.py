"""Python's cyclic garbage collector, paused while a real run's timed loop runs.

Why: the engine loop creates and drops Python objects at every step (sequences, beam
candidates, block lists, step rows), so the collector runs on its own schedule inside steps.
A full collection walks every tracked object of the process, whose heap grows with each run a
reproduction has made: one took 189 ms inside a single beam step of an OPT-125M run on the
H200 (results/reference/quick-opt-125m/README.md), against 3-5 ms for the steps around it, and
stalled all 252 running sequences. That is the interpreter, not the engine under test, and it
lands on whichever engine happens to run when the threshold is crossed.

Reference counting still frees everything that is not in a reference cycle; cycles made
during the loop wait until it ends, when the collector is restored and run once. (Serving
engines do the same for the same reason, for instance by freezing the heap after start-up.)
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect once, then keep automatic collection off until the block ends (nesting is safe:
    only the outermost block turns it back on)."""
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.collect()  # start from a clean heap: what is garbage now is not the run's
        gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
            gc.collect()  # the loop's cycles, freed now that no step is timed
