"""Gradients and in-place semantics of yarnlib.kernels (Triton through the interpreter)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from kernel_cases import make_qk, make_spec  # noqa: E402

from yarnlib.kernels import apply_rotary, apply_scaled_rotary, rotary_cos_sin  # noqa: E402

BACKENDS = ("torch", "triton")
SHAPE = (2, 3, 1, 5, 16, 12)  # batch, q heads, kv heads, seq, head_dim, partial rotary_dim
GRADCHECK_SHAPE = (2, 2, 1, 3, 8, 6)  # gradcheck perturbs every input element: keep it tiny


def rotary(q, k, layout, mode, backend, interleaved=False, inplace=False, shape=SHAPE):
    """Rotate with a cos/sin table + position_ids, or table-free, at arbitrary positions."""
    batch, _, _, seq, _, rotary_dim = shape
    spec = make_spec(rotary_dim)
    dims = (batch * seq,) if layout == "thd" else (batch, seq)
    pos = torch.randint(0, 64, dims, generator=torch.Generator().manual_seed(2))
    kwargs = dict(layout=layout, interleaved=interleaved, inplace=inplace, backend=backend)
    if mode == "table_free":
        return apply_scaled_rotary(q, k, pos, spec, **kwargs)
    cos, sin = rotary_cos_sin(spec, torch.arange(64))
    return apply_rotary(q, k, cos, sin, pos, **kwargs)


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("mode", ["table", "table_free"])
def test_gradcheck_torch_backend_float64(layout, interleaved, mode):
    q, k = (x.requires_grad_() for x in make_qk(GRADCHECK_SHAPE, layout, torch.float64))
    assert torch.autograd.gradcheck(
        lambda q, k: rotary(q, k, layout, mode, "torch", interleaved, shape=GRADCHECK_SHAPE),
        (q, k),
    )


@pytest.mark.parametrize("layout", ["bhsd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("mode", ["table", "table_free"])
def test_triton_backward_equals_torch_backward(layout, interleaved, mode):
    grads = []
    for backend in BACKENDS:
        q, k = (x.requires_grad_() for x in make_qk(SHAPE, layout, torch.float32))
        q_out, k_out = rotary(q, k, layout, mode, backend, interleaved)
        gen = torch.Generator().manual_seed(3)
        torch.autograd.backward(
            (q_out, k_out),
            (torch.randn(q.shape, generator=gen), torch.randn(k.shape, generator=gen)),
        )
        grads.append((q.grad, k.grad))
    for ours, oracle in zip(*grads, strict=True):
        torch.testing.assert_close(ours, oracle, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["table", "table_free"])
def test_out_of_place_never_writes_inputs(backend, mode):
    q, k = (x.requires_grad_() for x in make_qk(SHAPE, "bhsd", torch.bfloat16))
    before = [(x.detach().clone(), x._version) for x in (q, k)]
    q_out, k_out = rotary(q, k, "bhsd", mode, backend)
    grad_q, grad_k = torch.ones_like(q_out), torch.ones_like(k_out)
    torch.autograd.backward((q_out, k_out), (grad_q, grad_k))
    for x, out, (saved, version) in zip((q, k), (q_out, k_out), before, strict=True):
        assert torch.equal(x.detach(), saved) and x._version == version
        assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert bool((grad_q == 1).all()) and bool((grad_k == 1).all())  # grad_out untouched too


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["bhsd", "thd"])
def test_inplace_writes_into_q_and_k_and_gives_correct_gradients(backend, layout):
    """q and k as (transposed) views of projections, as in transformers, rotated in place."""
    batch, hq, hk, seq, head_dim, _ = SHAPE
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(batch * seq, 8, generator=gen)
    weights = [torch.randn(8, heads * head_dim, generator=gen) for heads in (hq, hk)]

    def forward(inplace):
        x_ = x.clone().requires_grad_()
        w_q, w_k = (w.clone().requires_grad_() for w in weights)
        q, k = x_ @ w_q, x_ @ w_k
        if layout == "thd":
            q, k = q.unflatten(-1, (hq, head_dim)), k.unflatten(-1, (hk, head_dim))
        else:
            q = q.reshape(batch, seq, hq, head_dim).transpose(1, 2)
            k = k.reshape(batch, seq, hk, head_dim).transpose(1, 2)
        q_out, k_out = rotary(q, k, layout, "table", backend, inplace=inplace)
        if inplace:
            assert q_out is q and k_out is k
        loss = (
            q_out.square().sum(-1) * torch.arange(seq * hq * batch).view_as(q_out[..., 0])
        ).sum()
        loss = loss + (k_out * k_out.flip(-1)).sum()
        loss.backward()
        return q_out.detach(), k_out.detach(), x_.grad, w_q.grad, w_k.grad

    for ours, expected in zip(forward(True), forward(False), strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_inplace_on_a_leaf_that_requires_grad_is_refused_by_autograd():
    q, k = (x.requires_grad_() for x in make_qk(SHAPE, "bhsd", torch.float32))
    with pytest.raises(RuntimeError, match="leaf"):
        rotary(q, k, "bhsd", "table", "torch", inplace=True)
