"""Qwen2, Qwen3, Mistral and Gemma 2/3 decoded by kvbench against transformers, on the CPU in fp32.

Each family: a tiny transformers model with every weight random (biases and norm scales
included, so a swapped q/k bias or norm shows), saved as safetensors and loaded through
`load_checkpoint` (names and shapes checked), then a prompt prefilled in two chunks (the second
attending to the stored first) and decoded step by step, paged and contiguous, logits within
1e-4. Windowed families run contexts well past their window.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kvbench.modeling.arena import KVArena  # noqa: E402
from kvbench.modeling.attention import AttentionMetadata  # noqa: E402
from kvbench.modeling.weights import load_checkpoint  # noqa: E402
from kvbench.models import ModelSpec  # noqa: E402

CPU = torch.device("cpu")
LENGTH = 24  # positions compared; windows are 8 tokens, so most positions see only part of the context
TINY = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=128, rms_norm_eps=1e-6,
)  # fmt: skip


def hf_config(kind: str):
    if kind == "qwen2":
        return transformers.Qwen2Config(
            **TINY, num_hidden_layers=2, rope_theta=5000.0, tie_word_embeddings=False
        )  # fmt: skip
    if kind == "qwen2-window":  # use_sliding_window: layers from max_window_layers on slide
        return transformers.Qwen2Config(
            **TINY, num_hidden_layers=3, use_sliding_window=True, sliding_window=8, max_window_layers=1,
            tie_word_embeddings=False,
        )  # fmt: skip
    if kind == "qwen3":  # head_dim 32, not 64 / 4; tied embeddings as Qwen3-0.6B
        return transformers.Qwen3Config(**TINY, num_hidden_layers=2, head_dim=32, tie_word_embeddings=True)
    if kind == "mistral":  # every layer sees its last 8 positions; head_dim of its own (as Mistral Nemo)
        return transformers.MistralConfig(**TINY, num_hidden_layers=2, sliding_window=8, head_dim=32)
    gemma = dict(TINY, head_dim=32, query_pre_attn_scalar=24, sliding_window=8)  # 24: not head_dim
    if kind == "gemma2":  # local, global, ...; caps small enough that tanh bends random scores
        return transformers.Gemma2Config(
            **gemma, num_hidden_layers=4, attn_logit_softcapping=0.5, final_logit_softcapping=0.3
        )  # fmt: skip
    if kind == "gemma3":  # five local layers (rotary base 10,000), then a global one (1,000,000)
        return transformers.Gemma3TextConfig(**gemma, num_hidden_layers=6)
    raise ValueError(kind)


def reference(tmp_path, kind: str):
    """The transformers model as its files say (saved, reloaded), and the folder."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(kind), attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:  # transformers starts them at 0 and 1
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(tmp_path / kind, safe_serialization=True)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / kind, local_files_only=True, attn_implementation="eager"
    )
    return reloaded.eval(), tmp_path / kind


def compare(ref, model, *, paged: bool, chunks=(11, 15), forget_before_window=False, backend="torch") -> None:
    """Two sequences: positions [0, 11) then [11, 15) prefilled, then decoded one by one up to
    LENGTH; each step's last logits against transformers' full forward pass.
    `forget_before_window`: before each step, NaN into the slots of every position no query of
    the step may see (older than the window of its earliest query)."""
    spec = model.spec
    ids = torch.randint(0, spec.vocab, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(ids).logits.float()  # [2, LENGTH, V]
    arena = KVArena(spec, 128, torch.float32, CPU)
    arena.fill(float("nan"))  # anything read before being written would show
    # block size 4: sequence 0 in blocks [9, 2, 7, 0, 12, 5], sequence 1 in [1, 10, 3, 14, 6, 11]
    tables = torch.tensor([[9, 2, 7, 0, 12, 5], [1, 10, 3, 14, 6, 11]], dtype=torch.int32)
    starts = torch.tensor([70, 30])
    addressing = {"block_tables": tables, "block_size": 4} if paged else {"starts": starts}

    def slots(lo: int, hi: int) -> torch.Tensor:
        pos = torch.arange(lo, hi)
        if paged:
            return torch.cat([tables[b, pos // 4].long() * 4 + pos % 4 for b in range(2)])
        return torch.cat([starts[b] + pos for b in range(2)])

    def forward(lo: int, hi: int) -> torch.Tensor:
        n = hi - lo
        if forget_before_window and lo - spec.window + 1 > 0:
            old = slots(0, lo - spec.window + 1)
            arena.k[:, old], arena.v[:, old] = float("nan"), float("nan")
        meta = AttentionMetadata(
            n > 1, slots(lo, hi), torch.tensor([0, n, 2 * n]), torch.tensor([hi, hi], dtype=torch.int32),
            max_new=n, num_splits=2, backend=backend, **addressing,
        )  # fmt: skip
        with torch.no_grad():
            return model(ids[:, lo:hi].reshape(-1), torch.arange(lo, hi).repeat(2), meta, arena)

    first, second = chunks
    assert (forward(0, first) - expected[:, first - 1]).abs().max() < 1e-4
    assert (forward(first, second) - expected[:, second - 1]).abs().max() < 1e-4  # reads the stored prefix
    for step in range(second, LENGTH):
        assert (forward(step, step + 1) - expected[:, step]).abs().max() < 1e-4, f"decode step {step}"


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("kind", ["qwen2", "qwen2-window", "qwen3", "mistral", "gemma2", "gemma3"])
def test_logits_equal_transformers_for_prefill_and_decode(tmp_path, kind, paged):
    ref, folder = reference(tmp_path, kind)
    model = load_checkpoint(folder, torch.float32, CPU)
    assert model.spec.family == kind.removesuffix("-window")
    compare(ref, model, paged=paged)


def test_qwen3_keeps_its_own_head_size_and_ties_its_head():
    """head_dim 32 on hidden 64 / 4 heads: the arena and projections use 32, and the LM head is
    the embedding (one tensor)."""
    from kvbench.modeling.hf_config import spec_from_hf_config

    cfg = hf_config("qwen3").to_dict()
    spec = spec_from_hf_config(cfg, "tiny-qwen3")
    assert spec.head_dim == 32 and spec.tied_embeddings and spec.decoded
    from kvbench.modeling.weights import random_model

    model = random_model(spec, torch.float32, CPU)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.model.layers[0].self_attn.qkv_proj.weight.shape == (4 * 32 + 2 * 2 * 32, 64)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
def test_a_window_layer_reads_nothing_before_its_window(tmp_path, paged):
    """Mistral with a window of 8: every slot of positions older than the window is poisoned
    (NaN) before each step once the prompt is in: the logits still match, so nothing read them.
    Prefill chunks [0, 11) and [11, 15); a block of 4 wholly before the window is skipped too."""
    ref, folder = reference(tmp_path, "mistral")
    model = load_checkpoint(folder, torch.float32, CPU)
    compare(ref, model, paged=paged, forget_before_window=True)


GEMMA3_TINY = ModelSpec(
    "tiny-gemma3", "gemma3", 6, 64, 4, 2, 128, 512, 64, norm_eps=1e-6, rope_theta=1e6, head_size=32,
    window=8, window_layers=(0, 1, 2, 3, 4), local_rope_theta=10000.0, tied_embeddings=True, query_scale=24.0,
)  # fmt: skip


def test_every_engine_decodes_the_same_greedy_tokens_on_a_gemma3_shaped_model():
    """The real engine loop on the CPU (PyTorch attention), arena poisoned with NaN: contexts up
    to 38 tokens run past the local layers' window of 8, through each engine's addressing."""
    from tests.support import greedy_tokens_by_engine
    from tests.test_modeling import small_trace

    engines = ("static", "orca-max", "orca-pow2", "orca-oracle", "paged", "paged-static", "paged-prefix")
    tokens = greedy_tokens_by_engine(GEMMA3_TINY, engines)
    assert max(r.prompt_len + r.output_len for r in small_trace().requests) > 3 * GEMMA3_TINY.window
    assert len(set(map(tuple, tokens.values()))) == 1, f"engines disagree on greedy tokens: {tokens}"
