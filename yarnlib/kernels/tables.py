"""cos/sin tables from a spec, with transformers' numerics."""

from __future__ import annotations

import functools

import torch

from yarnlib.spec import RopeScaling

INDEX_DTYPES = (torch.int32, torch.int64)


def rotary_cos_sin(
    spec: RopeScaling,
    position_ids: torch.Tensor,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` for ``position_ids``, shape ``[*position_ids.shape, spec.rotary_dim]``.

    Exactly the operations of transformers' ``LlamaRotaryEmbedding.forward``, so on CPU in
    float32 the result is bit-identical to it for the same ``inv_freq``:

    1. ``inv_freq = spec.inv_freq(seq_len)`` (float32; ``seq_len`` matters for the dynamic
       methods only, ``None`` means the spec's unscaled default),
    2. ``freqs = position_ids[..., None].float() * inv_freq`` (angles in float32, never bf16),
    3. ``emb = cat(freqs, freqs)`` (the rotate-half layout transformers uses for every
       pairing; ``apply_rotary`` reads the first half),
    4. ``cos = emb.cos() * spec.attention_factor(seq_len)``, likewise ``sin``,
    5. cast to ``dtype`` last.

    The tables are on ``position_ids.device``.
    """
    if not isinstance(position_ids, torch.Tensor) or position_ids.dtype not in INDEX_DTYPES:
        got = position_ids.dtype if isinstance(position_ids, torch.Tensor) else type(position_ids)
        raise ValueError(f"position_ids must be an int32 or int64 tensor, got {got}")
    inv_freq, attention_factor = device_frequencies(spec, seq_len, position_ids.device)
    return cos_sin(inv_freq, attention_factor, position_ids, dtype)


@functools.lru_cache(maxsize=64)
def device_frequencies(
    spec: RopeScaling, seq_len: int | None, device: torch.device
) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention_factor)`` of ``spec`` at ``seq_len``, inv_freq float32 on
    ``device``: once per spec, length and device, not once per layer and step. A host-to-device
    copy per call would also wait for the device and cannot be captured in a CUDA graph."""
    freqs = spec.frequencies(seq_len)
    return freqs.inv_freq.to(device=device, dtype=torch.float32), freqs.attention_factor


def half_cos_sin(
    inv_freq: torch.Tensor, attention_factor: float, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(cos, sin)`` with one column per frequency, ``[*position_ids.shape, d // 2]``:
    the angle ``float32(position) * inv_freq`` and its cos/sin times ``attention_factor``.
    Every table yarnlib builds (transformers', vLLM's, the kernels' torch path) starts here."""
    with torch.autocast(device_type=position_ids.device.type, enabled=False):
        inv_freq = inv_freq.to(device=position_ids.device, dtype=torch.float32)
        angles = position_ids[..., None].float() * inv_freq
        return angles.cos() * attention_factor, angles.sin() * attention_factor


def cos_sin(
    inv_freq: torch.Tensor,
    attention_factor: float,
    position_ids: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 2–5 of ``rotary_cos_sin`` for frequencies already computed (and cached)."""
    cos, sin = half_cos_sin(inv_freq, attention_factor, position_ids)
    # cos(cat(a, a)) == cat(cos(a), cos(a)) element for element: transformers' layout, same bits
    return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((sin, sin), dim=-1).to(dtype)
