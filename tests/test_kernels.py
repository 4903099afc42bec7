"""Every Triton kernel against its PyTorch reference (`kernels/reference.py`).

On CPU the kernels run in Triton's interpreter (small shapes); on a GPU the same tests run
compiled (marked `gpu`). Each check draws fresh random inputs, poisons the output and every
arena slot no sequence owns with NaN, and compares with a stated bound:

- bf16: max abs error <= 2e-2, fp16: <= 4e-3 (outputs of softmax-weighted sums of values in
  [-1, 1]; both the kernel and the reference accumulate in fp32, the difference is one final
  rounding plus the order of summation and P's rounding to 16 bits);
- fp32 (the runner's CPU dtype): <= 1e-5.
"""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")

from kernels.decode_attention import decode_attention  # noqa: E402
from kernels.extend_attention import extend_attention  # noqa: E402
from kernels.kv_store import store_kv  # noqa: E402
from kernels.reference import decode_attention_ref, extend_attention_ref, store_kv_ref  # noqa: E402

ALL_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5}
DEVICES = [
    pytest.param(
        torch.device("cpu"),
        id="cpu",
        marks=pytest.mark.skipif(
            os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors need Triton's interpreter"
        ),
    ),
    pytest.param(
        torch.device("cuda"),
        id="cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")],
    ),
]


class Arena:
    """A NaN-poisoned arena `[S, Hkv, D]` holding random K/V only where sequences live.

    Paged: each sequence's blocks are drawn at random from the whole arena (random page order,
    with free blocks in between). Contiguous: extents back to back with a poisoned gap.
    """

    def __init__(self, lens, kv_heads, head_dim, dtype, device, *, block_size=0, gen=None):
        self.lens = torch.tensor(lens, dtype=torch.int32, device=device)
        self.block_size = block_size
        widths = [max(n, 1) for n in lens]
        if block_size:
            need = [-(-w // block_size) for w in widths]
            total = 2 * sum(need) + 1  # half the blocks stay free (poisoned)
            order = torch.randperm(total, generator=gen)
            tables, at = [], 0
            for n in need:
                tables.append(order[at : at + n].tolist() + [0] * (max(need) - n))
                at += n
            self.tables = torch.tensor(tables, dtype=torch.int32, device=device)  # [B, max_blocks]
            self.starts = None
            slots = total * block_size
        else:
            starts, at = [], 3
            for w in widths:
                starts.append(at)
                at += w + 2  # a poisoned gap after each extent
            self.tables, self.starts = None, torch.tensor(starts, dtype=torch.int64, device=device)
            slots = at
        shape = (slots, kv_heads, head_dim)
        self.k = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.v = torch.full(shape, float("nan"), dtype=dtype, device=device)
        for b, n in enumerate(lens):
            where = self.slots(b, torch.arange(n, device=device))
            self.k[where] = (
                torch.rand((n, kv_heads, head_dim), generator=gen).mul(2).sub(1).to(dtype).to(device)
            )
            self.v[where] = (
                torch.rand((n, kv_heads, head_dim), generator=gen).mul(2).sub(1).to(dtype).to(device)
            )

    def slots(self, b: int, positions: torch.Tensor) -> torch.Tensor:
        if self.tables is not None:
            bs = self.block_size
            return self.tables[b].long()[positions // bs] * bs + positions % bs
        return self.starts[b] + positions

    def addressing(self) -> dict:
        return {"block_tables": self.tables, "block_size": self.block_size, "starts": self.starts}


def skip_interpreted_bf16(dtype: torch.dtype, device: torch.device) -> None:
    """Triton 3.6's interpreter computes `tl.dot` on bf16 tiles wrongly (NumPy has no bf16):
    on CPU, bf16 attention is checked through fp16 and fp32; the GPU runs the bf16 cases."""
    if dtype == torch.bfloat16 and device.type == "cpu":
        pytest.skip("Triton's CPU interpreter cannot run tl.dot on bf16; checked on the GPU")


def _rand(shape, dtype, device, gen):
    return torch.rand(shape, generator=gen).mul(2).sub(1).to(dtype).to(device)


CASES = [  # (context lengths, block size; 0 = contiguous, GQA ratio, head dim)
    ([1, 17, 64, 100], 16, 4, 64),
    ([1, 3, 130], 1, 1, 32),
    ([5, 300, 257], 256, 8, 16),
    ([1, 17, 64, 100], 0, 4, 64),
    ([33, 2, 129], 0, 8, 16),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("lens", "block_size", "group", "head_dim"), CASES)
def test_decode_attention_matches_reference(device, dtype, lens, block_size, group, head_dim):
    skip_interpreted_bf16(dtype, device)
    gen = torch.Generator().manual_seed(len(lens) * 1000 + block_size + group)
    kv_heads = 2
    arena = Arena(lens, kv_heads, head_dim, dtype, device, block_size=block_size, gen=gen)
    q = _rand((len(lens), kv_heads * group, head_dim), dtype, device, gen)
    expected = decode_attention_ref(
        q, arena.k, arena.v, arena.lens, scale=head_dim**-0.5, **arena.addressing()
    )
    for num_splits in (1, 3):  # direct, and split-KV with a merge (ranges of uneven fill)
        out = torch.full_like(q, float("nan"))
        decode_attention(
            q, arena.k, arena.v, arena.lens, scale=head_dim**-0.5, num_splits=num_splits, out=out,
            **arena.addressing(),
        )  # fmt: skip
        assert not out.isnan().any()
        assert (out.float() - expected.float()).abs().max() <= TOLERANCE[dtype]


def test_decode_attention_empty_context_gives_zeros():
    """A padding row (context 0) reads nothing and yields zeros, in both modes."""
    gen = torch.Generator().manual_seed(1)
    arena = Arena([0, 9], 1, 16, torch.float32, torch.device("cpu"), block_size=4, gen=gen)
    q = _rand((2, 2, 16), torch.float32, "cpu", gen)
    out = decode_attention(q, arena.k, arena.v, arena.lens, scale=0.25, num_splits=2, **arena.addressing())
    assert out[0].abs().max() == 0
    ref = decode_attention_ref(q, arena.k, arena.v, arena.lens, scale=0.25, **arena.addressing())
    assert (out - ref).abs().max() <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"]
)
@pytest.mark.parametrize("block_size", [0, 1, 16], ids=["contiguous", "bs1", "bs16"])
def test_extend_attention_matches_reference(device, dtype, block_size):
    """Fresh prompts (prefix 0), extensions of a stored prefix, and single new tokens."""
    skip_interpreted_bf16(dtype, device)
    gen = torch.Generator().manual_seed(7 + block_size)
    lens, new = [40, 1, 70, 33], [40, 1, 5, 1]  # context after the step, tokens new in it
    kv_heads, group, head_dim = 2, 4, 32
    arena = Arena(lens, kv_heads, head_dim, dtype, device, block_size=block_size, gen=gen)
    q = _rand((sum(new), kv_heads * group, head_dim), dtype, device, gen)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], device=device)
    kwargs = dict(scale=head_dim**-0.5, **arena.addressing())
    expected = extend_attention_ref(q, arena.k, arena.v, cu, arena.lens, **kwargs)
    out = torch.full_like(q, float("nan"))
    extend_attention(q, arena.k, arena.v, cu, arena.lens, max_new=max(new), out=out, **kwargs)
    assert not out.isnan().any()
    assert (out.float() - expected.float()).abs().max() <= TOLERANCE[dtype]


def test_extend_attention_without_prefix_is_causal_self_attention():
    """With no stored prefix the reference is plain causal attention over the new tokens."""
    gen = torch.Generator().manual_seed(3)
    n, heads, head_dim = 21, 2, 16
    arena = Arena([n], heads, head_dim, torch.float32, torch.device("cpu"), block_size=4, gen=gen)
    q = _rand((n, heads, head_dim), torch.float32, "cpu", gen)
    cu = torch.tensor([0, n])
    out = extend_attention(q, arena.k, arena.v, cu, arena.lens, scale=0.25, max_new=n, **arena.addressing())
    keys = arena.k[arena.slots(0, torch.arange(n))]  # [n, H, D]
    values = arena.v[arena.slots(0, torch.arange(n))]
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), is_causal=True, scale=0.25
    ).transpose(0, 1)  # [n, H, D]
    assert (out - sdpa).abs().max() <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_store_kv_writes_only_mapped_slots(device, dtype):
    gen = torch.Generator().manual_seed(5)
    slots, kv_heads, head_dim = 40, 3, 24  # non-power-of-two heads and dim: masked tiles
    slot_mapping = torch.tensor([7, -1, 0, 39, 12, -1], device=device)
    k = _rand((6, kv_heads, head_dim), dtype, device, gen)
    v = _rand((6, kv_heads, head_dim), dtype, device, gen)
    caches = [
        torch.full((slots, kv_heads, head_dim), float("nan"), dtype=dtype, device=device) for _ in range(4)
    ]
    store_kv(k, v, caches[0], caches[1], slot_mapping)
    store_kv_ref(k, v, caches[2], caches[3], slot_mapping)
    for kernel, ref in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(kernel.isnan(), ref.isnan())  # untouched slots still poisoned
        written = ~ref.isnan()
        assert torch.equal(kernel[written], ref[written])  # a copy: bit-exact
    assert caches[0].isnan().all(dim=(1, 2)).sum() == slots - 4


# ---------------------------------------------------------------- fused elementwise kernels
FUSED_TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5}  # one rounding


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=["bf16", "fp16", "fp32"])
def test_fused_kernels_match_reference(device, dtype):
    """RMSNorm (hidden 48: a masked tile), rotary (5 heads, dim 16) and SiLU-and-multiply."""
    from kernels.fused import rms_norm, rotary_, silu_mul
    from kernels.reference import rms_norm_ref, rotary_ref, silu_mul_ref
    from kvbench.modeling.ops import inv_freq

    gen = torch.Generator().manual_seed(11)
    x = _rand((7, 48), dtype, device, gen) * 3
    weight = _rand((48,), dtype, device, gen)
    bound = FUSED_TOLERANCE[dtype]
    normed = rms_norm(x, weight, 1e-5).float()
    assert (normed - rms_norm_ref(x, weight, 1e-5).float()).abs().max() <= bound * 3

    heads = _rand((7, 5, 16), dtype, device, gen)
    positions = torch.tensor([0, 1, 5, 100, 1000, 4095, 3], device=device)
    freqs = inv_freq(16, 10000.0, device)
    expected = rotary_ref(heads, positions, freqs)
    rotated = rotary_(heads.clone(), positions, freqs)
    assert (rotated.float() - expected.float()).abs().max() <= bound * 2

    gate, up = _rand((3, 1500), dtype, device, gen) * 4, _rand((3, 1500), dtype, device, gen)
    assert (silu_mul(gate, up).float() - silu_mul_ref(gate, up).float()).abs().max() <= bound * 4
