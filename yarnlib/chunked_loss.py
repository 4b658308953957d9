"""Token-level negative log-likelihood from hidden states, a chunk of positions at a time.

At 128k tokens with a 152k vocabulary the full float32 logits tensor is ~80 GB; computing the
head and the cross-entropy over ``chunk_size`` positions at a time bounds that to
``chunk_size × vocab``. Shared by the evaluations and the fine-tuning loop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


def _chunk_nll(head: Callable, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()  # float32 log-softmax, as transformers' loss does
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).reshape(labels.shape)


def token_nll(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Per-position NLL of ``labels`` under ``head(hidden)``; 0 where a label is -100.

    ``hidden`` is ``[..., seq, hidden]`` and ``labels`` ``[..., seq]``, already aligned (the
    label of position t is the token at t + 1). Under autograd each chunk is checkpointed, so
    backward recomputes its logits instead of keeping all of them alive.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels: shape {tuple(labels.shape)} does not match hidden states "
            f"{tuple(hidden.shape[:-1])}"
        )
    grad = torch.is_grad_enabled() and hidden.requires_grad
    pieces = []
    for start in range(0, labels.shape[-1], chunk_size):
        h = hidden[..., start : start + chunk_size, :]
        y = labels[..., start : start + chunk_size]
        if grad:
            pieces.append(checkpoint(_chunk_nll, head, h, y, use_reentrant=False))
        else:
            pieces.append(_chunk_nll(head, h, y))
    return torch.cat(pieces, dim=-1)


def nll_sum(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, int]:
    """(summed NLL over the labelled positions, their count); mean loss = sum / count."""
    count = int((labels != IGNORE_INDEX).sum())
    return token_nll(hidden, head, labels, chunk_size).sum(), count


def shift_labels(input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token labels aligned with the hidden states: ``labels[..., 1:]`` then one -100."""
    labels = input_ids if labels is None else labels
    pad = torch.full_like(labels[..., :1], IGNORE_INDEX)
    return torch.cat([labels[..., 1:], pad], dim=-1)


def causal_lm_loss(model, input_ids: torch.Tensor, labels=None, chunk_size: int = 1024, **kwargs):
    """Mean next-token loss of a transformers causal LM without materialising its logits.

    Runs the decoder (``model.base_model``) for hidden states and applies the output head in
    chunks. Returns ``(mean_loss, token_count)``.
    """
    for field in ("final_logit_softcapping", "logit_scale"):
        if getattr(model.config, field, None) not in (None, 1.0):
            raise ValueError(
                f"{field}={getattr(model.config, field)!r}: models that transform their logits "
                "after the head are not supported by the chunked loss"
            )
    outputs = model.base_model(input_ids=input_ids, use_cache=False, **kwargs)
    total, count = nll_sum(
        outputs.last_hidden_state,
        model.get_output_embeddings(),
        shift_labels(input_ids, labels),
        chunk_size,
    )
    return total / max(count, 1), count
