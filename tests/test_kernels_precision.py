"""Precision at long context: positions up to 131071, against a float64 reference.

The float32 angle position × inv_freq is the contract (one float32 ulp of an angle near
131071 is 2⁻⁷ rad), so every float32 path, transformers' included, carries that rounding.
What must not happen is anything worse: our error may not exceed transformers' own.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from yarnlib import RopeScaling  # noqa: E402
from yarnlib.hf_compat import hf_format
from yarnlib.kernels import apply_rotary, apply_scaled_rotary, rotary_cos_sin  # noqa: E402

SPEC = RopeScaling(
    "yarn", factor=32.0, original_max_position_embeddings=4096, rope_theta=1e6, rotary_dim=128
)
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 128
# libm differences in cos/sin (≤ 1 float32 ulp) on top of the shared angle rounding.
LIBM_SLACK = 1e-6


@pytest.fixture(scope="module")
def setup():
    gen = torch.Generator().manual_seed(0)
    pos = torch.cat(
        [torch.tensor([131071, 131070, 65537]), torch.randint(0, 131072, (253,), generator=gen)]
    )
    position_ids = pos[None]
    q = torch.randn(1, HEADS, pos.numel(), HEAD_DIM, generator=gen)
    k = torch.randn(1, KV_HEADS, pos.numel(), HEAD_DIM, generator=gen)
    # Reference: the spec's float32 inv_freq, everything else exact in float64.
    angle = pos.double()[:, None] * SPEC.inv_freq().double()
    factor = SPEC.attention_factor()
    cos, sin = angle.cos() * factor, angle.sin() * factor

    def reference(x):
        x1, x2 = x.double().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    config = LlamaConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                         num_key_value_heads=KV_HEADS, **SPEC.to_hf(hf_format()))  # fmt: skip
    rope = LlamaRotaryEmbedding(config)
    assert torch.equal(rope.inv_freq, SPEC.inv_freq())
    return q, k, position_ids, reference, rope


def max_error(outs, refs):
    return max((o.double() - r).abs().max().item() for o, r in zip(outs, refs, strict=True))


def transformers_rotary(q, k, position_ids, rope):
    cos, sin = rope(q, position_ids)
    return apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("path", ["table_free", "table"])
def test_float32_error_at_131071_is_no_larger_than_transformers(setup, backend, path):
    q, k, position_ids, reference, rope = setup
    refs = reference(q), reference(k)
    theirs = max_error(transformers_rotary(q, k, position_ids, rope), refs)
    if path == "table_free":
        outs = apply_scaled_rotary(q, k, position_ids, SPEC, backend=backend)
    else:
        cos, sin = rotary_cos_sin(SPEC, position_ids)
        outs = apply_rotary(q, k, cos, sin, backend=backend)
    ours = max_error(outs, refs)
    assert 1e-4 < theirs < 0.1  # the float32 angle rounding is visible at these positions
    print(f"\n{path} {backend}: ours {ours:.4g} transformers {theirs:.4g}")
    assert ours <= theirs + LIBM_SLACK, (ours, theirs)
    if backend == "torch":
        assert ours == theirs  # the same float32 operations


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bfloat16_error_beats_transformers_bfloat16_path(setup, backend):
    """transformers multiplies in bf16 with bf16 cos/sin; we keep float32 until the store."""
    q, k, position_ids, reference, rope = setup
    qb, kb = q.bfloat16(), k.bfloat16()
    refs = reference(qb), reference(kb)
    theirs = max_error(transformers_rotary(qb, kb, position_ids, rope), refs)
    ours = max_error(apply_scaled_rotary(qb, kb, position_ids, SPEC, backend=backend), refs)
    print(f"\nbf16 {backend}: ours {ours:.4g} transformers {theirs:.4g}")
    assert ours < theirs, (ours, theirs)
