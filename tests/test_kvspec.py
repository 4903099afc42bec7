"""The per-layer KV specification: what each layer keeps per token, the groups a hybrid allocator
pools, and the totals the rest of kvbench reads (`kv_bytes_per_token` unchanged for OPT/Llama)."""

from __future__ import annotations

import pytest

from kvbench.kvspec.layers import FullAttention, KVGroup, LatentAttention, SlidingWindow, kv_groups
from kvbench.kvspec.model import MlaShape, ModelSpec
from kvbench.models import get_model

# a Gemma-3-shaped toy: 12 layers, every 6th global, 2 KV heads of 32, a 16-token window
TOY = ModelSpec(
    "toy-gemma3", "gemma3", 12, 64, 4, 2, 128, 512, 4096, head_size=32, window=16,
    window_layers=(0, 1, 2, 3, 4, 6, 7, 8, 9, 10), tied_embeddings=True,
)  # fmt: skip


@pytest.mark.parametrize("name", ["opt-13b", "llama-13b", "llama-3-8b", "tiny-opt", "tiny-llama"])
def test_a_2023_model_is_one_group_of_full_layers_and_keeps_its_bytes_per_token(name):
    model = get_model(name)
    layer = FullAttention(model.num_kv_heads, model.hidden // model.num_heads, model.dtype_bytes)
    assert model.layers == (layer,) * model.num_layers
    assert model.groups == (KVGroup(layer, tuple(range(model.num_layers))),)
    # the formula every module read before per-layer specs existed
    assert model.kv_bytes_per_token == 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
    assert model.full_bytes_per_token == model.kv_bytes_per_token and model.window_bytes_per_token == 0
    assert model.kv_bytes_held(5000) == 5000 * model.kv_bytes_per_token
    assert model.decoded


def test_a_sliding_window_layer_holds_only_its_window():
    layer = SlidingWindow(kv_heads=8, head_dim=256, window=1024)
    assert layer.bytes_per_token == 2 * 8 * 256 * 2 == 8192
    assert [layer.tokens_held(n) for n in (1, 1023, 1024, 1025, 100_000)] == [1, 1023, 1024, 1024, 1024]
    assert FullAttention(8, 256).tokens_held(100_000) == 100_000


def test_an_mla_layer_stores_the_latent_and_the_rotary_part_once_for_all_heads():
    layer = LatentAttention(latent=512, rope=64)
    assert layer.bytes_per_token == (512 + 64) * 2 == 1152
    assert LatentAttention(512, 64, dtype_bytes=1).bytes_per_token == 576  # an fp8 cache
    assert layer.tokens_held(70_000) == 70_000


def test_layers_of_one_kind_and_shape_form_one_group_in_order_of_their_first_layer():
    full, short, long = FullAttention(2, 32), SlidingWindow(2, 32, 16), SlidingWindow(2, 32, 64)
    groups = kv_groups((short, short, full, long, short, full))
    assert [(g.kind, g.layer_ids) for g in groups] == [
        ("sliding", (0, 1, 4)),
        ("full", (2, 5)),
        ("sliding", (3,)),
    ]
    assert groups[0].bytes_per_token == 3 * 256 and groups[0].bytes_held(100) == 3 * 256 * 16
    assert groups[2].bytes_held(100) == 256 * 64 and groups[1].bytes_held(100) == 2 * 256 * 100


def test_a_hybrid_model_splits_its_bytes_between_full_and_window_layers():
    per_layer = 2 * 2 * 32 * 2  # K and V, 2 heads of 32, fp16
    assert [(g.kind, g.layer_ids) for g in TOY.groups] == [
        ("sliding", (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)),
        ("full", (5, 11)),
    ]
    assert TOY.full_bytes_per_token == 2 * per_layer == 512
    assert TOY.window_bytes_per_token == 10 * per_layer == 2560
    assert TOY.kv_bytes_per_token == 12 * per_layer  # one arena slot: every layer treated as full
    assert TOY.kv_bytes_held(10) == 10 * 3072  # inside the window everything is kept
    assert TOY.kv_bytes_held(100) == 512 * 100 + 2560 * 16 == 92_160
    for n in (1, 15, 16, 17, 4096):
        assert TOY.kv_bytes_held(n) == sum(group.bytes_held(n) for group in TOY.groups)
    assert TOY.decoded  # its windows are decoded too (tests/test_families.py)


def test_an_mla_model_has_one_latent_group():
    model = ModelSpec(
        "toy-mla", "deepseek", 3, 64, 4, 4, 128, 512, 4096,
        mla=MlaShape(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
    )  # fmt: skip
    assert model.groups == (KVGroup(LatentAttention(16, 8), (0, 1, 2)),)
    assert model.kv_bytes_per_token == 3 * (16 + 8) * 2 == model.kv_bytes_held(1)
    # the projections: q (no latent), kv down + its norm, kv up, o; 2 norms; dense MLP; untied
    attention = 64 * 4 * 24 + 64 * 24 + 16 + 16 * 4 * 32 + 4 * 16 * 64
    assert model.num_params == 3 * (attention + 3 * 64 * 128 + 2 * 64) + 2 * 512 * 64 + 64


@pytest.mark.parametrize(
    "changes",
    [{"window_layers": (0, 12)}, {"window_layers": (3, 1)}, {"window": 0}, {"window_layers": (-1,)}],
)
def test_window_layers_must_name_layers_of_the_model_and_have_a_window(changes):
    from dataclasses import replace

    with pytest.raises(ValueError, match="toy-gemma3: window layers"):
        replace(TOY, **changes)
