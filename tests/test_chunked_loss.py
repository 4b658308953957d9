import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_model

from yarnlib.chunked_loss import causal_lm_loss, nll_sum, shift_labels, token_nll


def full_nll(hidden, head, labels):
    logits = head(hidden).float()
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view(
        labels.shape
    )


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_token_nll_equals_full_logits_for_any_chunk(chunk):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden, labels = torch.randn(2, 64, 16), torch.randint(0, 50, (2, 64))
    got = token_nll(hidden, head, labels, chunk)
    torch.testing.assert_close(got, full_nll(hidden, head, labels), rtol=1e-6, atol=1e-6)


def test_ignored_labels_count_zero_and_are_not_counted():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 20)
    hidden, labels = torch.randn(10, 8), torch.randint(0, 20, (10,))
    labels[[0, 5]] = -100
    total, count = nll_sum(hidden, head, labels, chunk_size=3)
    keep = labels != -100
    assert count == 8
    expected = full_nll(hidden[keep], head, labels[keep]).sum()
    torch.testing.assert_close(total, expected)


def test_gradients_match_full_logits():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50)
    hidden = torch.randn(40, 16, requires_grad=True)
    labels = torch.randint(0, 50, (40,))
    token_nll(hidden, head, labels, chunk_size=9).sum().backward()
    chunked = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    full_nll(hidden, head, labels).sum().backward()
    torch.testing.assert_close(chunked[0], hidden.grad)
    torch.testing.assert_close(chunked[1], head.weight.grad)


def test_causal_lm_loss_equals_transformers_loss():
    model = tiny_model()
    ids = torch.randint(0, 128, (2, 100))
    with torch.no_grad():
        loss, count = causal_lm_loss(model, ids, chunk_size=13)
        expected = model(input_ids=ids, labels=ids).loss
    assert count == 2 * 99
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=0)


def test_shift_labels_and_bad_input():
    ids = torch.tensor([[1, 2, 3]])
    assert shift_labels(ids).tolist() == [[2, 3, -100]]
    with pytest.raises(ValueError, match="chunk_size"):
        token_nll(torch.randn(3, 4), torch.nn.Linear(4, 5), torch.zeros(3, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="labels"):
        token_nll(torch.randn(3, 4), torch.nn.Linear(4, 5), torch.zeros(4, dtype=torch.long))
