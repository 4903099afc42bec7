"""Python's cyclic garbage collector, paused while many objects are made: a real run's timed
engine loop, or a trace of a million rows being built.

Why, in the engine loop: it creates and drops Python objects at every step (sequences, beam
candidates, block lists, step rows), so the collector runs on its own schedule inside steps. A
full collection walks every tracked object of the process, whose heap grows with each run a
reproduction has made: one took 189 ms inside a single beam step of an OPT-125M run on the H200
(results/reference/quick-opt-125m/README.md), against 3-5 ms for the steps around it, and stalled
all 252 running sequences. That is the interpreter, not the engine under test, and it lands on
whichever engine happens to run when the threshold is crossed.

Why, in a trace loader: building a Trace allocates one tracked object per request and nothing
cyclic, so the collector would re-scan the growing heap many times over (about 30 % of a
1M-row load).

Reference counting still frees everything that is not in a reference cycle; cycles made while
paused wait until the block ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused(*, collect: bool = False) -> Iterator[None]:
    """Keep automatic collection off until the block ends. The previous state is restored, so a
    caller who disabled it keeps it disabled (and a nested block changes nothing).

    `collect`: also collect once before (what is garbage now is not the block's) and once after
    (the block's cycles): for a timed loop, whose time these must stay out of. The one after
    walks the young generation only: nothing is collected while paused, so every object the
    block made is still young there, and a full walk would rescan the whole heap again (a
    quarter of a second a run once a process holds torch and pandas, twice per run).
    """
    was_enabled = gc.isenabled()
    if was_enabled and collect:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
            if collect:
                gc.collect(0)
