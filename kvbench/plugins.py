"""Engines that kvbench runs but does not own (transformers' serving loops) register here.

`kvbench.config` validates a run and `kvbench.real.run` dispatches it through this table, so
neither imports the engines themselves: `kvbench.external` registers its engines when the
package `kvbench` is imported (its `__init__`), and a third-party engine could do the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ExternalEngine:
    name: str
    summary: str  # one line for --help and reports
    # (config.RunConfig, config.Prepared | None) -> simulate.RunResult; real runs only. Typed loosely:
    # this table sits below `kvbench.config`, which consults it
    run: Callable[[Any, Any], Any]
    check: Callable[[Any], None]  # (config.RunConfig): refuse bad engine flags, one line naming the flag


EXTERNAL: dict[str, ExternalEngine] = {}


def register(engine: ExternalEngine) -> None:
    """Add `engine` to the table (a second registration of one name replaces the first)."""
    EXTERNAL[engine.name] = engine


def is_external(engine: str) -> bool:
    return engine in EXTERNAL
