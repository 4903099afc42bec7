"""Latency distributions of a run: weighted percentiles and inter-token latencies without one float per token.

A run's inter-token latencies (ITL) pool every gap between consecutive tokens of every
request: 6.7 million gaps for 20,000 ShareGPT requests. Most of them need not exist one by
one. The engine hands every sequence of a batch the *same* `ends` array (k,) for a segment
of k steps (`Sequence.step_ends` keeps references), so the k - 1 gaps inside a segment are
shared by all its sequences; only the gap *into* a segment (from the sequence's previous
token, across admissions, preemptions or other batches) is the sequence's own. `ItlTable`
keeps the pool as (value, count) pairs, one per distinct segment gap and one per
sequence-segment boundary (a sixth of the gaps for paged, a third for static), and each
request's longest gap; `distribution` computes what numpy's linear-interpolation
percentiles, mean and (population) standard deviation give on the expanded pool.

    tokens of seq A:   |a a a|        |s s s s|      <- s: shared segment, gaps s-s counted twice
    tokens of seq B:           |b b|  |s s s s|
                               ^ boundary gaps (b -> s, a -> s) are each sequence's own
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from itertools import chain

import numpy as np

from kvbench.sequence import Sequence


def percentile_key(p: float) -> str:
    """`p50`, `p99`, `p99.9`: the summary-key prefix of percentile `p`."""
    return f"p{p:g}"


def distribution(
    name: str, values: Seq[float] | np.ndarray, percentiles: Seq[float], counts: np.ndarray | None = None
) -> dict[str, float]:
    """`mean_<name>`, `median_<name>`, `std_<name>`, `p<q>_<name>` of the defined values.

    `counts[i]` says how many times `values[i]` occurs (default once each); NaN values (an
    undefined metric, e.g. the TPOT of a one-token output) are left out. Mean and standard
    deviation are weighted sums over the compact table; percentiles need the pool one value
    per element, but only partitioned around the wanted ranks (no full sort), and they
    interpolate linearly between ranks exactly as `numpy.percentile` does.
    """
    x = np.asarray(values, dtype=np.float64)
    w = None if counts is None else np.asarray(counts)
    undefined = np.isnan(x)
    if undefined.any():
        x = x[~undefined]
        w = None if w is None else w[~undefined]
    n = len(x) if w is None else int(w.sum())
    if n == 0:
        keys = ["mean", "median", "std", *map(percentile_key, percentiles)]
        return {f"{key}_{name}": math.nan for key in keys}
    mean = float(x.mean() if w is None else np.dot(x, w) / n)
    spread = x - mean
    spread *= spread
    std = math.sqrt(float(spread.mean() if w is None else np.dot(spread, w) / n))
    del spread
    pool = x.copy() if w is None else np.repeat(x, w)  # partitioned in place below
    qs = [50.0, *percentiles]
    ranks = [(n - 1) * q / 100 for q in qs]
    below = [math.floor(h) for h in ranks]
    pool.partition(sorted({*below, *(min(lo + 1, n - 1) for lo in below)}))  # those ranks in place
    points = [
        float(pool[lo] + (h - lo) * (pool[min(lo + 1, n - 1)] - pool[lo]))
        for h, lo in zip(ranks, below, strict=True)
    ]
    out = {f"mean_{name}": mean, f"median_{name}": points[0], f"std_{name}": std}
    out.update({f"{percentile_key(p)}_{name}": v for p, v in zip(percentiles, points[1:], strict=True)})
    return out


@dataclass(frozen=True)
class ItlTable:
    """A run's inter-token latencies as (value, count) pairs, and each request's longest gap."""

    values: np.ndarray  # (m,) seconds
    counts: np.ndarray  # (m,) how many gaps of the pool have this value
    maxima: np.ndarray  # (num_sequences,) each sequence's longest gap; NaN for one token

    @property
    def num_gaps(self) -> int:
        return int(self.counts.sum())

    def expanded(self) -> np.ndarray:
        """The pool one gap per element (for checks; a real run's pool is large)."""
        return np.repeat(self.values, self.counts)

    @classmethod
    def of(cls, seqs: Seq[Sequence]) -> ItlTable:
        # every (sequence, segment) pair, sequence after sequence, in time order within each
        per_seq = np.fromiter((len(seq.step_ends) for seq in seqs), dtype=np.int64, count=len(seqs))
        pairs = list(chain.from_iterable(seq.step_ends for seq in seqs))
        if not pairs:
            return cls(np.empty(0), np.empty(0, dtype=np.int32), np.full(len(seqs), math.nan))
        ids = np.fromiter(map(id, pairs), dtype=np.int64, count=len(pairs))
        _, first_use, pair_seg = np.unique(ids, return_index=True, return_inverse=True)
        # segments in the order of their first use, not of their memory addresses: the pool's
        # order sets the float sums behind mean and std, which must not change between runs
        order = np.argsort(first_use, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        pair_seg = rank[pair_seg.reshape(-1)]
        segs = [pairs[i] for i in first_use[order].tolist()]  # the distinct segments' `ends` arrays
        lengths = np.fromiter(map(len, segs), dtype=np.int64, count=len(segs))
        times = np.concatenate(segs)
        start = np.cumsum(lengths) - lengths
        seg_first, seg_last = times[start], times[start + lengths - 1]
        # gaps inside a segment: shared by every sequence that ran it
        gaps = np.diff(times)
        inside = np.ones(len(gaps), dtype=bool)
        inside[start[1:] - 1] = False  # from one segment's last step to the next segment's first
        within = gaps[inside]
        del times, gaps, inside  # the largest temporaries: one float per step of the run
        uses = np.bincount(pair_seg, minlength=len(segs)).astype(np.int32)  # sequences per segment
        within_counts = np.repeat(uses, lengths - 1)
        seg_max = np.full(len(segs), -np.inf)
        multi = lengths > 1
        if multi.any():
            offsets = np.cumsum(lengths - 1) - (lengths - 1)
            seg_max[multi] = np.maximum.reduceat(within, offsets[multi])
        # gaps into a segment: from the sequence's previous token (its previous pair's last end)
        continues = np.ones(len(pairs), dtype=bool)
        continues[(np.cumsum(per_seq) - per_seq)[per_seq > 0]] = False
        into = np.full(len(pairs), -np.inf)
        into[1:] = seg_first[pair_seg[1:]] - seg_last[pair_seg[:-1]]
        boundary = into[continues]
        # each sequence's longest gap: over its pairs, inside and into each segment
        longest = np.maximum(seg_max[pair_seg], np.where(continues, into, -np.inf))
        maxima = np.full(len(seqs), math.nan)
        ran = per_seq > 0
        maxima[ran] = np.maximum.reduceat(longest, (np.cumsum(per_seq) - per_seq)[ran])
        maxima[np.isneginf(maxima)] = math.nan
        values = np.concatenate((within, boundary))
        counts = np.concatenate((within_counts, np.ones(len(boundary), dtype=np.int32)))
        return cls(values, counts, maxima)
