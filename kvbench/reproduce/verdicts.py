"""Verdicts that can say no: kvbench's measurement beside the paper's number, judged by a rule
written down here.

A verdict names its metric (and weighting) and reads one of:

- **matches**: the paper's value lies inside the measured interval (a 95 % confidence interval
  over seeds, or a sustained-rate bracket) widened by `TOLERANCE` on each side;
- **differs**: it does not; and also where the paper shows a gap between two engines and the
  measured intervals of the two overlap (a tie is not the paper's order);
- **order only**: where only an order is compared (no value to hold the interval against),
  said so beside "matches"/"differs";
- **not measured**: the measurement rests on a constant that was assumed, not fitted or measured
  (a cost-model term without data behind it), or the run that should give it gave none (a NaN:
  Figure 2's share weighted by the time requests wait, in a run where no request waited), so it
  cannot confirm or refute the paper;
- **inconclusive**: the paper's value lies inside the widened interval, but so does half or
  twice the paper's value (`RESOLUTION`): a "matches" that could not have told the paper's number
  from one twice as large or half as large confirms nothing. Seeds whose results spread widely
  give such an interval (a 95 % t interval over 3 seeds is 2.5 standard deviations either side);
  more seeds narrow it.

The evidence of both sides is in the verdict's text: measured interval and paper value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.sweep.stats import mean_ci95, ratio_interval

TOLERANCE = 0.15  # +-15 % around a measured interval: the paper's values are read off its figures
RESOLUTION = 2.0  # a match must rule out the paper's value divided or multiplied by this
MATCHES, DIFFERS, NOT_MEASURED, INCONCLUSIVE = "matches", "differs", "not measured", "inconclusive"


@dataclass(frozen=True)
class Interval:
    """Where a measured quantity lies: [low, high] around `value` (a mean or a bracket's pass)."""

    value: float
    low: float
    high: float
    # each seed's value, in seed order (NaN where a seed has none), where the interval is over
    # seeds: engines of one seed share its trace draw, so two engines compare seed by seed
    seeds: tuple[float, ...] = ()

    @classmethod
    def of_samples(cls, samples: Sequence[float]) -> Interval:
        """Mean and 95 % t interval of repeated measurements (one sample: a point)."""
        mean, half = mean_ci95(samples)
        half = 0.0 if math.isnan(half) else half
        return cls(mean, mean - half, mean + half)

    @classmethod
    def of_bracket(cls, last_pass: float, first_fail: float) -> Interval:
        """A sustained rate known to lie in [last pass, first fail)."""
        return cls(last_pass, last_pass, first_fail)

    @classmethod
    def ratio(cls, numerator: Interval, denominator: Interval) -> Interval:
        """`numerator` over `denominator`: the ratio of their values, between the ratios of
        their ends (`ratio_interval`); an infinite value over a zero."""
        low, high = ratio_interval((numerator.low, numerator.high), (denominator.low, denominator.high))
        value = numerator.value / denominator.value if denominator.value else math.inf
        return cls(value, low, high)

    def widened(self, tolerance: float = TOLERANCE) -> tuple[float, float]:
        return self.low * (1 - tolerance), self.high * (1 + tolerance)

    def below(self, other: Interval) -> bool:
        """Wholly below `other`: ends where it starts at most (a bracket [pass, fail) touching the
        next one's pass is below it), never two equal values (a tie)."""
        return self.high < other.low or (self.high == other.low and self.value < other.value)

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def paired_ratio(self, other: Interval) -> Interval | None:
        """`other` over this one seed by seed: the mean and 95 % t interval of their per-seed
        ratios; None without two seeds measured in both (or a zero here)."""
        if len(self.seeds) != len(other.seeds):
            return None
        pairs = zip(self.seeds, other.seeds, strict=True)
        ratios = [b / a for a, b in pairs if a > 0 and math.isfinite(a * b)]
        return Interval.of_samples(ratios) if len(ratios) >= 2 else None

    def __str__(self) -> str:
        text = (
            f"{self.value:.3g}"
            if self.low == self.high
            else f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}]"
        )
        measured = sum(math.isfinite(v) for v in self.seeds)
        if measured == 1 and len(self.seeds) > 1:  # the other seeds ran but have no value: no spread
            text += f" (one run: {len(self.seeds) - 1} of {len(self.seeds)} seeds have none)"
        return text


@dataclass(frozen=True)
class Verdict:
    outcome: str  # MATCHES, DIFFERS, NOT_MEASURED or INCONCLUSIVE
    metric: str  # what was compared, with its weighting ("token states, saturated-weighted")
    evidence: str  # both sides: the measured interval and the paper's value
    order_only: bool = False

    def __str__(self) -> str:
        kind = " (order only)" if self.order_only else ""
        return f"{self.outcome}{kind}: {self.metric}: {self.evidence}"


def value_verdict(
    metric: str, measured: Interval, paper: float, *, tolerance: float = TOLERANCE, assumed: str | None = None
) -> Verdict:
    """The paper's value against the measured interval widened by `tolerance`.

    `assumed`: the constant the measurement rests on, if it was assumed (then "not measured").
    """
    low, high = measured.widened(tolerance)
    evidence = f"kvbench {measured} (+-{tolerance:.0%}: [{low:.3g}, {high:.3g}]), paper {paper:.3g}"
    if assumed:
        return Verdict(NOT_MEASURED, metric, f"{evidence}; rests on an assumed {assumed}")
    if math.isinf(high) and low <= paper:  # a lower bound alone: it can refute, never confirm
        return Verdict(NOT_MEASURED, metric, f"{evidence}; no upper end (no rate swept failed)")
    if not low <= paper <= high:
        return Verdict(DIFFERS, metric, evidence)
    held = [v for v in (paper / RESOLUTION, paper * RESOLUTION) if low <= v <= high]
    if held:
        wide = f"{evidence}; too wide to tell: it holds {' and '.join(f'{v:.3g}' for v in held)} as well"
        return Verdict(INCONCLUSIVE, metric, wide)
    return Verdict(MATCHES, metric, evidence)


def ratio_verdict(
    metric: str,
    numerator: Interval,
    denominator: Interval,
    paper: float,
    *,
    tolerance: float = TOLERANCE,
    assumed: str | None = None,
) -> Verdict:
    """A ratio of two measured quantities (each an interval) against the paper's ratio."""
    ratio = Interval.ratio(numerator, denominator)
    return value_verdict(metric, ratio, paper, tolerance=tolerance, assumed=assumed)


def order_verdict(
    metric: str,
    measured: Mapping[str, Interval],
    paper: Mapping[str, float],
    *,
    tolerance: float = TOLERANCE,
) -> Verdict:
    """Whether engines rank as in the paper, where only the order is compared.

    Engines are taken in the paper's increasing order. A pair the paper separates by more than
    `tolerance` must be separated here too: the lower engine's interval wholly below the
    higher's, or, over several seeds, the higher engine's value over the lower's seed by seed
    (`Interval.paired_ratio`: both ran each seed's trace draw) with a 95 % t interval wholly above
    1. Why paired: a draw that is hard for one engine is hard for all, so the seeds' spread moves
    every engine's interval alike, and two intervals over three seeds (2.5 standard deviations
    either side) can overlap where every seed ranks the engines as the paper does. A pair the
    paper shows within `tolerance` of each other may come in either order.
    """
    engines = sorted((e for e in paper if e in measured), key=paper.get)
    wrong, paired = [], []
    for i, low_engine in enumerate(engines):
        for high_engine in engines[i + 1 :]:
            gap = paper[high_engine] > paper[low_engine] * (1 + tolerance)
            a, b = measured[low_engine], measured[high_engine]
            if not gap or a.below(b):
                continue
            ratio = a.paired_ratio(b)
            if ratio is not None and ratio.low > 1:
                paired.append(f"{high_engine}/{low_engine} {ratio}")
                continue
            tied = " (tied)" if a.overlaps(b) else ""
            seeds = f", seed by seed {high_engine}/{low_engine} {ratio}" if ratio is not None else ""
            wrong.append(f"{low_engine} {a} vs {high_engine} {b}{tied}{seeds}")
    evidence = ", ".join(f"{e} {measured[e]} (paper {paper[e]:.3g})" for e in engines)
    if paired:
        evidence += f"; overlapping intervals separated seed by seed (paired ratios): {', '.join(paired)}"
    missing = sorted(set(paper) - set(measured))
    if missing:
        wrong.append(f"no measurement for {', '.join(missing)}")
    if wrong:
        return Verdict(DIFFERS, metric, f"{evidence}; not in the paper's order: {'; '.join(wrong)}", True)
    return Verdict(MATCHES, metric, evidence, True)


def range_verdict(metric: str, measured: Interval, paper: tuple[float, float]) -> Verdict:
    """A measured interval against a range the paper gives (no tolerance: the range is its own
    allowance). Matches where the measured interval lies inside the paper's range; differs where
    it lies wholly outside (no value it holds is one the paper allows); inconclusive where it
    holds values on both sides, as `value_verdict`'s "too wide to tell": a measurement that
    cannot tell values in the range from values outside it neither confirms nor refutes it."""
    low, high = paper
    evidence = f"kvbench {measured}, paper {low:g}-{high:g}"
    if math.isinf(measured.high) and measured.low <= high:  # as in `value_verdict`: cannot confirm
        return Verdict(NOT_MEASURED, metric, f"{evidence}; no upper end (no rate swept failed)")
    if low <= measured.low and measured.high <= high:
        return Verdict(MATCHES, metric, evidence)
    if measured.high < low or high < measured.low:
        return Verdict(DIFFERS, metric, evidence)
    return Verdict(
        INCONCLUSIVE, metric, f"{evidence}; too wide to tell: it holds values outside the range as well"
    )


def missing(metric: str, what: str) -> Verdict:
    """A verdict with nothing measured to hold against the paper: it cannot match."""
    return Verdict(DIFFERS, metric, f"no measurement: {what}")


def unmeasured(metric: str, why: str) -> Verdict:
    """A verdict on a run that finished without the quantity (NaN): unlike `missing` (nothing
    ran, or nothing passed), the run says nothing about the paper's value either way."""
    return Verdict(NOT_MEASURED, metric, f"no measurement: {why}")


def figure_verdict(verdicts: Sequence[Verdict]) -> str:
    """A figure's one line: its overall outcome, then every part with its evidence."""
    return f"{overall(verdicts)}: " + "; ".join(str(v) for v in verdicts)


def assumed_terms(cost_model: str | None, real: bool) -> frozenset[str]:
    """The cost terms a setting's numbers rest on without data behind them.

    A calibrated cost file lists them under "assumed" (none when the key is missing). The
    roofline (no file, simulated) prices a swap with a link bandwidth and latency written down,
    not measured; a real run measures its own step times.
    """
    if real:
        return frozenset()
    if cost_model is None:
        return frozenset({"per_swap_block_s"})
    from kvbench.results.files import read_json

    return frozenset(read_json(Path(cost_model)).get("assumed") or ())


def overall(verdicts: Sequence[Verdict]) -> str:
    """One word for a figure: differs if any part differs, not measured if any part is,
    inconclusive if any part is, else matches."""
    outcomes = {v.outcome for v in verdicts}
    for outcome in (DIFFERS, NOT_MEASURED, INCONCLUSIVE):
        if outcome in outcomes:
            return outcome
    return MATCHES if verdicts else NOT_MEASURED
