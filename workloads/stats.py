"""Trace statistics: what `kvbench trace stats` prints, and what SOURCES.md tabulates.

Definitions (chosen so the shared traces reproduce /work/shared/traces/SOURCES.md exactly):
- duration: last minus first arrival; None when every request arrives at once (then the rate,
  interarrival CV and peak are None too: the trace has no timing to describe).
- mean rate: (N - 1) / duration, the rate of the N - 1 gaps.
- interarrival CV: population std / mean of the N - 1 gaps (1 for Poisson).
- peak in 1 s: most arrivals in one bucket [k, k + 1) s, buckets counted from the first
  arrival. (A sliding window gives 19 on Azure 2023 instead of the table's 16.)
- lengths: mean, numpy-linear p50 / p90 / p99, max and min.
- prefix reuse, an upper bound (an unbounded cache that never evicts), from ``block_hashes``
  when present: the fraction of hash blocks whose hash appeared earlier in the trace, and the
  token-weighted fraction, where a reused block counts its size (block_size, or the remainder
  for a partial last block) over all prompt tokens. Else from ``prefix_group`` / ``prefix_len``:
  the prefix tokens each request finds held by an earlier request of its group (all of a shared
  few-shot prefix; a chat turn, the previous turns' prompts), over all prompt tokens.
Everything is vectorised except one pass per field over the requests (1M requests: ~1 s).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.requests import Trace


@dataclass(frozen=True)
class LengthStats:
    """Summary of one length column, in tokens."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: int
    min: int

    @classmethod
    def of(cls, values: np.ndarray) -> LengthStats:
        p50, p90, p99 = np.percentile(values, [50, 90, 99])  # linear interpolation
        return cls(
            float(values.mean()), float(p50), float(p90), float(p99), int(values.max()), int(values.min())
        )


@dataclass(frozen=True)
class PrefixReuse:
    """Upper bound on prefix-cache reuse; see the module docstring for both sources."""

    source: str  # "block_hashes" or "prefix_group"
    token_fraction: float  # reused prompt tokens / all prompt tokens
    block_size: int | None = None  # tokens per hash block (block_hashes only)
    blocks: int | None = None  # hash blocks in all prompts
    unique_blocks: int | None = None  # distinct hashes among them
    block_fraction: float | None = None  # blocks seen before / all blocks


@dataclass(frozen=True)
class TraceStats:
    name: str
    count: int
    duration_s: float | None
    mean_rate: float | None  # req/s
    interarrival_cv: float | None
    peak_1s: int | None  # most requests in one 1 s bucket
    prompt: LengthStats
    output: LengthStats
    reuse: PrefixReuse | None  # None: the trace carries no sharing information
    parallel_requests: int  # requests with n > 1
    beam_requests: int  # requests with beam_width > 1
    conversations: int  # distinct conversation ids
    prefix_groups: int  # distinct prefix groups


def _field(trace: Trace, name: str, dtype: type) -> np.ndarray:
    """One attribute of every request as an array (N,): the only per-request Python pass."""
    return np.fromiter(map(attrgetter(name), trace.requests), dtype, len(trace))


def trace_stats(trace: Trace, block_size: int | None = None) -> TraceStats:
    """Every statistic of ``trace`` (see the module docstring for the definitions).

    ``block_size`` (tokens per ``block_hashes`` entry) defaults to ``trace.hash_block_size``;
    without either, each block is weighted by its prompt's tokens spread evenly over its blocks.
    """
    count = len(trace)
    if count == 0:
        raise KvbenchError(f"{trace.name}: the trace has no requests")
    arrival = np.sort(_field(trace, "arrival_s", np.float64))  # (N,)
    prompt = _field(trace, "prompt_len", np.int64)  # (N,)
    output = _field(trace, "output_len", np.int64)  # (N,)
    n = _field(trace, "n", np.int64)
    beam = _field(trace, "beam_width", np.int64)
    groups = list(map(attrgetter("prefix_group"), trace.requests))
    conversations = set(map(attrgetter("conversation_id"), trace.requests)) - {None}
    hashes = list(map(attrgetter("block_hashes"), trace.requests))
    size = block_size if block_size is not None else trace.hash_block_size
    if hashes.count(None) < count:  # list.count: a C loop, unlike any() over a generator
        reuse = _hash_reuse(hashes, prompt, size)
    elif groups.count(None) < count:
        reuse = _group_reuse(groups, _field(trace, "prefix_len", np.int64), prompt)
    else:
        reuse = None
    return TraceStats(
        name=trace.name,
        count=count,
        **_timing(arrival),
        prompt=LengthStats.of(prompt),
        output=LengthStats.of(output),
        reuse=reuse,
        parallel_requests=int((n > 1).sum()),
        beam_requests=int((beam > 1).sum()),
        conversations=len(conversations),
        prefix_groups=len(set(groups) - {None}),
    )


def _timing(arrival: np.ndarray) -> dict:
    """The timing fields from sorted arrival times (N,); all None without a time span."""
    duration = float(arrival[-1] - arrival[0])
    if duration <= 0.0:
        return {"duration_s": None, "mean_rate": None, "interarrival_cv": None, "peak_1s": None}
    gaps = np.diff(arrival)  # (N-1,)
    buckets = np.floor(arrival - arrival[0]).astype(np.int64)  # (N,) sorted 1 s buckets
    return {
        "duration_s": duration,
        "mean_rate": (arrival.size - 1) / duration,
        "interarrival_cv": float(gaps.std() / gaps.mean()),
        "peak_1s": int(np.unique(buckets, return_counts=True)[1].max()),
    }


def _hash_reuse(hashes: list, prompt: np.ndarray, block_size: int | None) -> PrefixReuse:
    """Reuse bound from per-request hash lists (None rows have no hashes and no reuse)."""
    lists = hashes if None not in hashes else [h or () for h in hashes]
    lengths = np.fromiter(map(len, lists), np.int64, len(lists))  # (N,) blocks per request
    total = int(lengths.sum())
    try:
        flat = np.fromiter(chain.from_iterable(lists), np.int64, total)  # (B,) all hashes in order
    except OverflowError:  # 64-bit unsigned content hashes: renumber densely, first-seen order
        dense: dict[int, int] = {}
        flat = np.fromiter(
            (dense.setdefault(h, len(dense)) for h in chain.from_iterable(lists)), np.int64, total
        )
    unique, first = np.unique(flat, return_index=True)
    reused = np.ones(total, dtype=bool)  # (B,) hash appeared at an earlier position
    reused[first] = False
    has = lengths > 0
    prompt_tokens = int(prompt[has].sum())
    if block_size is None:  # no block size: count every reused block as a full share of its prompt
        share = np.repeat(prompt / np.maximum(lengths, 1), lengths)  # (B,)
        reused_tokens = float(share[reused].sum())
    else:
        starts = np.cumsum(lengths) - lengths  # (N,) first block of each request in `flat`
        position = np.arange(total) - np.repeat(starts, lengths)  # (B,) block index in its prompt
        size = np.clip(np.repeat(prompt, lengths) - position * block_size, 0, block_size)  # (B,)
        reused_tokens = float(size[reused].sum())
    return PrefixReuse(
        source="block_hashes",
        token_fraction=reused_tokens / prompt_tokens if prompt_tokens else 0.0,
        block_size=block_size,
        blocks=total,
        unique_blocks=int(unique.size),
        block_fraction=float(reused.sum() / total) if total else 0.0,
    )


def _group_reuse(groups: list, prefix_len: np.ndarray, prompt: np.ndarray) -> PrefixReuse:
    """Reuse bound from prefix groups: a request reuses as much of its prefix as an earlier
    request of its group held. A few-shot group's requests share one prefix, so every request
    after the first reuses all of it; a conversation's turn t shares its whole prompt as prefix
    but only the previous turns' prompts were computed before it (their answers and its new
    query were not), so it reuses the longest prefix an earlier turn had."""
    longest: dict[str, int] = {}  # group -> the longest prefix held by a request so far
    reused = np.zeros(len(groups), dtype=np.int64)  # (N,) prefix tokens found in the cache
    for row, group in enumerate(groups):
        if group is not None:
            held = longest.get(group, 0)
            reused[row] = min(int(prefix_len[row]), held)
            longest[group] = max(held, int(prefix_len[row]))
    return PrefixReuse(source="prefix_group", token_fraction=float(reused.sum() / prompt.sum()))


def _num(value: float) -> str:
    """A length for humans: whole numbers without decimals, others with one."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _lengths(stats: LengthStats) -> str:
    return (
        f"mean {_num(stats.mean)} / p50 {_num(stats.p50)} / p90 {_num(stats.p90)} / "
        f"p99 {_num(stats.p99)} / max {stats.max:,} (min {stats.min:,})"
    )


def format_stats(stats: TraceStats) -> str:
    """A readable multi-line summary (no trailing newline), as `kvbench trace stats` prints."""
    lines = [f"trace            {stats.name}", f"requests         {stats.count:,}"]
    if stats.duration_s is None:
        lines.append("arrivals         all at t = 0 (no timing)")
    else:
        lines += [
            f"duration         {stats.duration_s:,.1f} s",
            f"mean rate        {stats.mean_rate:.2f} req/s",
            f"interarrival CV  {stats.interarrival_cv:.2f}",
            f"peak in 1 s      {stats.peak_1s:,} requests",
        ]
    lines += [f"prompt tokens    {_lengths(stats.prompt)}", f"output tokens    {_lengths(stats.output)}"]
    reuse = stats.reuse
    if reuse is None:
        lines.append("prefix reuse     none recorded")
    elif reuse.source == "block_hashes":
        size = f"{reuse.block_size}-token" if reuse.block_size else "hash"
        lines.append(
            f"prefix reuse     {reuse.block_fraction:.1%} of {reuse.blocks:,} {size} blocks seen before "
            f"({reuse.unique_blocks:,} unique), {reuse.token_fraction:.1%} of prompt tokens "
            "(upper bound: unbounded cache)"
        )
    else:
        lines.append(
            f"prefix reuse     {reuse.token_fraction:.1%} of prompt tokens in {stats.prefix_groups:,} "
            "prefix groups (upper bound: unbounded cache)"
        )
    lines.append(
        f"sharing          n > 1: {stats.parallel_requests:,}, beam > 1: {stats.beam_requests:,}, "
        f"conversations: {stats.conversations:,}"
    )
    return "\n".join(lines)
