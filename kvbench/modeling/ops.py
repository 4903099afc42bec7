"""The elementwise ops of a Llama layer, fused Triton kernels on CUDA, PyTorch elsewhere.

Both implementations live in `kernels/` (`fused.py` and its references); which one runs
depends only on where the tensor is, so a model is numerically the same code on every engine.
"""

from __future__ import annotations

from functools import cache

import torch

from kernels import reference
from kvbench.modeling.attention import triton_available


def _fused(x: torch.Tensor) -> bool:
    return x.is_cuda and triton_available()


@cache
def inv_freq(dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """Rotary frequencies `[D/2]`, made once per device (before any CUDA graph capture)."""
    return 1.0 / theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _fused(x):
        from kernels.fused import rms_norm as kernel

        return kernel(x, weight, eps)
    return reference.rms_norm_ref(x, weight, eps)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x `[T, heads, D]` rotated at `positions` `[T]` (the fused kernel works in place)."""
    freqs = inv_freq(x.shape[-1], theta, x.device)
    if _fused(x):
        from kernels.fused import rotary_

        return rotary_(x, positions, freqs)
    return reference.rotary_ref(x, positions, freqs)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if _fused(gate):
        from kernels.fused import silu_mul as kernel

        return kernel(gate, up)
    return reference.silu_mul_ref(gate, up)
