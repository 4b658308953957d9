"""The RoPE scaling methods as pure functions: one small function per method, one registry.

Every function takes plain numbers and returns ``(inv_freq, attention_factor)``: a float32
tensor of ``rotary_dim // 2`` inverse frequencies and the float that multiplies cos and sin.
The float32 operations follow transformers' ``modeling_rope_utils`` in the same order, so
``linear``, ``dynamic_ntk`` and ``yarn`` agree with it bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch


class Frequencies(NamedTuple):
    inv_freq: torch.Tensor
    attention_factor: float


def base_inv_freq(rope_theta: float, rotary_dim: int) -> torch.Tensor:
    """θ_i = b^(-2i/d), float32, exactly as transformers' default rope."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (rope_theta**exponents)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """The paper's attention temperature sqrt(1/t) = 0.1·mscale·ln(s) + 1 (1 for s ≤ 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def correction_dim(num_rotations: float, rotary_dim: int, rope_theta: float, length: int) -> float:
    """The (fractional) dimension whose wavelength fits ``num_rotations`` times in ``length``."""
    return (rotary_dim * math.log(length / (num_rotations * 2 * math.pi))) / (
        2 * math.log(rope_theta)
    )


def correction_range(
    beta_fast: float,
    beta_slow: float,
    rotary_dim: int,
    rope_theta: float,
    length: int,
    truncate: bool,
) -> tuple[float, float]:
    """Dimensions below ``low`` keep their frequency, above ``high`` are fully interpolated."""
    low = correction_dim(beta_fast, rotary_dim, rope_theta, length)
    high = correction_dim(beta_slow, rotary_dim, rope_theta, length)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rotary_dim - 1)


def ramp(low: float, high: float, n: int) -> torch.Tensor:
    """0 below ``low``, 1 above ``high``, linear between (over frequency index 0..n-1)."""
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    return torch.clamp((torch.arange(n, dtype=torch.float32) - low) / (high - low), 0, 1)


def extrapolation_weight(
    rotary_dim: int,
    rope_theta: float,
    original: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
) -> torch.Tensor:
    """γ_i of NTK-by-parts: 1 where a dimension keeps its frequency, 0 where it is divided by s."""
    low, high = correction_range(beta_fast, beta_slow, rotary_dim, rope_theta, original, truncate)
    return 1 - ramp(low, high, rotary_dim // 2)


def none(*, rope_theta, rotary_dim, **_) -> Frequencies:
    return Frequencies(base_inv_freq(rope_theta, rotary_dim), 1.0)


def linear(*, rope_theta, rotary_dim, factor, **_) -> Frequencies:
    return Frequencies(base_inv_freq(rope_theta, rotary_dim) / factor, 1.0)


def ntk_theta(rope_theta: float, rotary_dim: int, factor: float) -> float:
    """NTK-aware base change b·s^(d/(d−2)): the lowest frequency is divided by exactly s."""
    return rope_theta * factor ** (rotary_dim / (rotary_dim - 2))


def ntk(*, rope_theta, rotary_dim, factor, **_) -> Frequencies:
    return Frequencies(base_inv_freq(ntk_theta(rope_theta, rotary_dim, factor), rotary_dim), 1.0)


def dynamic_ntk(*, rope_theta, rotary_dim, factor, original, seq_len, **_) -> Frequencies:
    length = original if seq_len is None else max(seq_len, original)
    scaled = (factor * length / original) - (factor - 1)
    theta = rope_theta * scaled ** (rotary_dim / (rotary_dim - 2))
    return Frequencies(base_inv_freq(theta, rotary_dim), 1.0)


def _ntk_by_parts_inv_freq(
    rope_theta, rotary_dim, factor, original, beta_fast, beta_slow, truncate
) -> torch.Tensor:
    pos_freqs = rope_theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    extrapolated = 1.0 / pos_freqs
    interpolated = 1.0 / (factor * pos_freqs)
    gamma = extrapolation_weight(rotary_dim, rope_theta, original, beta_fast, beta_slow, truncate)
    return interpolated * (1 - gamma) + extrapolated * gamma


def ntk_by_parts(
    *, rope_theta, rotary_dim, factor, original, beta_fast, beta_slow, truncate, **_
) -> Frequencies:
    inv_freq = _ntk_by_parts_inv_freq(
        rope_theta, rotary_dim, factor, original, beta_fast, beta_slow, truncate
    )
    return Frequencies(inv_freq, 1.0)


def yarn_attention_factor(factor, mscale, mscale_all_dim, attention_factor) -> float:
    if attention_factor is not None:
        return float(attention_factor)
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def yarn(
    *,
    rope_theta,
    rotary_dim,
    factor,
    original,
    beta_fast,
    beta_slow,
    truncate,
    mscale,
    mscale_all_dim,
    attention_factor,
    **_,
) -> Frequencies:
    inv_freq = _ntk_by_parts_inv_freq(
        rope_theta, rotary_dim, factor, original, beta_fast, beta_slow, truncate
    )
    return Frequencies(
        inv_freq, yarn_attention_factor(factor, mscale, mscale_all_dim, attention_factor)
    )


def dynamic_yarn(*, original, seq_len, **params) -> Frequencies:
    """YaRN with s_eff = max(1, seq_len / original); plain RoPE until the original length."""
    if seq_len is None or seq_len <= original:
        return none(**params)
    params["factor"] = seq_len / original
    return yarn(original=original, **params)


def llama3(
    *, rope_theta, rotary_dim, factor, original, low_freq_factor, high_freq_factor, **_
) -> Frequencies:
    """Llama 3.1: wavelengths above L/low kept ÷ s, below L/high kept, smoothed between."""
    inv_freq = base_inv_freq(rope_theta, rotary_dim)
    low_freq_wavelen = original / low_freq_factor
    high_freq_wavelen = original / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    divided = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * divided / factor + smooth * divided
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return Frequencies(torch.where(medium, smoothed, divided), 1.0)


def longrope(
    *,
    rope_theta,
    rotary_dim,
    factor,
    original,
    seq_len,
    short_factor,
    long_factor,
    attention_factor,
    **_,
) -> Frequencies:
    """Phi-3 LongRoPE: θ_i divided by a stored factor per frequency, the long ones beyond L."""
    divisors = long_factor if seq_len and seq_len > original else short_factor
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (torch.tensor(divisors, dtype=torch.float32) * rope_theta**exponents)
    if attention_factor is None:
        attention_factor = 1.0
        if factor > 1:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original))
    return Frequencies(inv_freq, float(attention_factor))


METHOD_FUNCTIONS: dict[str, Callable[..., Frequencies]] = {
    "none": none,
    "linear": linear,
    "ntk": ntk,
    "dynamic_ntk": dynamic_ntk,
    "ntk_by_parts": ntk_by_parts,
    "yarn": yarn,
    "dynamic_yarn": dynamic_yarn,
    "llama3": llama3,
    "longrope": longrope,
}
