"""``apply_rotary`` and ``apply_scaled_rotary``: validation, layouts, backends, autograd."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from yarnlib.kernels import checks, reference, tables
from yarnlib.kernels.reference import Angles
from yarnlib.spec import RopeScaling

BACKENDS = ("auto", "torch", "triton")


class _Config(NamedTuple):
    layout: str
    rotary_dim: int
    interleaved: bool
    inplace: bool
    backend: str
    attention_factor: float


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    *,
    layout: str = "bhsd",
    cu_seqlens: torch.Tensor | None = None,
    rotary_dim: int | None = None,
    interleaved: bool = False,
    inplace: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` and ``k`` by the angles in the ``cos``/``sin`` tables; returns ``(q, k)``.

    Layouts (``q`` and ``k`` may have different head counts):
    ``bhsd`` ``[batch, heads, seq, head_dim]`` (transformers), ``bshd``
    ``[batch, seq, heads, head_dim]`` (flash-attn), ``thd`` ``[tokens, heads, head_dim]``
    (packed sequences).

    ``cos``/``sin`` have ``rotary_dim`` columns in transformers' layout ``cat(c, c)`` (for
    both pairings, as transformers' rotary modules return them), or ``rotary_dim // 2``
    columns (one per frequency, flash-attn's layout); only the first ``rotary_dim // 2`` are
    read. Which row a token reads:

    - ``position_ids`` given (``[seq]`` or ``[batch, seq]``; ``[tokens]`` or ``[1, tokens]``
      for ``thd``), int32 or int64: ``cos`` is a 2-D table ``[max_position, ...]`` indexed
      by position (which must lie in ``[0, max_position)``; checked for CPU tensors);
    - ``cu_seqlens`` given (``thd`` only, ``[n_seqs + 1]`` offsets): the same, with positions
      restarting at 0 in every packed sequence;
    - neither: ``cos`` is per token, ``[seq, ...]`` or ``[batch, seq, ...]`` (``[tokens, ...]``
      for ``thd``), e.g. the output of a transformers rotary embedding module.

    ``rotary_dim`` (default: the width of ``cos``) features of each head are rotated, the rest
    pass through. ``interleaved`` pairs features ``(2i, 2i+1)`` (GPT-J) instead of
    ``(i, i + rotary_dim/2)`` (NeoX/LLaMA). Arithmetic is float32, output in the input dtype.
    ``inplace=True`` writes into ``q`` and ``k`` (marked dirty for autograd); otherwise the
    inputs are never written. Gradients flow to ``q`` and ``k`` (not to ``cos``/``sin``).
    ``backend``: ``"triton"``, ``"torch"`` or ``"auto"`` (Triton for CUDA tensors when it
    is importable, else torch).
    """
    batch, seq, head_dim = checks.check_qk(q, k, layout)
    if not isinstance(cos, torch.Tensor) or not isinstance(sin, torch.Tensor):
        raise ValueError("cos and sin must be tensors")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {cos.shape} and {sin.shape}")
    if not cos.is_floating_point() or cos.dtype != sin.dtype or cos.device != q.device:
        raise ValueError(
            f"cos and sin must be floating-point tensors of one dtype on {q.device}, got "
            f"{cos.dtype}/{sin.dtype} on {cos.device}"
        )
    if cos.dim() == 0:
        raise ValueError("cos must have a last dimension of rotary_dim or rotary_dim // 2")
    if rotary_dim is None:
        rotary_dim = cos.shape[-1]
    checks.check_rotary_dim(rotary_dim, head_dim)
    if cos.shape[-1] not in (rotary_dim, rotary_dim // 2):
        raise ValueError(
            f"cos: last dimension must be rotary_dim={rotary_dim} or rotary_dim // 2, "
            f"got shape {tuple(cos.shape)}"
        )
    pos = checks.positions(position_ids, cu_seqlens, layout, batch, seq, q.device)
    half = rotary_dim // 2
    if pos is not None:
        if cos.dim() != 2:
            raise ValueError(
                f"cos: with position_ids or cu_seqlens it must be a table [max_position, "
                f"rotary_dim], got shape {tuple(cos.shape)}"
            )
        checks.check_rows(pos, cos.shape[0])
        tables = cos[None, :, :half], sin[None, :, :half]
    else:
        tables = (
            checks.per_token(cos, layout, batch, seq)[..., :half],
            checks.per_token(sin, layout, batch, seq)[..., :half],
        )
    cfg = _config(q, layout, rotary_dim, interleaved, inplace, backend, 1.0)
    return _apply(q, k, *tables, pos, None, cfg)


def apply_scaled_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    position_ids: torch.Tensor | None,
    spec: RopeScaling,
    seq_len: int | None = None,
    *,
    layout: str = "bhsd",
    cu_seqlens: torch.Tensor | None = None,
    interleaved: bool = False,
    inplace: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rotary`` without tables: angles come from ``spec`` inside the kernel.

    Token at position p, frequency i: angle ``float32(p) * inv_freq[i]`` in float32, then
    ``cos(angle) * attention_factor`` and likewise sin, with ``inv_freq`` and
    ``attention_factor`` from ``spec`` at ``seq_len`` (used by the dynamic methods only).
    The same numbers as ``rotary_cos_sin`` (bit-identical on the torch backend), without
    any cos/sin memory. ``position_ids`` as in ``apply_rotary``; ``None`` means
    ``0..seq-1`` (``bhsd``/``bshd``) or positions from ``cu_seqlens`` (``thd``).
    ``spec.rotary_dim`` features are rotated.
    """
    if not isinstance(spec, RopeScaling):
        raise ValueError(f"spec must be a yarnlib.RopeScaling, got {type(spec).__name__}")
    batch, seq, head_dim = checks.check_qk(q, k, layout)
    checks.check_rotary_dim(spec.rotary_dim, head_dim)
    pos = checks.positions(position_ids, cu_seqlens, layout, batch, seq, q.device)
    if pos is None and layout == "thd":
        raise ValueError("layout='thd' needs position_ids or cu_seqlens")
    inv_freq, factor = tables.device_frequencies(spec, seq_len, q.device)
    cfg = _config(q, layout, spec.rotary_dim, interleaved, inplace, backend, factor)
    return _apply(q, k, None, None, pos, inv_freq, cfg)


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cos, sin, pos, inv_freq, cfg, *xs):
        angles = Angles(cos, sin, pos, inv_freq, cfg.attention_factor)
        outs = _run(xs, angles, cfg, sign=1.0, inplace=cfg.inplace)
        if cfg.inplace:
            ctx.mark_dirty(*xs)
        ctx.save_for_backward(cos, sin, pos, inv_freq)
        ctx.cfg = cfg
        return outs

    @staticmethod
    def backward(ctx, *grads):
        # A rotation is orthogonal: its gradient is the rotation by -θ.
        angles = Angles(*ctx.saved_tensors, ctx.cfg.attention_factor)
        return (None,) * 5 + _run(grads, angles, ctx.cfg, sign=-1.0, inplace=False)


def _apply(q, k, cos, sin, pos, inv_freq, cfg):
    if cfg.inplace:
        # Autograd lets a Function dirty a view (q from a transposed projection) only when it
        # returns one tensor: one call each for q and k.
        return tuple(_Rotary.apply(cos, sin, pos, inv_freq, cfg, x)[0] for x in (q, k))
    return _Rotary.apply(cos, sin, pos, inv_freq, cfg, q, k)


def _run(xs, angles: Angles, cfg: _Config, sign: float, inplace: bool) -> tuple:
    outs = xs if inplace else tuple(torch.empty_like(x) for x in xs)
    pairs = [
        (checks.as_bshd(x, cfg.layout), checks.as_bshd(o, cfg.layout))
        for x, o in zip(xs, outs, strict=True)
    ]
    rotate = _triton_rotate() if cfg.backend == "triton" else reference.rotate
    rotate(pairs, angles, cfg.rotary_dim, cfg.interleaved, sign)
    if not inplace and cfg.rotary_dim < xs[0].shape[-1]:
        for x, out in pairs:
            out[..., cfg.rotary_dim :].copy_(x[..., cfg.rotary_dim :])
    return outs


def _config(q, layout, rotary_dim, interleaved, inplace, backend, factor) -> _Config:
    for name, flag in (("interleaved", interleaved), ("inplace", inplace)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    return _Config(layout, rotary_dim, interleaved, inplace, _backend(backend, q), factor)


def _backend(backend: str, q: torch.Tensor) -> str:
    checks.check_choice("backend", backend, BACKENDS)
    if backend == "auto":
        usable = q.is_cuda and q.dtype != torch.float64 and _triton_rotate() is not None
        return "triton" if usable else "torch"
    if backend == "torch":
        return backend
    if _triton_rotate() is None:
        raise ValueError("backend='triton' but triton is not importable (pip install triton)")
    if q.dtype == torch.float64:
        raise ValueError("backend='triton' takes float32/float16/bfloat16; use 'torch' for float64")
    from yarnlib.kernels import triton_rotary

    if not q.is_cuda and not (q.device.type == "cpu" and triton_rotary.interprets()):
        raise ValueError(
            f"backend='triton' needs CUDA tensors (got {q.device}), or CPU tensors with "
            "TRITON_INTERPRET=1 set before yarnlib first uses Triton; use backend='torch'"
        )
    return backend


@functools.cache
def _triton_rotate():
    """``triton_rotary.rotate``, or None where Triton cannot be imported."""
    try:
        from yarnlib.kernels import triton_rotary
    except ImportError:
        return None
    return triton_rotary.rotate
