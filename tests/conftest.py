"""Test-wide settings: Triton's interpreter where no GPU is, one CPU thread per test process,
and the Hypothesis profiles (docs/TESTING.md).

The Triton switch must be set before any kernel module is imported: `triton.jit` reads it when
it decorates a kernel. The thread count must be set before torch starts its thread pool; the
environment variable also reaches the CLI processes tests start.
"""

from __future__ import annotations

import os

# `make test` runs one pytest worker per core (`-n 2` on the 2-core CI box): a second torch
# thread per worker only contends. Measured on that box under load: a tiny-llama real run took
# 31 s of wall time (8.8 s of CPU) with 2 threads, 12 s (3.1 s) with 1.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Hypothesis: no per-example deadline and no "too slow" health check (both measure wall time, so
# a loaded machine would fail a correct test); `ci` is the default, `thorough` runs 10x the
# examples and twice the steps of every state machine: KVBENCH_HYPOTHESIS=thorough. Test files
# scale their counts from the loaded profile (`tests.support.examples`), never fix them.
CI_EXAMPLES, CI_STEPS = 100, 50
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("ci", max_examples=CI_EXAMPLES, stateful_step_count=CI_STEPS, **_COMMON)
settings.register_profile(
    "thorough", max_examples=10 * CI_EXAMPLES, stateful_step_count=2 * CI_STEPS, **_COMMON
)
settings.load_profile(os.environ.get("KVBENCH_HYPOTHESIS", "ci"))
