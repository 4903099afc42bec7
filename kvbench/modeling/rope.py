"""Scaled rotary frequencies: YaRN (DeepSeek-V2, long-context Qwen) and Llama 3.1's "llama3".

A checkpoint pretrained on `original_max_len` positions and extended `factor` times keeps the
rotary pairs that turn many times over that context (they encode local order, and positions
past it look like ones already seen) and divides the frequency of those that turn less than
once (they would otherwise meet angles never trained on); the two types differ in where the
boundary lies and how they blend across it:

    yarn    pair i turns r_i = original_max_len * inv_freq_i / 2 pi times; r > beta_fast: kept,
            r < beta_slow: / factor, a linear ramp over the pair index between (its ends rounded
            out to whole pairs where `truncate`); cos and sin x an attention factor that restores
            the scores' sharpness (0.1 ln factor + 1, or DeepSeek's ratio of two mscales), and
            DeepSeek's softmax scale x mscale(factor, mscale_all_dim)^2
    llama3  wavelength 2 pi / inv_freq above original_max_len / low_freq_factor: / factor; below
            original_max_len / high_freq_factor: kept; smoothly between, by turns over it

Definitions as transformers' `modeling_rope_utils` and DeepSeek-V2's attention apply them, so a
checkpoint decodes to the same tokens (tests/test_rope_scaling.py holds kvbench to them).
"""

from __future__ import annotations

import math

import torch

from kvbench.kvspec.model import RopeScaling


def mscale(factor: float, weight: float = 1.0) -> float:
    """YaRN's magnitude correction of a context `factor` times longer (1 where nothing is stretched)."""
    return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0


def attention_factor(scaling: RopeScaling | None) -> float:
    """What cos and sin are multiplied by: 1 without scaling and for llama3."""
    if scaling is None or scaling.kind != "yarn":
        return 1.0
    if scaling.attention_factor:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:  # DeepSeek: equal weights cancel (V2-Lite: 1.0)
        return mscale(scaling.factor, scaling.mscale) / mscale(scaling.factor, scaling.mscale_all_dim)
    return mscale(scaling.factor)


def softmax_scale_factor(scaling: RopeScaling | None) -> float:
    """DeepSeek's attention multiplies its softmax scale by this: with `mscale_all_dim`, the
    correction the cos/sin ratio leaves out, given to every dimension of the score (1 otherwise)."""
    if scaling is None or not scaling.mscale_all_dim:
        return 1.0
    return mscale(scaling.factor, scaling.mscale_all_dim) ** 2


def scaled_inv_freq(powers: torch.Tensor, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """The frequencies `[D/2]` of a scaled rotary embedding, from `powers` = theta^(2i/D) `[D/2]`."""
    dim = 2 * powers.shape[0]
    if scaling.kind == "yarn":
        # the (fractional) pair index that turns `turns` times over the pretraining context
        def pair(turns: float) -> float:
            return dim * math.log(scaling.original_max_len / (turns * 2 * math.pi)) / (2 * math.log(theta))

        low, high = pair(scaling.beta_fast), pair(scaling.beta_slow)
        if scaling.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if high == low:
            high += 0.001  # a ramp of one step, not a division by zero
        index = torch.arange(dim // 2, dtype=torch.float32, device=powers.device)
        kept = 1 - ((index - low) / (high - low)).clamp(0, 1)  # [D/2]: 1 kept, 0 divided by factor
        return 1.0 / (scaling.factor * powers) * (1 - kept) + 1.0 / powers * kept
    plain = 1.0 / powers
    wavelength = 2 * math.pi / plain  # [D/2]
    low_wavelength = scaling.original_max_len / scaling.low_freq_factor  # longer: divided by factor
    high_wavelength = scaling.original_max_len / scaling.high_freq_factor  # shorter: kept
    smooth = (scaling.original_max_len / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )  # [D/2]: 0 at low_wavelength, 1 at high_wavelength
    stretched = torch.where(wavelength > low_wavelength, plain / scaling.factor, plain)
    between = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return torch.where(between, (1 - smooth) * plain / scaling.factor + smooth * plain, stretched)
