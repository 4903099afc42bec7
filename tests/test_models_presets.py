"""Today's model presets: each one's KV bytes per token per layer group, exactly (they follow from
config.json), and its parameter count against the total its model card or report publishes
(within 2 %: which total is named beside each)."""

from __future__ import annotations

import pytest

from kvbench.errors import KvbenchError
from kvbench.models import get_model

# (preset, [(group kind, layers, bytes per token of the group, window)], published total, which total)
PRESETS = [
    # Qwen3-0.6B model card: 0.6 B parameters, 0.44 B non-embedding
    ("qwen3-0.6b", [("full", 28, 28 * 2 * 8 * 128 * 2, None)], 0.44e9, "non-embedding"),
    # Qwen3-8B model card: 8.2 B parameters, 6.95 B non-embedding
    ("qwen3-8b", [("full", 36, 36 * 2 * 8 * 128 * 2, None)], 6.95e9, "non-embedding"),
    # Mistral 7B announcement (mistral.ai, Sept. 2023): 7.3 B parameters
    ("mistral-7b", [("sliding", 32, 32 * 2 * 8 * 128 * 2, 4096)], 7.3e9, "total"),
    # Gemma 2 report (arXiv 2408.00118), Table 2: 9B has 8,324,201,984 non-embedding parameters
    (
        "gemma-2-9b",
        [("sliding", 21, 21 * 2 * 8 * 256 * 2, 4096), ("full", 21, 21 * 2 * 8 * 256 * 2, None)],
        8_324_201_984,
        "non-embedding",
    ),
    # Gemma 3 report (arXiv 2503.19786), Table 1: 1B has 698 M non-embedding parameters
    (
        "gemma-3-1b",
        [("sliding", 22, 22 * 2 * 1 * 256 * 2, 512), ("full", 4, 4 * 2 * 1 * 256 * 2, None)],
        698e6,
        "non-embedding",
    ),
    # Gemma 3 report, Table 1: 12B has 10,759 M non-embedding parameters (the vision encoder apart)
    (
        "gemma-3-12b",
        [("sliding", 40, 40 * 2 * 8 * 256 * 2, 1024), ("full", 8, 8 * 2 * 8 * 256 * 2, None)],
        10_759e6,
        "non-embedding",
    ),
    # DeepSeek-V2-Lite model card: 15.7 B total parameters (2.4 B activated)
    ("deepseek-v2-lite", [("mla", 27, 27 * (512 + 64) * 2, None)], 15.7e9, "total"),
    # Llama 3.1 model card: 8 B; the checkpoint holds 8.03 B (8,030,261,248) parameters
    ("llama-3.1-8b", [("full", 32, 32 * 2 * 8 * 128 * 2, None)], 8.03e9, "total"),
]


@pytest.mark.parametrize(("name", "groups", "published", "which"), PRESETS, ids=[p[0] for p in PRESETS])
def test_presets_match_their_configs_and_model_cards(name, groups, published, which):
    model = get_model(name)
    assert [
        (g.kind, len(g.layer_ids), g.bytes_per_token, getattr(g.layer, "window", None)) for g in model.groups
    ] == groups
    assert model.kv_bytes_per_token == sum(group[2] for group in groups)
    counted = model.num_params - (model.embedding_params if which == "non-embedding" else 0)
    assert counted == pytest.approx(published, rel=0.02)


def test_the_exact_counts_the_reports_print_are_met_to_the_parameter():
    """Where a report prints every digit, the architecture arithmetic lands on it exactly."""
    gemma2 = get_model("gemma-2-9b")
    assert gemma2.num_params - gemma2.embedding_params == 8_324_201_984  # Gemma 2 report, Table 2
    assert get_model("llama-3.1-8b").num_params == 8_030_261_248  # the checkpoint's tensors


def test_published_model_shapes_keep_their_windows_and_rotary_bases():
    gemma3 = get_model("gemma-3-12b")
    assert gemma3.rope_theta == 1_000_000.0 and gemma3.local_rope_theta == 10_000.0
    assert [i for i in range(48) if i not in gemma3.window_layers] == [5, 11, 17, 23, 29, 35, 41, 47]
    assert get_model("gemma-2-9b").window_layers == tuple(range(0, 42, 2))  # local first, then global
    assert get_model("llama-3.1-8b").max_len == 131_072 and get_model("mistral-7b").window == 4096


def test_a_hybrid_preset_holds_less_than_its_arena_slots_beyond_the_window():
    model = get_model("gemma-3-12b")  # 8 global layers of 8,192 bytes, 40 local ones of 1,024 tokens
    assert model.kv_bytes_held(1024) == 1024 * model.kv_bytes_per_token
    assert model.kv_bytes_held(32_768) == 32_768 * 65_536 + 1024 * 327_680
    ratio = model.kv_bytes_held(32_768) / (32_768 * model.kv_bytes_per_token)
    assert ratio == pytest.approx(0.1927, abs=1e-4)  # a fifth of what a one-pool arena keeps


@pytest.mark.parametrize("name", ["deepseek-v2-lite"])
def test_a_real_run_refuses_a_shape_kvbench_does_not_decode(name):
    """Sized and simulated, not decoded (here: experts whose router top-k is unknown): building
    the model fails with one line, before any memory is allocated, rather than decoding a model
    of the wrong shape."""
    from dataclasses import replace

    import torch

    from kvbench.modeling.weights import random_model

    model = get_model(name)
    unrouted = replace(model, moe=replace(model.moe, top_k=0))
    assert model.decoded and not unrouted.decoded
    with pytest.raises(KvbenchError, match=rf"^--model {name}: kvbench decodes OPT and Llama .* not run$"):
        random_model(unrouted, torch.float32, torch.device("cpu"))


def test_a_hybrid_preset_simulates_with_the_real_engines():
    """The simulator sizes its arena from `kv_bytes_per_token` (window layers treated as full)."""
    from kvbench.config import RunConfig
    from kvbench.simulate import simulate
    from workloads.spec import WorkloadSpec

    workload = WorkloadSpec(source="fixed:prompt=300,output=20", num_requests=6, rate=2.0)
    result = simulate(RunConfig(engine="paged", model="gemma-3-1b", workload=workload, kv_cache_gib=0.05))
    slots = int(0.05 * (1 << 30)) // 26_624
    assert result.summary["num_slots"] == slots == 2016
    assert result.summary["completed"] == 6


def _row(model) -> str:
    groups = "; ".join(
        f"{g.kind} {len(g.layer_ids)} x {g.layer.bytes_per_token:,} = {g.bytes_per_token:,}"
        for g in model.groups
    )
    window = f"{model.window:,}" if model.window_layers else "–"
    kept = model.kv_bytes_held(8192) // 8192
    decoded = "yes" if model.decoded else "no"
    return (
        f"| `{model.name}` | {model.family} | {groups} | {window} | {model.kv_bytes_per_token:,} | {kept:,} "
        f"| {model.num_params / 1e9:.2f} B | {decoded} |"
    )


def test_the_presets_table_of_docs_models_is_the_code():
    from pathlib import Path

    from kvbench.models import MODELS

    text = (Path(__file__).resolve().parent.parent / "docs" / "MODELS.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    table = [row for row in rows if row.split(" | ")[0].strip("| `") in MODELS]
    assert table == [_row(model) for model in MODELS.values()]
