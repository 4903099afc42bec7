"""Figure 19's microbenchmark (benchmarks/preemption_costs.py): the recompute it times is a real
prefill through the block table a preempted request's scattered blocks give, and every row prices
both ways at every block size and request length asked for."""

from __future__ import annotations

import json
import random

import pytest
import torch

from benchmarks.preemption_costs import compute_floor_s, main, prefill_metadata
from kvbench.budget import get_gpu
from kvbench.modeling.arena import KVArena
from kvbench.modeling.weights import random_model
from kvbench.models import ModelSpec, get_model

SPEC = ModelSpec("tiny", "llama", 2, 32, 4, 2, 64, 128, 64)
TOKENS = 11  # a last block left partly empty at block size 4


def _prefill(model, blocks: list[int], block_size: int, ids: torch.Tensor) -> tuple[KVArena, torch.Tensor]:
    arena = KVArena(SPEC, 16 * block_size, torch.float32, torch.device("cpu"))
    meta = prefill_metadata(blocks, block_size, len(ids), torch.device("cpu"))
    with torch.inference_mode():
        logits = model(ids, torch.arange(len(ids)), meta, arena)  # [1, V]
    return arena, logits


@pytest.mark.parametrize("block_size", [1, 4])
def test_a_recomputed_prefill_stores_each_token_where_its_block_table_says(block_size):
    model = random_model(SPEC, torch.float32, torch.device("cpu"), seed=0)
    ids = torch.randint(0, SPEC.vocab, (TOKENS,), generator=torch.Generator().manual_seed(0))  # [T]
    # the reference: one block holding the request from slot 0
    whole, reference = _prefill(model, [0], 16, ids)
    n = -(-TOKENS // block_size)
    blocks = random.Random(block_size).sample(range(16), n)  # scattered, as a running engine leaves them
    arena, logits = _prefill(model, blocks, block_size, ids)
    torch.testing.assert_close(logits, reference)
    for t in range(TOKENS):
        slot = blocks[t // block_size] * block_size + t % block_size
        torch.testing.assert_close(arena.k[:, slot], whole.k[:, t])
        torch.testing.assert_close(arena.v[:, slot], whole.v[:, t])
    stored = {blocks[t // block_size] * block_size + t % block_size for t in range(TOKENS)}
    untouched = [s for s in range(arena.k.shape[1]) if s not in stored]
    assert not arena.k[:, untouched].any() and not arena.v[:, untouched].any()


def test_every_row_prices_both_ways_against_the_compute_floor(tmp_path, capsys):
    out = tmp_path / "costs.json"
    rows = main(["--device", "cpu", "--model", "tiny-llama", "--tokens", "16,40", "--block-sizes", "1,8",
                 "--repeats", "2", "--dtype", "float32", "--out", str(out)])  # fmt: skip
    assert [(r["tokens"], r["block_size"]) for r in rows] == [(16, 1), (16, 8), (40, 1), (40, 8)]
    assert all(r["swap_over_recompute"] == pytest.approx(r["swap_ms"] / r["recompute_ms"]) for r in rows)
    floor = compute_floor_s(get_model("tiny-llama"), get_gpu("h200-141gb").fp16_flops, 1)
    assert [r["recompute_floor_ms"] for r in rows] == pytest.approx(
        [1e3 * t * floor for t in (16, 16, 40, 40)]
    )
    assert json.loads(out.read_text())["rows"] == rows
    assert "swap/rec" in capsys.readouterr().out


def test_the_compute_floor_of_opt_13b_on_the_h200():
    """12.59 B weights outside OPT-13B's embeddings (its tied head and 2,050 learned positions),
    2 FLOPs each a token, at the H200's 989 TFLOP/s dense fp16: 25.45 us a token."""
    floor = compute_floor_s(get_model("opt-13b"), get_gpu("h200-141gb").fp16_flops, 64)
    assert floor == pytest.approx(1.629e-3, rel=1e-3)
