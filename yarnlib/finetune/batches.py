"""Model inputs for one micro-batch of packed rows.

With cross-document attention (the default) rows are plain causal sequences: no position ids,
no mask. Without it, each document attends only to itself:
- flash_attention_2 (GPU): the rows are flattened into one ``[1, batch·seq_len]`` sequence with
  per-document position ids; transformers then calls flash-attn's varlen kernel with
  ``cu_seqlens`` taken where position_ids == 0 (it detects packing only at batch size 1), and
  the rotary embedding sees the same restarting positions (the kernels' ``thd`` layout).
- sdpa / eager (CPU, or GPU without flash-attn): an explicit 4-D block-diagonal causal mask,
  ``[batch, 1, seq_len, seq_len]``, boolean for SDPA and additive for eager attention. It costs
  seq_len² per row, fine on CPU-sized runs; at long context install flash-attn.

PoSE (``pose`` positions, ``yarnlib.pose``) gives every row explicit position ids with skips.
transformers (5.x) reads position ids without an attention mask as packed sequences and starts
a new one wherever two neighbours differ by more than 1, which would cut a row at every skip:
so a PoSE row with cross-document attention also carries an all-ones 2-D attention mask (plain
causal attention; flash-attn then takes the one sequence start at position 0). Without
cross-document attention the positions restart at every document (``yarnlib.pose.restart_at``)
and the masks above are built from those (position 0 only at true starts).
"""

from __future__ import annotations

import torch

from yarnlib.finetune.data import PackedRows, labels_for
from yarnlib.pose import restart_at


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """``[batch, 1, seq, seq]`` bool: query i may see key j iff j ≤ i in the same document."""
    document = torch.cumsum(position_ids == 0, dim=1)
    same = document[:, :, None] == document[:, None, :]
    seq = position_ids.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=position_ids.device).tril()
    return (same & causal)[:, None]


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, the dtype's minimum elsewhere (eager attention adds the mask)."""
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.finfo(dtype).min)


def micro_batch(
    data: PackedRows,
    rows: torch.Tensor,
    cross_document: bool,
    attn_implementation: str,
    dtype: torch.dtype = torch.float32,
    pose: torch.Tensor | None = None,
) -> tuple[dict, torch.Tensor]:
    """``(model kwargs, labels)`` for ``rows``; labels are already shifted (-100 = unscored).
    ``pose``: PoSE position ids of these rows (``[rows, seq_len]``, see the module doc)."""
    input_ids = data.input_ids(rows)
    if cross_document and pose is None:
        return {"input_ids": input_ids}, labels_for(input_ids, None)
    if cross_document:  # the mask keeps transformers from cutting the row at every skip
        mask = torch.ones_like(input_ids)
        inputs = {"input_ids": input_ids, "position_ids": pose, "attention_mask": mask}
        return inputs, labels_for(input_ids, None)
    position_ids = data.position_ids(rows)
    if pose is not None:
        position_ids = restart_at(pose, position_ids == 0)
    labels = labels_for(input_ids, position_ids)
    if attn_implementation == "flash_attention_2":
        flat = {"input_ids": input_ids.reshape(1, -1), "position_ids": position_ids.reshape(1, -1)}
        return flat, labels.reshape(1, -1)
    mask = block_causal_mask(position_ids)
    if attn_implementation == "eager":
        mask = additive(mask, dtype)
    return {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": mask}, labels
