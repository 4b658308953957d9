"""The torch backend: vectorized rotary embedding, used on CPU and as the oracle for Triton."""

from __future__ import annotations

from typing import NamedTuple

import torch

from yarnlib.kernels.tables import half_cos_sin


class Angles(NamedTuple):
    """Where the angle of token ``(b, s)`` and frequency ``i`` comes from (both backends).

    Table mode: ``cos``/``sin`` are ``[1 or B, rows, rotary_dim // 2]`` (any float dtype) and
    row ``pos[b, s]`` (or ``s`` when ``pos`` is None) is read. Table-free mode: ``cos`` and
    ``sin`` are None and the angle is ``float32(pos[b, s]) * inv_freq[i]``, its cos and sin
    multiplied by ``attention_factor``. ``pos`` is ``[1 or B, S]`` int32/int64 or None.
    """

    cos: torch.Tensor | None
    sin: torch.Tensor | None
    pos: torch.Tensor | None
    inv_freq: torch.Tensor | None
    attention_factor: float


def cos_sin(angles: Angles, seq: int, dtype: torch.dtype, device: torch.device):
    """Per-token ``(cos, sin)`` as ``[1 or B, S, 1, rotary_dim // 2]`` in ``dtype``."""
    if angles.inv_freq is None:
        cos, sin = angles.cos, angles.sin
        if angles.pos is not None:
            rows = angles.pos.long()
            cos, sin = cos[0][rows], sin[0][rows]
    else:
        rows = angles.pos if angles.pos is not None else torch.arange(seq, device=device)[None]
        cos, sin = half_cos_sin(angles.inv_freq, angles.attention_factor, rows)
    return cos.to(dtype)[:, :, None, :], sin.to(dtype)[:, :, None, :]


def rotate(pairs, angles: Angles, rotary_dim: int, interleaved: bool, sign: float) -> None:
    """Write the rotation by ``sign``·θ of each ``x`` ([B, S, H, D]) into its ``out``.

    Only the first ``rotary_dim`` features of ``out`` are written; ``out`` may be ``x``.
    Arithmetic is float32 (float64 for float64 inputs, for gradcheck).
    """
    x0 = pairs[0][0]
    compute = torch.float64 if x0.dtype == torch.float64 else torch.float32
    cos, sin = cos_sin(angles, x0.shape[1], compute, x0.device)
    if sign < 0:
        sin = -sin
    half = rotary_dim // 2
    if interleaved:  # the feature slices holding the two members of every pair
        first, second = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    else:
        first, second = slice(0, half), slice(half, rotary_dim)
    for x, out in pairs:
        rot = x[..., :rotary_dim].to(compute)
        x1, x2 = rot[..., first], rot[..., second]
        # transformers' q*cos + rotate_half(q)*sin, operation for operation (bit-identical).
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        out[..., first].copy_(o1)  # both halves exist before out (maybe x itself) is written
        out[..., second].copy_(o2)
