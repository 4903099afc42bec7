"""Helpers shared by the tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from kvbench.cost_model import CostModel
from kvbench.errors import KvbenchError
from workloads.tracefile import read_trace

# Triton kernels on CPU tensors run only in Triton's interpreter (conftest sets it where no GPU is)
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
INTERPRETED = pytest.mark.skipif(not INTERPRETING, reason="CPU tensors need Triton's interpreter")


def examples(ci: int) -> int:
    """A property's example count: `ci` under the CI profile, scaled as the loaded Hypothesis
    profile scales the default (tests/conftest.py), so `thorough` runs 10x every test."""
    return max(1, ci * settings.default.max_examples // settings.get_profile("ci").max_examples)


def steps(ci: int) -> int:
    """A state machine's step count: `ci` under the CI profile, scaled like `examples`."""
    return max(1, ci * settings.default.stateful_step_count // settings.get_profile("ci").stateful_step_count)


# The virtual step clock of real runs whose schedule a test checks (`ModelRunner(clock=...)`):
# 5 ms a step, 0.1 ms a token fed, 10 us a token of context. The tiny models' CPU steps take
# about that on a busy 2-core machine, so arrivals 10 ms apart meet running batches and a tight
# arena preempts; with measured times the same test preempted or not with the machine's load.
VIRTUAL_CLOCK = CostModel(fixed_s=5e-3, per_token_s=1e-4, per_kv_token_s=1e-5)


def error_of(path: Path) -> str:
    """The one-line error reading `path` raises; it must start with the path."""
    with pytest.raises(KvbenchError) as error:
        read_trace(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path
