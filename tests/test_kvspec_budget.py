"""A KV budget per layer kind: the one arena every engine has today (window layers treated as
full) against per-group pools (what a hybrid allocator keeps), with exact numbers on Gemma 3."""

from __future__ import annotations

import pytest

from kvbench.budget import GIB, budget_by_layer_kind, budget_from_gib
from kvbench.errors import KvbenchError
from kvbench.models import get_model


def test_gemma3_at_8k_tokens_holds_three_and_a_half_times_the_sequences_in_per_group_pools():
    model = get_model("gemma-3-12b")  # 8 global layers (65,536 B/token), 40 local (327,680 B/token, 1,024)
    split = budget_by_layer_kind(budget_from_gib(12, model), model, 8192)
    assert split.one_pool_slots == 12 * GIB // 393_216 == 32_768
    assert split.one_pool_sequences == 4
    # a sequence of 8,192 needs 2**29 bytes of the global group and 2**26 x 5 of the local one:
    # shares 8/13 and 5/13 of the budget
    assert [pool.group.kind for pool in split.pools] == ["sliding", "full"]  # layer 0 is local
    by_kind = {pool.group.kind: pool for pool in split.pools}
    assert by_kind["full"].budget_bytes == 12 * GIB * 8 // 13 == 7_929_170_392
    assert by_kind["full"].num_slots == 7_929_170_392 // 65_536 == 120_989
    assert by_kind["sliding"].budget_bytes == 12 * GIB * 5 // 13 == 4_955_731_495
    assert by_kind["sliding"].num_slots == 4_955_731_495 // 327_680 == 15_123
    assert split.pooled_sequences == 14 == 12 * GIB // model.kv_bytes_held(8192)
    assert sum(pool.budget_bytes for pool in split.pools) <= split.budget_bytes


def test_inside_the_window_the_pools_hold_what_the_one_arena_holds():
    model = get_model("gemma-3-12b")
    split = budget_by_layer_kind(budget_from_gib(12, model), model, 1024)
    assert [pool.num_slots for pool in split.pools] == [32_768, 32_768]  # shares 5/6 and 1/6
    assert split.pooled_sequences == split.one_pool_sequences == 32


def test_a_full_attention_model_has_one_pool_equal_to_its_arena():
    model = get_model("opt-13b")
    budget = budget_from_gib(12, model)
    split = budget_by_layer_kind(budget, model, 2048)
    assert [(pool.group.kind, pool.budget_bytes, pool.num_slots) for pool in split.pools] == [
        ("full", 12 * GIB, 15_728)
    ]
    assert split.pooled_sequences == split.one_pool_sequences == 7  # Orca (Max) fits 7 requests


def test_mistral_beyond_its_window_holds_sequences_in_window_sized_pieces():
    model = get_model("mistral-7b")  # every layer local: 4,096 tokens of 131,072 bytes
    split = budget_by_layer_kind(budget_from_gib(16, model), model, 32_768)
    assert split.one_pool_slots == 131_072 and split.one_pool_sequences == 4
    assert split.pools[0].num_slots == 131_072 and split.pooled_sequences == 32


@pytest.mark.parametrize("seq_len", [0, -5, 2.5])
def test_the_sequence_length_must_be_a_positive_integer(seq_len):
    model = get_model("gemma-3-1b")
    with pytest.raises(KvbenchError, match="sequence length .* integer >= 1"):
        budget_by_layer_kind(budget_from_gib(1, model), model, seq_len)
