"""PoSE position ids (Positional Skip-wise training, Zhu et al., arXiv 2309.10400).

A row of ``window`` tokens of contiguous text is cut into ``chunks`` pieces; the positions of
piece i run on from those of piece i-1 after a skip, so one short row trains the relative
distances of a ``target_length`` context:

- chunk lengths: a uniformly random composition of ``window`` into ``chunks`` positive parts
  (``chunks - 1`` distinct cut points drawn from ``1 … window-1``);
- skips: ``u_0 = 0`` and ``u_i`` uniform on ``{u_{i-1}, …, target_length - window}``
  (non-decreasing, so chunks never overlap and the last position is < ``target_length``);
- the token at row offset t in chunk i gets position ``t + u_i``.

The text is not resampled per chunk (the paper's ``v_i = 0`` variant, which it reports as
no worse): a chunk boundary changes positions only, so every token keeps its true
next-token label. Position 0 occurs only at the start of a row (or of a packed document, see
``restart_at``): attention kernels that read ``position_ids == 0`` as a sequence start
(flash-attn's varlen path in transformers) never mistake a skip for one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PosePositions(NamedTuple):
    position_ids: torch.Tensor  # int64 [batch, window]
    chunk_starts: torch.Tensor  # int64 [batch, chunks]: row offset of each chunk's first token


def check_pose(window: int, target_length: int, chunks: int) -> None:
    """Bad sizes raise ``ValueError`` naming the field, the value and what is allowed."""
    for name, value in (("window", window), ("target_length", target_length), ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if target_length <= window:
        raise ValueError(
            f"target_length: {target_length} is not longer than the window of {window} tokens; "
            f"allowed: a target > {window} (PoSE trains a long context from short rows)"
        )
    if not 1 <= chunks <= window:
        raise ValueError(
            f"chunks: {chunks}; allowed: 1 … {window} (every chunk holds at least one token of "
            "the window)"
        )


def pose_position_ids(
    batch_size: int,
    window: int,
    target_length: int,
    chunks: int = 2,
    *,
    generator: torch.Generator | None = None,
    document_starts: torch.Tensor | None = None,
) -> PosePositions:
    """Position ids for ``batch_size`` rows of ``window`` tokens that train ``target_length``.

    ``generator`` (a CPU ``torch.Generator``) makes the draw reproducible. ``document_starts``
    (bool ``[batch_size, window]``, True where a packed document begins) restarts positions at
    each document (``restart_at``); chunk boundaries are drawn per row as without it.
    """
    check_pose(window, target_length, chunks)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    starts, skips = [], []
    for _ in range(batch_size):
        cuts = torch.randperm(window - 1, generator=generator)[: chunks - 1] + 1
        starts.append(torch.cat([torch.zeros(1, dtype=torch.long), cuts.sort().values]))
        skips.append(_skips(chunks, target_length - window, generator))
    chunk_starts, skip = torch.stack(starts), torch.stack(skips)
    offsets = torch.arange(window)
    chunk = torch.searchsorted(chunk_starts, offsets.repeat(batch_size, 1), right=True) - 1
    position_ids = offsets + skip.gather(1, chunk)
    if document_starts is not None:
        position_ids = restart_at(position_ids, document_starts)
    return PosePositions(position_ids, chunk_starts)


def _skips(chunks: int, most: int, generator: torch.Generator | None) -> torch.Tensor:
    """``u_0 = 0``, then each ``u_i`` uniform on ``{u_{i-1}, …, most}``."""
    skips = [0]
    for _ in range(chunks - 1):
        low = skips[-1]
        skips.append(low + int(torch.randint(most - low + 1, (1,), generator=generator)))
    return torch.tensor(skips)


def restart_at(position_ids: torch.Tensor, document_starts: torch.Tensor) -> torch.Tensor:
    """Positions of packed documents counted from each document's first token: a document
    that starts inside a row starts at 0 (a true sequence start) and keeps the skips that
    fall inside it. The row's first token always starts a document."""
    if document_starts.shape != position_ids.shape or document_starts.dtype != torch.bool:
        raise ValueError(
            f"document_starts must be a bool tensor of shape {tuple(position_ids.shape)}, got "
            f"{document_starts.dtype} {tuple(document_starts.shape)}"
        )
    offsets = torch.arange(position_ids.shape[1], device=position_ids.device)
    starts = document_starts.clone()
    starts[:, 0] = True
    first = torch.where(starts, offsets, 0).cummax(dim=1).values  # the latest start so far
    return position_ids - position_ids.gather(1, first)
