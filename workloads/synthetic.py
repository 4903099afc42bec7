"""Length sources: where a synthetic trace's (prompt, output) token lengths come from.

Every source is a frozen dataclass with ``sample(num, rng) -> (prompt, output)``, two int64
arrays of shape (num,) with every length >= 1, and ``describe()``, a one-line summary for
reports. Sources draw only from ``rng``, so a seed fixes the lengths; the arrival process uses
a separate stream (see `workloads.arrivals`), so changing the rate never changes the lengths.

The family spans the controlled to the realistic: `FixedLengths` and `UniformLengths` isolate
one effect (e.g. fragmentation against a known length), `LognormalLengths` is a tunable
heavy tail, `PresetLengths` reproduces the paper's ShareGPT/Alpaca means, and
`EmpiricalLengths` resamples any real trace's joint (prompt, output) pairs.
Parameter names in errors are the spec keys a user writes (``prompt_cv``, ``output_max``...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.requests import Trace
from workloads.arrivals import check_int, check_positive
from workloads.presets import CHUNK, MIN_ACCEPT_RATE, PRESETS, lognormal_lengths, sample_lengths

MAX_LENGTH = 2**31
"""The longest length or mean a spec may ask for: far above any model's context, so a larger
value is a typo, and below it no sum of lengths overflows int64."""
MAX_CV = 100  # lognormal: above it draws overflow int64 (and nothing realistic is that spread)


def _length(name: str, value: object) -> int:
    """A spec's length: an integer in 1..MAX_LENGTH, else one line naming its key."""
    number = check_int(name, value, 1)
    if number > MAX_LENGTH:
        raise KvbenchError(f"{name} must be at most {MAX_LENGTH} tokens, got {number}")
    return number


class LengthSource(Protocol):
    """Anything that yields (prompt, output) int64 arrays of shape (num,), all lengths >= 1."""

    def sample(self, num: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class FixedLengths:
    """Every request has the same lengths: isolates allocator effects from length variance."""

    prompt: int
    output: int

    def __post_init__(self) -> None:
        _length("prompt", self.prompt)
        _length("output", self.output)

    def sample(self, num: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        num = check_int("num_requests", num, 0)
        return np.full(num, self.prompt, dtype=np.int64), np.full(num, self.output, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed: prompt {self.prompt}, output {self.output}"


@dataclass(frozen=True)
class UniformLengths:
    """Independent uniform integers on inclusive ranges: bounded variance, no tail."""

    prompt_min: int
    prompt_max: int
    output_min: int
    output_max: int

    def __post_init__(self) -> None:
        for side in ("prompt", "output"):
            low = _length(f"{side}_min", getattr(self, f"{side}_min"))
            high = _length(f"{side}_max", getattr(self, f"{side}_max"))
            if low > high:
                raise KvbenchError(f"{side}_min must be <= {side}_max, got {low} > {high}")

    def sample(self, num: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        num = check_int("num_requests", num, 0)
        prompt = rng.integers(self.prompt_min, self.prompt_max, size=num, endpoint=True, dtype=np.int64)
        output = rng.integers(self.output_min, self.output_max, size=num, endpoint=True, dtype=np.int64)
        return prompt, output

    def describe(self) -> str:
        return (
            f"uniform: prompt {self.prompt_min}..{self.prompt_max}, "
            f"output {self.output_min}..{self.output_max}"
        )


@dataclass(frozen=True)
class LognormalLengths:
    """Independent lognormal lengths given by (mean, CV), rounded to integers.

    Unlike the paper presets there is no benchmark filter: a pair is redrawn only when a length
    rounds to 0 or, if ``max_total_len`` is set, when prompt + output exceeds it. Both rejections
    shrink the sampled mean below ``*_mean``; with means well above 1 and no cap the shift is
    negligible (< 0.1 % at mean 20, CV 1). Pairs are drawn `CHUNK` at a time, so the first k
    pairs of a longer sample equal a k-pair sample for the same seed.
    """

    prompt_mean: float
    prompt_cv: float
    output_mean: float
    output_cv: float
    max_total_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("prompt_mean", "prompt_cv", "output_mean", "output_cv"):
            value = check_positive(name, getattr(self, name))
            bound = MAX_CV if name.endswith("cv") else MAX_LENGTH
            if value > bound:
                raise KvbenchError(f"{name} must be at most {bound:,}, got {value:g}")
        if self.max_total_len is not None:
            check_int("max_total_len", self.max_total_len, 2)

    def sample(self, num: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        num = check_int("num_requests", num, 0)
        cap = np.iinfo(np.int64).max if self.max_total_len is None else self.max_total_len
        prompts: list[np.ndarray] = []
        outputs: list[np.ndarray] = []
        accepted = drawn = 0
        while accepted < num:
            z = rng.standard_normal((2, CHUNK))  # (2, CHUNK): row 0 prompts, row 1 outputs
            prompt = lognormal_lengths(self.prompt_mean, self.prompt_cv, z[0])
            output = lognormal_lengths(self.output_mean, self.output_cv, z[1])
            keep = (prompt >= 1) & (output >= 1) & (prompt <= cap - output)  # no overflow
            prompts.append(prompt[keep])
            outputs.append(output[keep])
            accepted += int(keep.sum())
            drawn += CHUNK
            if drawn >= 16 * CHUNK and accepted < MIN_ACCEPT_RATE * drawn:
                why = (
                    "round to 0"
                    if self.max_total_len is None
                    else f"exceed max_total_len {self.max_total_len}"
                )
                raise KvbenchError(
                    f"over {1 - MIN_ACCEPT_RATE:.0%} of the lognormal lengths {why} "
                    f"({self.describe()}): change the means"
                )
        if num == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(prompts)[:num], np.concatenate(outputs)[:num]

    def describe(self) -> str:
        cap = "" if self.max_total_len is None else f", total <= {self.max_total_len}"
        return (
            f"lognormal: prompt mean {self.prompt_mean:g} cv {self.prompt_cv:g}, "
            f"output mean {self.output_mean:g} cv {self.output_cv:g}{cap}"
        )


@dataclass(frozen=True, eq=False)
class EmpiricalLengths:
    """Resample (prompt, output) *pairs* with replacement from observed lengths.

    Pairs, not marginals, keep a real trace's correlation between prompt and output length.
    `from_trace` turns any loaded trace into a distribution, so e.g. Azure's lengths can be
    replayed under Poisson arrivals at any rate and count. Arrays are copied, int64 and
    read-only; equality is identity (arrays have no single truth value).
    """

    prompt: np.ndarray  # (M,) int64
    output: np.ndarray  # (M,) int64
    label: str = field(default="")  # where the pairs came from, for describe()

    def __post_init__(self) -> None:
        for name in ("prompt", "output"):
            values = np.array(getattr(self, name), dtype=np.float64)
            if values.ndim != 1 or values.size == 0:
                raise KvbenchError(f"{name} must be a non-empty list of lengths")
            bad = ~np.isfinite(values) | (values < 1) | (values != np.floor(values))
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                raise KvbenchError(f"{name} must hold integers >= 1, got {values[row]:g} at index {row}")
            as_int = values.astype(np.int64)
            as_int.flags.writeable = False
            object.__setattr__(self, name, as_int)
        if self.prompt.size != self.output.size:
            raise KvbenchError(
                f"prompt and output must have equal lengths, got {self.prompt.size} and {self.output.size}"
            )

    @classmethod
    def from_trace(cls, trace: Trace) -> EmpiricalLengths:
        """The (prompt, output) pairs of every request of ``trace``."""
        prompt = np.fromiter((r.prompt_len for r in trace.requests), np.int64, len(trace))
        output = np.fromiter((r.output_len for r in trace.requests), np.int64, len(trace))
        return cls(prompt, output, label=trace.name)

    def sample(self, num: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        num = check_int("num_requests", num, 0)
        index = rng.integers(0, self.prompt.size, size=num)  # (num,) rows drawn with replacement
        return self.prompt[index], self.output[index]

    def describe(self) -> str:
        source = f" of {self.label}" if self.label else ""
        return f"empirical: {self.prompt.size} (prompt, output) pairs{source}, resampled"


@dataclass(frozen=True)
class PresetLengths:
    """The paper's ShareGPT / Alpaca stand-ins (`workloads.presets`), filter included."""

    name: str
    max_total_len: int | None = None  # optionally tightens the preset's 2048-token cap

    def __post_init__(self) -> None:
        if self.name not in PRESETS:
            raise KvbenchError(f"unknown preset {self.name!r}; choose one of: {', '.join(sorted(PRESETS))}")
        if self.max_total_len is not None:
            check_int("max_total_len", self.max_total_len, 2)

    def sample(self, num: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        num = check_int("num_requests", num, 0)
        if num == 0:  # sample_lengths cannot concatenate zero chunks
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return sample_lengths(PRESETS[self.name], num, rng, self.max_total_len)

    def describe(self) -> str:
        spec = PRESETS[self.name]
        return (
            f"preset {self.name}: lognormal, filtered means prompt {spec.paper_prompt_mean:g}, "
            f"output {spec.paper_output_mean:g} (paper Fig. 11)"
        )
