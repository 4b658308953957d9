"""yarnlib.kernels API: transformers parity, table helpers, positions, packing, validation."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import re  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from kernel_cases import make_qk, make_spec  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from yarnlib import RopeScaling  # noqa: E402
from yarnlib.hf_compat import hf_format
from yarnlib.kernels import apply_rotary, apply_scaled_rotary, rotary_cos_sin  # noqa: E402
from yarnlib.kernels import rotary as rotary_module  # noqa: E402

BACKENDS = ("torch", "triton")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "kernels.md"


def llama_rope(spec: RopeScaling, heads=4):
    config = LlamaConfig(hidden_size=heads * spec.rotary_dim, num_attention_heads=heads,
                         head_dim=spec.rotary_dim, **spec.to_hf(hf_format()))  # fmt: skip
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize(
    "spec",
    [
        RopeScaling("yarn", factor=4.0, original_max_position_embeddings=2048, rope_theta=1e5,
                    rotary_dim=64),
        RopeScaling("linear", factor=2.0, rope_theta=1e4, rotary_dim=128),
        RopeScaling("none", rope_theta=5e5, rotary_dim=80),
    ],
    ids=["yarn", "linear", "none"],
)  # fmt: skip
def test_rotary_cos_sin_is_bit_identical_to_transformers(spec):
    rope = llama_rope(spec)
    assert torch.equal(rope.inv_freq, spec.inv_freq())
    position_ids = torch.tensor([[0, 1, 2, 4095, 8191, 100_000], [7, 3, 9, 1, 0, 131071]])
    x = torch.empty(0)
    for dtype in (torch.float32, torch.bfloat16):
        theirs = rope(x.to(dtype), position_ids)
        ours = rotary_cos_sin(spec, position_ids, dtype=dtype)
        for a, b in zip(ours, theirs, strict=True):
            assert a.dtype == dtype and a.shape == (2, 6, spec.rotary_dim)
            assert torch.equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transformers_apply_rotary_pos_emb_equals_ours(backend):
    spec = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=64, rotary_dim=64)
    q, k = make_qk((2, 4, 2, 9, 64, 64), "bhsd", torch.float32)
    position_ids = torch.tensor([list(range(9)), [5, 6, 7, 8, 0, 1, 2, 3, 4]])
    cos, sin = rotary_cos_sin(spec, position_ids)
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    for ours in (
        apply_rotary(q, k, cos, sin, backend=backend),
        apply_scaled_rotary(q, k, position_ids, spec, backend=backend),
    ):
        for a, b in zip(ours, theirs, strict=True):
            if backend == "torch":
                assert torch.equal(a, b)  # the same float32 operations in the same order
            else:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_table_free_equals_table_and_positions_broadcast(backend):
    spec = make_spec(32)
    q, k = make_qk((3, 2, 1, 6, 48, 32), "bshd", torch.float32)
    pos = torch.tensor([3, 1, 4, 1, 5, 9])
    cos, sin = rotary_cos_sin(spec, torch.arange(16))
    expected = apply_rotary(q, k, cos, sin, pos[None].expand(3, 6), layout="bshd", backend="torch")
    variants = [
        apply_rotary(q, k, cos, sin, pos, layout="bshd", backend=backend),
        apply_rotary(q, k, cos, sin, pos.int()[None], layout="bshd", backend=backend),
        apply_rotary(q, k, cos[pos], sin[pos], layout="bshd", backend=backend),
        apply_rotary(q, k, cos[:, :16], sin[:, :16], pos, layout="bshd", rotary_dim=32,
                     backend=backend),  # half-width table (one column per frequency)
        apply_scaled_rotary(q, k, pos.int(), spec, layout="bshd", backend=backend),
    ]  # fmt: skip
    for got in variants:
        for a, b in zip(got, expected, strict=True):
            if backend == "torch":
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_sequences_restart_at_zero(backend):
    """thd with cu_seqlens = thd with per-token positions = each sequence rotated alone."""
    spec = make_spec(16)
    lengths = [5, 1, 7]
    cu_seqlens = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    q, k = make_qk((1, 3, 1, 13, 16, 16), "thd", torch.float32)
    pos = torch.cat([torch.arange(n) for n in lengths])
    by_cu = apply_scaled_rotary(q, k, None, spec, layout="thd", cu_seqlens=cu_seqlens,
                                backend=backend)  # fmt: skip
    by_pos = apply_scaled_rotary(q, k, pos[None], spec, layout="thd", backend=backend)
    cos, sin = rotary_cos_sin(spec, torch.arange(8))
    by_table = apply_rotary(q, k, cos, sin, layout="thd", cu_seqlens=cu_seqlens, backend=backend)
    for got in (by_pos, by_table):
        for a, b in zip(got, by_cu, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for start, n in zip(cu_seqlens[:-1].tolist(), lengths, strict=True):
        qs, ks = (x[start : start + n].transpose(0, 1)[None] for x in (q, k))  # bhsd
        alone = apply_scaled_rotary(qs, ks, None, spec, backend=backend)
        for a, b in zip(alone, by_cu, strict=True):
            torch.testing.assert_close(a[0].transpose(0, 1), b[start : start + n])


def test_dynamic_methods_use_seq_len():
    spec = RopeScaling("dynamic_yarn", factor=4.0, original_max_position_embeddings=8,
                       rotary_dim=16)  # fmt: skip
    q, k = make_qk((1, 2, 1, 20, 16, 16), "bhsd", torch.float32)
    pos = torch.arange(20)
    long = apply_scaled_rotary(q, k, pos, spec, seq_len=20, backend="torch")
    cos, sin = rotary_cos_sin(spec, pos, seq_len=20)
    assert spec.attention_factor(20) > 1
    for a, b in zip(long, apply_rotary(q, k, cos, sin, backend="torch"), strict=True):
        assert torch.equal(a, b)
    short = apply_scaled_rotary(q, k, pos, spec, backend="torch")
    assert not torch.equal(short[0], long[0])


def test_auto_backend_is_torch_on_cpu_and_triton_needs_the_interpreter(monkeypatch):
    q, _ = make_qk((1, 1, 1, 2, 8, 8), "bhsd", torch.float32)
    assert rotary_module._backend("auto", q) == "torch"
    assert rotary_module._backend("triton", q) == "triton"  # interpreted in this module
    from yarnlib.kernels import triton_rotary

    monkeypatch.setattr(triton_rotary, "interprets", lambda: False)
    with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
        rotary_module._backend("triton", q)


def _bad_calls():
    q, k = make_qk((1, 2, 1, 4, 16, 16), "bhsd", torch.float32)
    cos, sin = rotary_cos_sin(make_spec(16), torch.arange(8))
    pos = torch.arange(4)
    spec = make_spec(16)
    return [
        ("layout", lambda: apply_rotary(q, k, cos, sin, pos, layout="sbhd")),
        ("backend", lambda: apply_rotary(q, k, cos, sin, pos, backend="cuda")),
        ("q.dtype", lambda: apply_rotary(q.int(), k, cos, sin, pos)),
        ("4-D tensor", lambda: apply_rotary(q[0], k, cos, sin, pos)),
        ("q and k must agree", lambda: apply_rotary(q, k[..., :8], cos, sin, pos)),
        ("q and k must share dtype", lambda: apply_rotary(q, k.half(), cos, sin, pos)),
        ("rotary_dim", lambda: apply_rotary(q, k, cos, sin, pos, rotary_dim=7)),
        ("rotary_dim", lambda: apply_rotary(q, k, cos[:, :9], sin[:, :9], pos)),
        ("cos: last dimension", lambda: apply_rotary(q, k, cos, sin, pos, rotary_dim=8)),
        ("cos and sin must have the same shape", lambda: apply_rotary(q, k, cos, sin[:4], pos)),
        ("position_ids must be", lambda: apply_rotary(q, k, cos, sin, pos.float())),
        ("position_ids must have shape", lambda: apply_rotary(q, k, cos, sin, pos[:3])),
        ("position_ids must lie in [0, 8)", lambda: apply_rotary(q, k, cos, sin, pos + 5)),
        ("must be per token", lambda: apply_rotary(q, k, cos, sin)),
        ("cos: with position_ids", lambda: apply_rotary(q, k, cos[None], sin[None], pos)),
        ("cu_seqlens is for layout='thd'", lambda: apply_scaled_rotary(
            q, k, None, spec, cu_seqlens=torch.tensor([0, 4]))),
        ("cu_seqlens must rise", lambda: apply_scaled_rotary(
            q[0].transpose(0, 1), k[0].transpose(0, 1), None, spec, layout="thd",
            cu_seqlens=torch.tensor([0, 3]))),
        ("not both", lambda: apply_scaled_rotary(
            q[0].transpose(0, 1), k[0].transpose(0, 1), pos, spec, layout="thd",
            cu_seqlens=torch.tensor([0, 4]))),
        ("needs position_ids or cu_seqlens", lambda: apply_scaled_rotary(
            q[0].transpose(0, 1), k[0].transpose(0, 1), None, spec, layout="thd")),
        ("spec must be", lambda: apply_scaled_rotary(q, k, pos, {"rope_type": "yarn"})),
        ("rotary_dim", lambda: apply_scaled_rotary(q, k, pos, make_spec(32))),
        ("inplace must be True or False", lambda: apply_rotary(q, k, cos, sin, pos, inplace=1)),
        ("float32/float16/bfloat16", lambda: apply_rotary(
            q.double(), k.double(), cos, sin, pos, backend="triton")),
        ("position_ids must be an int32 or int64", lambda: rotary_cos_sin(spec, [0, 1])),
    ]  # fmt: skip


@pytest.mark.parametrize("field, call", _bad_calls(), ids=lambda v: v if isinstance(v, str) else "")
def test_bad_input_raises_value_error_naming_the_field(field, call):
    with pytest.raises(ValueError, match=re.escape(field)):
        call()


def test_docs_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), {})
