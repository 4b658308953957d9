"""The allocated peak of a loss over an output head's logits, traced on CPU and replayed through
the allocator's rules (tests/caching_allocator.py). Run as a script, of ms-swift's own chunked
cross-entropy (``CELOSS_PARALLEL_SIZE``) at the chunk given: prints the peak in bytes."""

import sys

import torch
from caching_allocator import replay, trace


def loss_peak(loss_of, rows: int = 1024, vocab: int = 32768) -> int:
    """Allocated peak of a step through an output head in bf16 and ``loss_of(logits, labels)``
    (per-row losses). The logits are the step's and dropped before backward, as a model's
    output is; the head's grads exist from an earlier step, as in training."""
    torch.manual_seed(0)
    hidden = torch.randn(rows, 64, dtype=torch.bfloat16, requires_grad=True)
    head = torch.randn(vocab, 64, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (rows,))

    def step():
        logits = hidden @ head.t()
        loss = loss_of(logits, labels)
        del logits
        loss.sum().backward()

    step()
    return replay(trace(step)).peak_allocated


if __name__ == "__main__":
    from swift.sequence_parallel.utils import ChunkedCrossEntropyLoss

    chunk = int(sys.argv[1])
    print(loss_peak(lambda logits, labels: ChunkedCrossEntropyLoss.apply(logits, labels, chunk)))
