"""Synthetic length presets that stand in for the paper's ShareGPT and Alpaca traces.

The PagedAttention paper (Fig. 11) gives only the mean token lengths of its two workloads after
vLLM's ShareGPT filter: ShareGPT input 161.31 / output 337.99, Alpaca input 19.31 / output 58.45.
A preset reproduces those means with independent lognormal prompt and output lengths, each
described by (mean, CV), sampled pair by pair and *rejected and redrawn* when the pair fails the
filter, exactly as the benchmark drops such pairs from the real dataset.

Assumptions (the paper gives means, not shapes; these are ours):
- Lengths are lognormal: positive, right-skewed, heavy-tailed, like the histograms of Fig. 11.
- Prompt and output lengths are independent (the paper shows no joint statistics).
- Coefficients of variation, chosen so ShareGPT has the higher variance the paper describes:
  * ShareGPT prompt CV 1.5: real user turns range from a few words to pasted documents.
  * ShareGPT output CV 1.0: ChatGPT answers vary widely but are less extreme than pasted input.
  * Alpaca prompt CV 0.6: one templated instruction (+ optional short input), a narrow spread.
  * Alpaca output CV 0.7: answers range from one-word labels to short essays.
  These CVs are of the pre-filter distributions; the filter's caps make the sampled CVs smaller
  (measured with 10^6 filtered pairs: ShareGPT 1.05 prompt / 0.85 output, Alpaca 0.60 / 0.70).

Calibration: the filter truncates (mostly ShareGPT's long tails), so a lognormal with the paper's
mean would come out too short after filtering. ``calibrate()`` finds, by fixed-point iteration on
common random numbers, the pre-filter means whose filtered means equal the paper's. It was run
once, by ``print_calibration()`` (``python -c "import workloads.presets as m;
m.print_calibration()"``), and its results are the ``prompt_mean`` / ``output_mean`` constants in
``PRESETS`` below; rerun it whenever a CV or the filter changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.requests import Request, Trace
from workloads.arrivals import check_rate, poisson_arrivals

CHUNK = 4096
"""Pairs drawn per rejection round. Fixed (not scaled to the request count) so that the first k
requests of a longer trace equal a k-request trace for the same seed."""

MIN_ACCEPT_RATE = 0.01
"""Below this acceptance rate (after 16 chunks) sampling is declared hopeless, not looped on."""


@dataclass(frozen=True)
class LengthFilter:
    """vLLM benchmark_serving's ShareGPT filter of the paper's era, sized for OPT (2048 context).

    A pair (prompt, output) is kept when both sides are at least the minimum (too-short requests
    say nothing about memory), the prompt fits the prompt cap, and the whole sequence fits the
    model's context.
    """

    min_prompt_len: int = 4
    min_output_len: int = 4
    max_prompt_len: int = 1024
    max_total_len: int = 2048  # OPT's max_position_embeddings

    def accepts(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """Boolean mask [n] of the pairs that pass."""
        return (
            (prompt >= self.min_prompt_len)
            & (output >= self.min_output_len)
            & (prompt <= self.max_prompt_len)
            & (prompt + output <= self.max_total_len)
        )


@dataclass(frozen=True)
class LengthPreset:
    """A named synthetic length distribution; see the module docstring for the assumptions."""

    name: str
    # Pre-filter lognormal means, calibrated so the *filtered* means hit the paper's.
    prompt_mean: float
    output_mean: float
    # Pre-filter coefficients of variation (std / mean): assumptions, see module docstring.
    prompt_cv: float
    output_cv: float
    # The paper's Fig. 11 means after filtering: the calibration targets.
    paper_prompt_mean: float
    paper_output_mean: float
    # Part of the preset's definition: the paper's means are measured after this filter.
    length_filter: LengthFilter = LengthFilter()


def lognormal_lengths(mean: float, cv: float, z: np.ndarray) -> np.ndarray:
    """Token lengths (int64, shape of ``z``) of a lognormal with ``mean`` and ``cv``.

    Takes standard normals ``z`` rather than a generator so that ``calibrate`` can reuse one set
    of draws for every candidate mean (common random numbers make its iteration smooth).
    Lengths are rounded to the nearest integer; the filter then drops the tiny ones.
    """
    sigma2 = math.log1p(cv * cv)
    mu = math.log(mean) - sigma2 / 2.0  # E[exp(mu + sigma z)] = mean
    return np.rint(np.exp(mu + math.sqrt(sigma2) * z)).astype(np.int64)


def _filtered_pairs(
    preset: LengthPreset, z_prompt: np.ndarray, z_output: np.ndarray, keep: LengthFilter
) -> tuple[np.ndarray, np.ndarray]:
    """Lengths from the normals ``z_*`` [n], keeping the pairs that pass ``keep``."""
    prompt = lognormal_lengths(preset.prompt_mean, preset.prompt_cv, z_prompt)
    output = lognormal_lengths(preset.output_mean, preset.output_cv, z_output)
    mask = keep.accepts(prompt, output)
    return prompt[mask], output[mask]


def sample_lengths(
    preset: LengthPreset,
    num: int,
    rng: np.random.Generator,
    max_total_len: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``num`` (prompt, output) pairs, int64 arrays of shape [num], all passing the filter.

    Pairs are drawn CHUNK at a time, filtered with a mask and the survivors kept in draw order,
    which is rejection sampling of whole pairs done vectorised. ``max_total_len`` optionally
    tightens the preset's total-length cap (never loosens it).
    """
    keep = preset.length_filter
    if max_total_len is not None and max_total_len < keep.max_total_len:
        keep = replace(keep, max_total_len=max_total_len)
    prompts: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    accepted = drawn = 0
    while accepted < num:
        # [2, CHUNK]: row 0 drives the prompt lengths, row 1 the output lengths
        z = rng.standard_normal((2, CHUNK))
        prompt, output = _filtered_pairs(preset, z[0], z[1], keep)
        prompts.append(prompt)
        outputs.append(output)
        accepted += prompt.size
        drawn += CHUNK
        if drawn >= 16 * CHUNK and accepted < MIN_ACCEPT_RATE * drawn:
            raise KvbenchError(
                f"--max-model-len {max_total_len} lets fewer than {MIN_ACCEPT_RATE:.0%} of "
                f"'{preset.name}' requests through its length filter"
            )
    return np.concatenate(prompts)[:num], np.concatenate(outputs)[:num]


def make_trace(preset: str, num_requests: int, rate: float, seed: int, max_model_len: int = 2048) -> Trace:
    """A deterministic synthetic trace: ``num_requests`` requests of ``preset`` at ``rate`` req/s.

    Lengths and arrivals come from two independent streams spawned from ``default_rng(seed)``,
    so changing the rate does not change the lengths, and (CHUNK being fixed) a shorter trace is
    a prefix of a longer one with the same seed. Requests are sorted by arrival and numbered
    0..n-1 in that order; the trace is named after the preset.

    The preset's own filter (OPT's 2048-token context) always applies. A ``max_model_len`` below
    2048 additionally drops pairs with prompt + output > ``max_model_len``, so the filtered means
    then fall below the paper's; a larger one changes nothing.
    """
    if preset not in PRESETS:
        choices = ", ".join(sorted(PRESETS))
        raise KvbenchError(f"unknown --trace {preset!r}; choose one of: {choices}")
    spec = PRESETS[preset]
    _check_int("--num-requests", num_requests, minimum=1)
    check_rate(rate)
    _check_int("--seed", seed, minimum=0)
    keep = spec.length_filter
    _check_int("--max-model-len", max_model_len, keep.min_prompt_len + keep.min_output_len)

    length_rng, arrival_rng = np.random.default_rng(seed).spawn(2)
    prompt, output = sample_lengths(spec, num_requests, length_rng, max_model_len)
    arrival = poisson_arrivals(num_requests, rate, arrival_rng)  # sorted: a cumulative sum
    columns = zip(arrival.tolist(), prompt.tolist(), output.tolist(), strict=True)
    requests = tuple(
        Request(request_id=i, arrival_s=t, prompt_len=p, output_len=o) for i, (t, p, o) in enumerate(columns)
    )
    return Trace(name=preset, requests=requests)


def _check_int(flag: str, value: object, minimum: int) -> None:
    """Raise unless ``value`` is an int (bools excluded) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KvbenchError(f"{flag} must be an integer >= {minimum}, got {value!r}")


def calibrate(
    preset: LengthPreset,
    samples: int = 4_000_000,
    seed: int = 20230906,
    iters: int = 100,
) -> tuple[float, float]:
    """Pre-filter (prompt_mean, output_mean) whose filtered means equal the paper's.

    Fixed-point iteration: scale each pre-filter mean by target / achieved filtered mean until
    both agree to 1e-5. The filtered mean grows monotonically with the pre-filter mean, so the
    iteration converges; one fixed set of ``samples`` normal pairs is reused throughout so the
    map is deterministic. The CVs and filter are taken from ``preset``; its means only seed the
    search. Costs a few seconds; run offline, not at import.
    """
    z_prompt, z_output = np.random.default_rng(seed).standard_normal((2, samples))
    spec = replace(preset, prompt_mean=preset.paper_prompt_mean, output_mean=preset.paper_output_mean)
    for _ in range(iters):
        prompt, output = _filtered_pairs(spec, z_prompt, z_output, spec.length_filter)
        ratio_p = spec.paper_prompt_mean / prompt.mean()
        ratio_o = spec.paper_output_mean / output.mean()
        if abs(ratio_p - 1.0) < 1e-5 and abs(ratio_o - 1.0) < 1e-5:
            break
        spec = replace(
            spec,
            prompt_mean=spec.prompt_mean * ratio_p,
            output_mean=spec.output_mean * ratio_o,
        )
    return spec.prompt_mean, spec.output_mean


# Pre-filter means from calibrate() (4M pairs, seed 20230906); see the module docstring.
PRESETS: dict[str, LengthPreset] = {
    "sharegpt-paper": LengthPreset(
        name="sharegpt-paper",
        prompt_mean=187.94,
        prompt_cv=1.5,
        output_mean=356.35,
        output_cv=1.0,
        paper_prompt_mean=161.31,
        paper_output_mean=337.99,
    ),
    "alpaca-paper": LengthPreset(
        name="alpaca-paper",
        prompt_mean=19.26,
        prompt_cv=0.6,
        output_mean=58.48,
        output_cv=0.7,
        paper_prompt_mean=19.31,
        paper_output_mean=58.45,
    ),
}


def print_calibration() -> None:
    """Print calibrate()'s pre-filter means for every preset, to paste into PRESETS."""
    for spec in PRESETS.values():
        prompt_mean, output_mean = calibrate(spec)
        print(f"{spec.name}: prompt_mean={prompt_mean:.2f} output_mean={output_mean:.2f}")
