"""Sharing transforms: add the KV-sharing structure of the paper's §6.3-6.4 to any workload.

Each function takes a `Columns` and returns a *new* one (the input is never mutated), so a
real or synthetic trace can be turned into the paper's parallel-sampling (Fig. 14), beam-search
(Fig. 15), shared-prefix (Fig. 16) or chatbot (Fig. 17) variant before `to_trace` validates it.
`prefix_groups_from_block_hashes` derives the same fields from a trace that records prefix
block hashes (Mooncake), so a prefix-caching engine can measure real reuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from kvbench.errors import KvbenchError
from workloads.arrivals import check_int
from workloads.columns import Columns

PREFIX_PRESETS = MappingProxyType({"fewshot-1": 80, "fewshot-5": 341})
"""Shared-prefix lengths of the paper's Fig. 16 (LLaMA-13B translation): 1-shot and 5-shot."""


def _copy(cols: Columns) -> Columns:
    """A deep-enough copy: fresh arrays and lists, so edits to the result never reach ``cols``."""
    out = cols.take(np.arange(len(cols)))
    out.extra = dict(cols.extra)
    return out


def with_parallel_samples(cols: Columns, n: int) -> Columns:
    """Every request asks for ``n`` parallel samples of its prompt (Fig. 14: n = 2, 4, 6)."""
    n = check_int("n", n, 1)
    out = _copy(cols)
    out.n = np.full(len(cols), n, dtype=np.int64)
    return out


def with_beam_width(cols: Columns, width: int) -> Columns:
    """Every request runs beam search of ``width`` beams (Fig. 15: widths 2, 4, 6)."""
    width = check_int("beam_width", width, 1)
    out = _copy(cols)
    out.beam_width = np.full(len(cols), width, dtype=np.int64)
    return out


def with_shared_prefix(
    cols: Columns, prefix_len: int | str, num_groups: int = 1, rng: np.random.Generator | None = None
) -> Columns:
    """Prepend a common prefix of ``prefix_len`` tokens (or a `PREFIX_PRESETS` name) to every prompt.

    Models Fig. 16's few-shot prompts: the examples are identical for every request of a group,
    the request's own text follows. ``prompt_len`` grows by the prefix, ``prefix_len`` is set to
    it and ``prefix_group`` to ``"prefix-<g>"``. With several groups (several tasks, each with its
    own few-shot prompt) requests are assigned round-robin, or uniformly at random from ``rng``.
    Any earlier prefix sharing is replaced, and ``prompt_ids`` and ``block_hashes`` are dropped:
    they describe prompts without the new prefix, which has no real tokens.
    """
    if isinstance(prefix_len, str):
        if prefix_len not in PREFIX_PRESETS:
            choices = ", ".join(sorted(PREFIX_PRESETS))
            raise KvbenchError(f"unknown prefix preset {prefix_len!r}; choose one of: {choices}")
        prefix_len = PREFIX_PRESETS[prefix_len]
    prefix_len = check_int("prefix_len", prefix_len, 1)
    num_groups = check_int("num_groups", num_groups, 1)
    count = len(cols)
    # (N,) group of each request: round-robin, or uniform from rng
    group = np.arange(count) % num_groups if rng is None else rng.integers(0, num_groups, size=count)
    names = [f"prefix-{g}" for g in range(num_groups)]
    out = _copy(cols)
    out.prompt_len = np.asarray(cols.prompt_len, dtype=np.int64) + prefix_len
    out.prefix_len = np.full(count, prefix_len, dtype=np.int64)
    out.prefix_group = [names[g] for g in group.tolist()]
    if cols.prompt_ids is not None or cols.block_hashes is not None:
        out.prompt_ids = out.block_hashes = None
        out.extra["sharing_note"] = "prompt_ids/block_hashes dropped: a synthetic prefix was prepended"
    return out


def _lengths(name: str, values: Sequence[int] | np.ndarray) -> np.ndarray:
    """``values`` as int64 (M,), every one an integer >= 1, else an error naming ``name``."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise KvbenchError(f"{name} must be a list of lengths")
    bad = ~np.isfinite(array) | (array < 1) | (array != np.floor(array))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise KvbenchError(f"{name} must hold integers >= 1, got {array[row]:g} at index {row}")
    return array.astype(np.int64)


def multi_turn(
    queries: Sequence[int] | np.ndarray,
    answers: Sequence[int] | np.ndarray,
    turns_per_conversation: int | Sequence[int],
    max_prompt_len: int = 1024,
) -> Columns:
    """Chatbot conversations (Fig. 17) from per-turn user-query and answer lengths (M,).

    Turn t of a conversation sends the whole history plus the new query, truncated to the last
    ``max_prompt_len`` tokens as the paper does (L = 1024): ``prompt_t = min(L, sum over s < t
    of (query_s + answer_s) + query_t)``, and generates ``answer_t``. ``turns_per_conversation``
    is either one count k (consecutive groups of k turns, the last group taking what is left)
    or one count per conversation, summing to M. Rows are conversation-major (c0's turns, then
    c1's...) with ``conversation_id`` ``"c<i>"`` and 0-based ``turn``; every ``arrival_s`` is 0,
    for the caller to schedule (a turn can only arrive after the previous answer).

    What a prefix cache may reuse is recorded as a prefix group per conversation: a turn whose
    history was not cut starts with its conversation's token stream, so ``prefix_len`` is its
    whole prompt (turn t shares the first ``prompt_{t-1}`` tokens with turn t-1's prompt). A cut
    prompt is a window that slid past the stream's start: its tokens sit at other positions
    than in any earlier turn (their K/V differs), so its ``prefix_len`` is 0.
    """
    query = _lengths("queries", queries)
    answer = _lengths("answers", answers)
    if query.size != answer.size or query.size == 0:
        raise KvbenchError(f"queries and answers must be equally long, got {query.size} and {answer.size}")
    limit = check_int("max_prompt_len", max_prompt_len, 1)
    total = query.size
    if isinstance(turns_per_conversation, int | np.integer) and not isinstance(turns_per_conversation, bool):
        k = check_int("turns_per_conversation", turns_per_conversation, 1)
        counts = np.full(total // k, k, dtype=np.int64)
        if total % k:
            counts = np.append(counts, total % k)
    else:
        counts = _lengths("turns_per_conversation", turns_per_conversation)
        if counts.sum() != total:
            raise KvbenchError(f"turns_per_conversation must sum to {total} turns, got {counts.sum()}")
    conv = np.repeat(np.arange(counts.size), counts)  # (M,) conversation of each row
    starts = np.cumsum(counts) - counts  # (C,) first row of each conversation
    exchange = query + answer  # (M,) tokens a turn adds to the history
    before = np.cumsum(exchange) - exchange  # (M,) tokens of all earlier rows
    history = before - before[starts][conv]  # (M,) tokens of earlier turns of the same conversation
    whole = history + query  # (M,) the prompt before truncation
    names = [f"c{i}" for i in conv.tolist()]
    return Columns(
        arrival_s=np.zeros(total, dtype=np.float64),
        prompt_len=np.minimum(limit, whole),
        output_len=answer.copy(),
        turn=np.arange(total, dtype=np.int64) - starts[conv],
        conversation_id=names,
        prefix_group=list(names),
        prefix_len=np.where(whole <= limit, whole, 0),
        extra={"max_prompt_len": limit},
    )


def prefix_groups_from_block_hashes(cols: Columns, block_size: int) -> Columns:
    """Prefix-sharing fields from recorded prompt block hashes (Mooncake: 512-token blocks).

    ``prefix_len`` is what an unbounded prefix cache could reuse: ``block_size`` times the length
    of the longest prefix of the request's hash list that began some earlier request's list
    (a prefix match in a trie, as a radix/prefix cache matches), capped at ``prompt_len - 1``
    since at least one prompt token must be computed. ``prefix_group`` is ``str`` of the first
    block hash (requests sharing any prefix share that block). Rows without hashes keep no group
    and ``prefix_len`` 0. Runs one Python pass over all hashes (~0.1 s per 300k blocks).
    """
    size = check_int("block_size", block_size, 1)
    if cols.block_hashes is None:
        raise KvbenchError("prefix groups from block hashes need a trace with block_hashes")
    children: dict[tuple[int, int], int] = {}  # (parent node, block hash) -> node; root is 0
    matched = np.zeros(len(cols), dtype=np.int64)  # (N,) blocks matched by an earlier request
    groups: list[str | None] = []
    for row, hashes in enumerate(cols.block_hashes):
        if not hashes:
            groups.append(None)
            continue
        node = depth = 0
        for block in hashes:
            child = children.get((node, block))
            if child is None:
                break
            node, depth = child, depth + 1
        for block in hashes[depth:]:  # the unseen rest becomes visible to later requests
            child = len(children) + 1
            children[(node, block)] = child
            node = child
        matched[row] = depth
        groups.append(str(hashes[0]))
    prompt = np.asarray(cols.prompt_len, dtype=np.int64)
    return replace(
        _copy(cols),
        prefix_len=np.clip(np.minimum(matched * size, prompt - 1), 0, None),
        prefix_group=groups,
    )
