"""The elementwise ops of a Llama layer, fused Triton kernels on CUDA, PyTorch elsewhere.

Both implementations live in `kernels/` (`fused.py` and its references); which one runs
depends only on where the tensor is, so a model is numerically the same code on every engine.
"""

from __future__ import annotations

from functools import cache

import torch

from kernels import reference
from kvbench.kvspec.model import RopeScaling
from kvbench.modeling import rope
from kvbench.modeling.attention import triton_available


def _fused(x: torch.Tensor) -> bool:
    return x.is_cuda and triton_available()


@cache
def inv_freq(
    dim: int, theta: float, device: torch.device, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """Rotary frequencies `[D/2]` (scaled by a long-context checkpoint's `scaling`: `rope.py`),
    made once per device (before any CUDA graph capture)."""
    powers = theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)  # [D/2]
    return 1.0 / powers if scaling is None else rope.scaled_inv_freq(powers, theta, scaling)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _fused(x):
        from kernels.fused import rms_norm as kernel

        return kernel(x, weight, eps)
    return reference.rms_norm_ref(x, weight, eps)


def rotary(
    x: torch.Tensor, positions: torch.Tensor, theta: float, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """x `[T, heads, D]` rotated at `positions` `[T]` (the fused kernel works in place), cos and
    sin times YaRN's attention factor where `scaling` has one."""
    freqs = inv_freq(x.shape[-1], theta, x.device, scaling)
    factor = rope.attention_factor(scaling)
    if _fused(x):
        return rotary_fused(x, positions, freqs, factor)
    return reference.rotary_ref(x, positions, freqs, factor)


def rotary_fused(
    x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, factor: float
) -> torch.Tensor:
    """The Triton rotation of x `[T, heads, D]` (in place), then YaRN's attention `factor`: the
    kernel takes no cos/sin scale, and scaling its result is within one rounding of scaling cos
    and sin first (`rotary_ref`'s order, and transformers')."""
    from kernels.fused import rotary_

    x = rotary_(x, positions, freqs)
    return x if factor == 1.0 else x.mul_(factor)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if _fused(gate):
        from kernels.fused import silu_mul as kernel

        return kernel(gate, up)
    return reference.silu_mul_ref(gate, up)
