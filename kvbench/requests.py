"""Trace items: what a user asks for, frozen before any engine sees it.

A `Request` carries the *true* output length from the trace: every engine generates exactly
that many tokens (EOS is ignored), so engines do the same work and differ only in memory
management and scheduling (DESIGN.md, principles 1 and 2).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    request_id: int
    arrival_s: float  # seconds from the start of the trace
    prompt_len: int  # tokens in the prompt
    output_len: int  # tokens to generate (>= 1), from the trace
    prompt_ids: tuple[int, ...] | None = None  # real token ids when the trace has them

    @property
    def kv_len(self) -> int:
        """Token slots this request ever fills: prompt + output - 1.

        The last sampled token is returned to the user but never fed back through the
        model, so its K/V is never written.
        """
        return self.prompt_len + self.output_len - 1

    @property
    def total_len(self) -> int:
        """Prompt plus output tokens: what a model's maximum length must admit."""
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class Trace:
    """An ordered workload: requests sorted by arrival time, ids unique."""

    name: str
    requests: tuple[Request, ...]

    def __len__(self) -> int:
        return len(self.requests)
