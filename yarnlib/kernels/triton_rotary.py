"""The Triton backend: one launch rotates q and k (in place: one each), forward (+θ) and
backward (−θ).

Each program takes a block of tokens, gets their cos/sin once (loaded from a table, or
computed from position × inv_freq in float32 registers) and reuses them for every head of
q and of k. Imported lazily: whether ``@triton.jit`` interprets is fixed at decoration time
by ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yarnlib.kernels.reference import Angles

# Elements of one [tokens, heads, pairs] tile: registers on a GPU, numpy work per program
# in the interpreter (where fewer, larger programs are much faster).
TILE_GPU = 2048
TILE_INTERPRETER = 1 << 16
NUM_WARPS_GPU = 2  # H200: 0.64 vs 0.60 of copy for 4 warps (benchmarks/gpu_rope_configs.py)


@triton.jit
def _rotate_heads(
    x_ptr,
    o_ptr,
    n_heads,
    x_sb,
    x_ss,
    x_sh,
    x_sd,
    o_sb,
    o_ss,
    o_sh,
    o_sd,
    b,
    s,
    t_mask,
    cos,
    sin,
    HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    p = tl.arange(0, BLOCK_P)
    if INTERLEAVED:
        d1 = 2 * p
        d2 = d1 + 1
    else:
        d1 = p
        d2 = p + HALF
    tp_mask = t_mask[:, None, None] & (p < HALF)[None, None, :]
    x_tok = (b * x_sb + s * x_ss)[:, None, None]
    o_tok = (b * o_sb + s * o_ss)[:, None, None]
    for h0 in range(0, n_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        mask = tp_mask & (h < n_heads)[None, :, None]
        x_row = x_ptr + x_tok + (h * x_sh)[None, :, None]
        o_row = o_ptr + o_tok + (h * o_sh)[None, :, None]
        x1 = tl.load(x_row + (d1 * x_sd)[None, None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + (d2 * x_sd)[None, None, :], mask=mask, other=0.0).to(tl.float32)
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        tl.store(o_row + (d1 * o_sd)[None, None, :], o1.to(o_ptr.dtype.element_ty), mask=mask)
        tl.store(o_row + (d2 * o_sd)[None, None, :], o2.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    qo_ptr,
    ko_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    inv_freq_ptr,
    n_tokens,
    seq_len,
    n_q_heads,
    n_k_heads,
    q_sb,
    q_ss,
    q_sh,
    q_sd,
    k_sb,
    k_ss,
    k_sh,
    k_sd,
    qo_sb,
    qo_ss,
    qo_sh,
    qo_sd,
    ko_sb,
    ko_ss,
    ko_sh,
    ko_sd,
    c_sb,
    c_sr,
    c_sd,
    p_sb,
    p_ss,
    attention_factor,
    sign,
    HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    HAS_POS: tl.constexpr,
    TABLE_FREE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = t < n_tokens
    t = t.to(tl.int64)  # offsets of long sequences overflow int32
    b = t // seq_len
    s = t % seq_len
    p = tl.arange(0, BLOCK_P)
    if HAS_POS:
        row = tl.load(pos_ptr + b * p_sb + s * p_ss, mask=t_mask, other=0).to(tl.int64)
    else:
        row = s
    if TABLE_FREE:
        inv_freq = tl.load(inv_freq_ptr + p, mask=p < HALF, other=0.0)
        angle = row.to(tl.float32)[:, None] * inv_freq[None, :]
        cos = tl.cos(angle) * attention_factor
        sin = tl.sin(angle) * attention_factor
    else:
        tp_mask = t_mask[:, None] & (p < HALF)[None, :]
        c_off = (b * c_sb + row * c_sr)[:, None] + (p * c_sd)[None, :]
        cos = tl.load(cos_ptr + c_off, mask=tp_mask, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + c_off, mask=tp_mask, other=0.0).to(tl.float32)
    cos = cos[:, None, :]
    sin = (sin * sign)[:, None, :]
    _rotate_heads(
        q_ptr, qo_ptr, n_q_heads, q_sb, q_ss, q_sh, q_sd, qo_sb, qo_ss, qo_sh, qo_sd,
        b, s, t_mask, cos, sin, HALF, INTERLEAVED, BLOCK_HQ, BLOCK_P,
    )  # fmt: skip
    _rotate_heads(
        k_ptr, ko_ptr, n_k_heads, k_sb, k_ss, k_sh, k_sd, ko_sb, ko_ss, ko_sh, ko_sd,
        b, s, t_mask, cos, sin, HALF, INTERLEAVED, BLOCK_HK, BLOCK_P,
    )  # fmt: skip


def interprets() -> bool:
    """Whether the kernel runs in Triton's interpreter (CPU tensors) rather than compiled."""
    return type(_rotary_kernel).__name__ == "InterpretedFunction"


def _strides(x: torch.Tensor, batch_size: int) -> list[int]:
    # A broadcast batch of size 1 is read with stride 0.
    return [x.stride(0) if x.shape[0] == batch_size else 0, *x.stride()[1:]]


def rotate(pairs, angles: Angles, rotary_dim: int, interleaved: bool, sign: float) -> None:
    """Same contract as ``reference.rotate``; ``pairs`` is ``[(q, q_out), (k, k_out)]`` or
    one pair (the second is then skipped with zero heads)."""
    (q, qo), (k, ko) = pairs if len(pairs) == 2 else pairs * 2
    n_k_heads = k.shape[2] if len(pairs) == 2 else 0
    batch, seq = q.shape[:2]
    n_tokens = batch * seq
    if n_tokens == 0:
        return
    half = rotary_dim // 2
    table_free = angles.inv_freq is not None
    block_p = triton.next_power_of_2(half)
    tile = TILE_INTERPRETER if interprets() else TILE_GPU
    max_heads = max(1, tile // block_p)
    block_hq = min(triton.next_power_of_2(q.shape[2]), max_heads)
    block_hk = min(triton.next_power_of_2(max(n_k_heads, 1)), max_heads)
    block_t = min(triton.next_power_of_2(n_tokens), max(1, tile // (block_hq * block_p)))
    pos = angles.pos
    table = angles.inv_freq if table_free else angles.cos
    c_strides = [0, 0, 0] if table_free else _strides(angles.cos, batch)
    p_strides = [0, 0] if pos is None else _strides(pos, batch)
    _rotary_kernel[(triton.cdiv(n_tokens, block_t),)](
        q, k, qo, ko,
        table, table if table_free else angles.sin, table if pos is None else pos, table,
        n_tokens, seq, q.shape[2], n_k_heads,
        *_strides(q, batch), *_strides(k, batch), *_strides(qo, batch), *_strides(ko, batch),
        *c_strides, *p_strides,
        float(angles.attention_factor), float(sign),
        HALF=half, INTERLEAVED=interleaved, HAS_POS=pos is not None, TABLE_FREE=table_free,
        BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_P=block_p,
        num_warps=NUM_WARPS_GPU,
    )  # fmt: skip
