"""Fused elementwise kernels of a Llama layer: RMSNorm, rotary embedding, SiLU-and-multiply.

In a small model's decode step the matrix products are short and the elementwise ops are
many: PyTorch runs RMSNorm as 8 kernels and a rotary embedding as about 16, each a few
microseconds even inside a CUDA graph, which adds up to more than the step's real work. One
kernel each keeps the step close to its memory floor. Every kernel computes in fp32 and
rounds where the PyTorch reference (`kernels.reference`) rounds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, stride_x, stride_out, size, eps, BLOCK: tl.constexpr
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < size
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / size + eps)
    normed = (x * inv).to(out_ptr.dtype.element_ty).to(tl.float32)  # the reference rounds here
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * normalize(x)` over the last dim of x `[T, hidden]` -> `[T, hidden]`."""
    out = torch.empty_like(x)
    if x.shape[0]:
        size = x.shape[-1]
        _rms_norm_kernel[(x.shape[0],)](
            x, weight, out, x.stride(0), out.stride(0), size, eps, BLOCK=triton.next_power_of_2(size)
        )
    return out


@triton.jit
def _rotary_kernel(
    x_ptr, pos_ptr, inv_freq_ptr, stride_t, stride_h, heads, HALF: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    """Token t: rotate the halves (x1, x2) of every head by angle position * inv_freq."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    i = tl.arange(0, BLOCK_HALF)
    h = tl.arange(0, BLOCK_H)[:, None]
    angle = pos * tl.load(inv_freq_ptr + i, mask=i < HALF, other=0.0)  # [HALF]
    cos = tl.cos(angle)[None, :]
    sin = tl.sin(angle)[None, :]
    mask = (h < heads) & (i[None, :] < HALF)
    first = x_ptr + t * stride_t + h * stride_h + i[None, :]
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    # the reference rounds cos and sin to x's dtype first
    cos = cos.to(x1.dtype).to(tl.float32)
    sin = sin.to(x1.dtype).to(tl.float32)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(first, (a * cos - b * sin).to(x1.dtype), mask=mask)
    tl.store(first + HALF, (b * cos + a * sin).to(x1.dtype), mask=mask)


def rotary_(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate x `[T, heads, D]` in place at `positions` `[T]` (halves rotated); returns x."""
    tokens, heads, dim = x.shape
    if tokens:
        _rotary_kernel[(tokens,)](
            x, positions, inv_freq, x.stride(0), x.stride(1), heads, HALF=dim // 2,
            BLOCK_H=triton.next_power_of_2(heads), BLOCK_HALF=triton.next_power_of_2(dim // 2),
        )  # fmt: skip
    return x


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, stride_g, stride_u, stride_o, size, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < size
    g = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0)
    u = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)  # the reference rounds silu(g)
    tl.store(out_ptr + row * stride_o + cols, (act * u.to(tl.float32)).to(g.dtype), mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up`, both `[T, F]` -> `[T, F]`."""
    out = torch.empty_like(gate)
    rows, size = gate.shape
    if rows:
        block = 1024
        _silu_mul_kernel[(rows, triton.cdiv(size, block))](
            gate, up, out, gate.stride(0), up.stride(0), out.stride(0), size, BLOCK=block
        )
    return out
