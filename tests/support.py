"""Helpers shared by the tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from workloads.tracefile import read_trace

# Triton kernels on CPU tensors run only in Triton's interpreter (conftest sets it where no GPU is)
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
INTERPRETED = pytest.mark.skipif(not INTERPRETING, reason="CPU tensors need Triton's interpreter")


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
