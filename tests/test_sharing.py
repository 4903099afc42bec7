"""Sharing transforms: exact columns on hand examples, inputs untouched, results valid traces."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from kvbench.errors import KvbenchError
from workloads.columns import Columns, to_trace
from workloads.sharing import (
    PREFIX_PRESETS,
    multi_turn,
    prefix_groups_from_block_hashes,
    with_beam_width,
    with_parallel_samples,
    with_shared_prefix,
)


def small() -> Columns:
    return Columns(
        arrival_s=np.array([0.0, 1.0, 2.0, 3.0, 4.0]),
        prompt_len=np.array([10, 20, 30, 40, 50]),
        output_len=np.array([1, 2, 3, 4, 5]),
        extra={"source": "hand"},
    )


def same(a: Columns, b: Columns) -> bool:
    """Field-by-field equality (arrays compared by value)."""
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and np.array_equal(x, y)):
                return False
        elif x != y:
            return False
    return True


def test_parallel_samples_and_beam_width_set_one_column():
    cols = small()
    before = copy.deepcopy(cols)
    sampled = with_parallel_samples(cols, 4)
    beams = with_beam_width(cols, 6)
    assert sampled.n.tolist() == [4] * 5 and sampled.beam_width is None
    assert beams.beam_width.tolist() == [6] * 5 and beams.n is None
    assert sampled.prompt_len.tolist() == [10, 20, 30, 40, 50]
    assert same(cols, before)  # the input is untouched
    sampled.prompt_len[0] = 999
    sampled.extra["x"] = 1
    assert same(cols, before)  # and shares no array or dict with the output
    trace = to_trace(beams, "t", "test")
    assert {r.beam_width for r in trace.requests} == {6}


def test_shared_prefix_prepends_and_groups_round_robin():
    cols = small()
    before = copy.deepcopy(cols)
    out = with_shared_prefix(cols, 80, num_groups=2)
    assert out.prompt_len.tolist() == [90, 100, 110, 120, 130]
    assert out.prefix_len.tolist() == [80] * 5
    assert out.prefix_group == ["prefix-0", "prefix-1", "prefix-0", "prefix-1", "prefix-0"]
    assert out.output_len.tolist() == [1, 2, 3, 4, 5]
    assert same(cols, before)
    trace = to_trace(out, "t", "test")
    assert trace.requests[1].prefix_group == "prefix-1" and trace.requests[1].prefix_len == 80


def test_shared_prefix_presets_and_single_group():
    assert dict(PREFIX_PRESETS) == {"fewshot-1": 80, "fewshot-5": 341}
    out = with_shared_prefix(small(), "fewshot-5")
    assert out.prompt_len.tolist() == [351, 361, 371, 381, 391]
    assert out.prefix_group == ["prefix-0"] * 5


def test_shared_prefix_random_groups_are_seeded():
    cols = Columns(np.zeros(1_000), np.full(1_000, 5), np.ones(1_000, dtype=np.int64))
    a = with_shared_prefix(cols, 8, num_groups=3, rng=np.random.default_rng(1))
    b = with_shared_prefix(cols, 8, num_groups=3, rng=np.random.default_rng(1))
    assert a.prefix_group == b.prefix_group
    assert set(a.prefix_group) == {"prefix-0", "prefix-1", "prefix-2"}
    assert a.prefix_group != with_shared_prefix(cols, 8, num_groups=3).prefix_group


def test_shared_prefix_drops_token_ids_that_no_longer_match():
    cols = Columns(np.zeros(1), np.array([2]), np.array([1]), prompt_ids=[(7, 8)], block_hashes=[(3,)])
    out = with_shared_prefix(cols, 4)
    assert out.prompt_ids is None and out.block_hashes is None and "sharing_note" in out.extra
    assert cols.prompt_ids == [(7, 8)]
    to_trace(out, "t", "test")


def test_multi_turn_truncates_history_as_in_the_brief():
    cols = multi_turn([10, 20, 30], [5, 5, 5], 3, max_prompt_len=30)
    assert cols.prompt_len.tolist() == [10, 30, 30]  # 10; min(30, 10+5+20); min(30, 10+5+20+5+30)
    assert cols.output_len.tolist() == [5, 5, 5]
    assert cols.turn.tolist() == [0, 1, 2] and cols.conversation_id == ["c0"] * 3
    assert cols.arrival_s.tolist() == [0.0] * 3


def test_multi_turn_splits_conversations():
    cols = multi_turn([10, 20, 30, 7, 8], [5, 5, 5, 1, 2], 2)
    assert cols.prompt_len.tolist() == [10, 35, 30, 42, 8]
    assert cols.turn.tolist() == [0, 1, 0, 1, 0]
    assert cols.conversation_id == ["c0", "c0", "c1", "c1", "c2"]
    cols = multi_turn([10, 20, 30, 7, 8], [5, 5, 5, 1, 2], [1, 3, 1])
    assert cols.prompt_len.tolist() == [10, 20, 55, 67, 8]
    assert cols.turn.tolist() == [0, 0, 1, 2, 0]
    assert cols.conversation_id == ["c0", "c1", "c1", "c1", "c2"]
    trace = to_trace(cols, "chat", "test")
    assert trace.requests[3].conversation_id == "c1" and trace.requests[3].turn == 2


def test_multi_turn_default_is_the_papers_1024_token_history():
    cols = multi_turn([600, 600, 600], [300, 300, 300], 3)
    assert cols.prompt_len.tolist() == [600, 1024, 1024]


def test_block_hash_prefixes_on_a_hand_example():
    cols = Columns(
        arrival_s=np.zeros(7),
        prompt_len=np.array([10, 12, 10, 5, 12, 3, 1]),
        output_len=np.ones(7, dtype=np.int64),
        block_hashes=[(1, 2, 3), (1, 2, 4), (1, 2, 3), None, (5, 2, 3), (2,), (1,)],
    )
    before = copy.deepcopy(cols)
    out = prefix_groups_from_block_hashes(cols, 4)
    # row 1 matches (1, 2); row 2 all of (1, 2, 3) = 12 tokens capped at prompt - 1 = 9;
    # rows 4 and 5 reuse hash 2 only *after a different first block*: no prefix match.
    assert out.prefix_len.tolist() == [0, 8, 9, 0, 0, 0, 0]
    assert out.prefix_group == ["1", "1", "1", None, "5", "2", "1"]
    assert same(cols, before)
    to_trace(out, "t", "test", hash_block_size=4)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: with_parallel_samples(small(), 0), "n must be an integer >= 1, got 0"),
        (lambda: with_beam_width(small(), 1.5), "beam_width must be an integer >= 1, got 1.5"),
        (lambda: with_shared_prefix(small(), 0), "prefix_len must be an integer >= 1, got 0"),
        (lambda: with_shared_prefix(small(), "fewshot-9"), "unknown prefix preset 'fewshot-9'"),
        (lambda: with_shared_prefix(small(), 8, num_groups=0), "num_groups must be an integer >= 1"),
        (lambda: multi_turn([1, 2], [1], 1), "queries and answers must be equally long, got 2 and 1"),
        (lambda: multi_turn([1, 0], [1, 1], 1), "queries must hold integers >= 1, got 0 at index 1"),
        (lambda: multi_turn([1, 2], [1, 1], 0), "turns_per_conversation must be an integer >= 1"),
        (lambda: multi_turn([1, 2], [1, 1], [1, 2]), "turns_per_conversation must sum to 2 turns, got 3"),
        (lambda: multi_turn([1, 2], [1, 1], 1, 0), "max_prompt_len must be an integer >= 1, got 0"),
        (lambda: prefix_groups_from_block_hashes(small(), 512), "need a trace with block_hashes"),
        (lambda: prefix_groups_from_block_hashes(small(), 0), "block_size must be an integer >= 1"),
    ],
)
def test_bad_parameters_are_named(make, message):
    with pytest.raises(KvbenchError) as err:
        make()
    assert message in str(err.value)
