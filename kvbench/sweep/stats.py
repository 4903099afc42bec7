"""Pure functions over a sweep's numbers: confidence intervals, the sustained rate, bisection.

The sustained request rate of an engine (the paper's Figure 12 reading) is the highest swept
rate whose normalized latency stays under a threshold. Latency against rate is flat while the
engine keeps up and then climbs steeply once requests queue faster than they finish (beyond
that knee it keeps growing with the length of the trace). Rates are read in increasing order
and the first one over the threshold ends the search: a pass above a failure is noise in the
knee, not a second stable region. A rate any of whose cells failed counts as a failure there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# two-sided 95 % Student t quantiles t(0.975, df) for df = 1..30
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """Student's t 97.5 % quantile: a table to 30 degrees of freedom, then the Cornish-Fisher series."""
    if df < 1:
        raise ValueError("a t quantile needs at least one degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963984540054
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (t interval; NaN for one value)."""
    data = [v for v in values if v == v]
    if not data:
        return math.nan, math.nan
    mean = statistics.fmean(data)
    if len(data) < 2:
        return mean, math.nan
    return mean, t975(len(data) - 1) * statistics.stdev(data) / math.sqrt(len(data))


@dataclass(frozen=True)
class Verdict:
    """What the rates swept so far say about one engine's sustained rate."""

    last_pass: float | None  # highest passing rate below the first failing one; None: none passes
    first_fail: float | None  # None: every rate passed (the sustained rate may be higher)
    how: str

    @property
    def sustained_rate(self) -> float | None:
        return self.last_pass

    @property
    def bracket(self) -> tuple[float, float] | None:
        """(last passing, first failing) rate, where bisection can refine.

        Where even the lowest rate fails, the bracket starts at 0: an idle engine serves each
        request at its unloaded latency, under any threshold that is a multiple above it.
        """
        if self.first_fail is None:
            return None
        return self.last_pass or 0.0, self.first_fail


def rate_latency(repeats: Sequence[float | None]) -> float | None:
    """A rate's normalized latency from its repeats' (None: a repeat that failed or has no
    latency): their mean, or None, read as over any bound, where any repeat has none.

    A failed run did not serve its requests under the bound; a mean over the repeats that
    happened to finish would pass the rate on the evidence of the lucky ones. The one reading
    of a rate that the sweep's own search and every page that reads a sweep back share.
    """
    if not repeats or any(value is None for value in repeats):
        return None
    return sum(repeats) / len(repeats)


def sustained_rate(points: Sequence[tuple[float, float | None]], threshold: float) -> Verdict:
    """The verdict on (rate, normalized latency) points; latency None marks a failed rate."""
    last_pass = None
    limit = f"{threshold:.4g} s/token"
    for rate, latency in sorted(points):
        if latency is None or not latency < threshold:
            if last_pass is None:
                return Verdict(None, rate, f"over {limit} from the lowest rate, {rate:g}")
            return Verdict(last_pass, rate, f"under {limit} up to {last_pass:g}, over at {rate:g}")
        last_pass = rate
    if last_pass is None:
        return Verdict(None, None, "no rate swept")
    return Verdict(last_pass, None, f"under {limit} at every swept rate: the sustained rate may be higher")


def bracket_width(bracket: tuple[float, float]) -> float:
    """(first fail - last pass) / last pass: how far apart the bracket's ends are (inf from 0)."""
    low, high = bracket
    return (high - low) / low if low > 0 else math.inf


def ratio_interval(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """Where the ratio of two sustained rates lies, each known only as a bracket (pass, fail).

    The true rate of A is in [a_pass, a_fail) and of B in [b_pass, b_fail), so A / B is in
    [a_pass / b_fail, a_fail / b_pass] (inf where B never passed).
    """
    (a_low, a_high), (b_low, b_high) = a, b
    return a_low / b_high, (a_high / b_low if b_low > 0 else math.inf)


def bisect_rate(bracket: tuple[float, float]) -> float:
    """The next rate to try between the last passing and the first failing one: the midpoint."""
    low, high = bracket
    return (low + high) / 2
