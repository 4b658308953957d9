"""Validation of ``apply_rotary`` arguments and their normalisation to [batch, seq, ...] views."""

from __future__ import annotations

import torch

from yarnlib.kernels.tables import INDEX_DTYPES

LAYOUTS = ("bhsd", "bshd", "thd")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def as_bshd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A [batch, seq, heads, head_dim] view."""
    if layout == "bhsd":
        return x.transpose(1, 2)
    return x.unsqueeze(0) if layout == "thd" else x


def check_choice(field: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def check_qk(q, k, layout: str) -> tuple[int, int, int]:
    """``(batch, seq, head_dim)`` of q and k after checking that they fit together."""
    check_choice("layout", layout, LAYOUTS)
    ndim = 3 if layout == "thd" else 4
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, torch.Tensor) or x.dim() != ndim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a {ndim}-D tensor for layout={layout!r}, got {shape}")
        if x.dtype not in DTYPES + (torch.float64,):
            raise ValueError(
                f"{name}.dtype must be float32, float16 or bfloat16 (float64 on the torch "
                f"backend), got {x.dtype}"
            )
    qv, kv = as_bshd(q, layout), as_bshd(k, layout)
    if (qv.shape[:2], qv.shape[3]) != (kv.shape[:2], kv.shape[3]):
        raise ValueError(
            f"q and k must agree in batch, sequence and head_dim for layout={layout!r}, got "
            f"q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if q.dtype != k.dtype or q.device != k.device:
        raise ValueError(
            f"q and k must share dtype and device, got {q.dtype} on {q.device} and {k.dtype} "
            f"on {k.device}"
        )
    return qv.shape[0], qv.shape[1], qv.shape[3]


def check_rotary_dim(rotary_dim, head_dim: int) -> None:
    ok = isinstance(rotary_dim, int) and not isinstance(rotary_dim, bool)
    if not ok or rotary_dim % 2 or not 2 <= rotary_dim <= head_dim:
        raise ValueError(
            f"rotary_dim must be an even integer in [2, head_dim={head_dim}], got {rotary_dim!r}"
        )


def check_index(field: str, x, ndims) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in INDEX_DTYPES or x.dim() not in ndims:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else repr(x)
        dims = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"{field} must be a {dims} int32 or int64 tensor, got {got}")


def positions(position_ids, cu_seqlens, layout, batch, seq, device):
    """``position_ids`` as ``[1 or batch, seq]``, or derived from ``cu_seqlens``, or None."""
    if cu_seqlens is not None:
        if layout != "thd":
            raise ValueError(f"cu_seqlens is for layout='thd' only, got layout={layout!r}")
        if position_ids is not None:
            raise ValueError("give position_ids or cu_seqlens, not both")
        check_index("cu_seqlens", cu_seqlens, (1,))
        if cu_seqlens.device != device:
            raise ValueError(f"cu_seqlens must be on {device}, got {cu_seqlens.device}")
        if cu_seqlens.device.type == "cpu":  # checking values on a GPU would synchronize
            offsets = cu_seqlens.tolist()
            if not offsets or offsets[0] != 0 or offsets[-1] != seq or offsets != sorted(offsets):
                raise ValueError(
                    f"cu_seqlens must rise from 0 to the token count {seq}, got {offsets}"
                )
        starts, lengths = cu_seqlens[:-1], cu_seqlens.diff()
        token = torch.arange(seq, device=device, dtype=cu_seqlens.dtype)
        return (token - starts.repeat_interleave(lengths, output_size=seq))[None]
    if position_ids is None:
        return None
    check_index("position_ids", position_ids, (1, 2))
    if position_ids.device != device:
        raise ValueError(f"position_ids must be on {device}, got {position_ids.device}")
    pos = position_ids if position_ids.dim() == 2 else position_ids[None]
    if pos.shape[1] != seq or pos.shape[0] not in (1, batch):
        want = f"[{seq}] or [1, {seq}]" if layout == "thd" else f"[{seq}] or [{batch} or 1, {seq}]"
        raise ValueError(f"position_ids must have shape {want}, got {tuple(position_ids.shape)}")
    return pos


def check_rows(pos: torch.Tensor, rows: int) -> None:
    """Table rows exist for every position (on CPU; on a GPU the check would synchronize)."""
    if pos.device.type == "cpu" and pos.numel() and not 0 <= pos.min() <= pos.max() < rows:
        raise ValueError(
            f"position_ids must lie in [0, {rows}) (the rows of cos), got "
            f"{pos.min().item()}..{pos.max().item()}"
        )


def per_token(table: torch.Tensor, layout: str, batch: int, seq: int) -> torch.Tensor:
    """A per-token cos/sin as ``[1 or batch, seq, width]``."""
    t = table if table.dim() == 3 and layout != "thd" else table[None]
    if t.dim() != 3 or t.shape[1] != seq or t.shape[0] not in (1, batch):
        want = (
            f"[{seq}, width]" if layout == "thd" else f"[{seq}, width] or [{batch}, {seq}, width]"
        )
        raise ValueError(
            f"cos without position_ids must be per token, shape {want}; got {tuple(table.shape)}"
        )
    return t
