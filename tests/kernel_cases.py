"""The kernel tests' cases and float64 references, without pytest: shared by the
test_kernels*.py files and benchmarks/gpu_kernels.py (the GPU machine has no pytest).

Importing this module does not import Triton: whoever imports it first decides whether the
kernel is interpreted (the tests set TRITON_INTERPRET=1) or compiled (the GPU check).

Tolerances (stated once, used everywhere):
- float32: |out − ref| ≤ FP32_TOL · (1 + |ref|): a few float32 roundings of cos, sin and
  two products, relative to the size of the pair being rotated;
- float16/bfloat16: |out − round(ref)| ≤ 1 ulp of the rounded reference (one rounding of the
  float32 result; the interpreter truncates instead of rounding, hence not ½ ulp), plus the
  float32 tolerance, which matters only where a rotated pair cancels to near zero.
"""

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from yarnlib import RopeScaling
from yarnlib.hf_compat import hf_format
from yarnlib.kernels import apply_rotary, apply_scaled_rotary, rotary_cos_sin

FP32_TOL = 1e-6
MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}
MIN_EXPONENT = {torch.float16: -14, torch.bfloat16: -126}
TABLE_ROWS = 4096
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("bhsd", "bshd", "thd")
MODES = ("table", "per_token", "table_free")

# (batch, q heads, kv heads, seq, head_dim, rotary_dim): seq 1/7/333, MHA/GQA/MQA, odd dims.
TORCH_SHAPES = [
    (1, 1, 1, 1, 64, 64),
    (2, 3, 1, 7, 80, 80),
    (1, 32, 8, 33, 128, 128),
    (2, 3, 1, 7, 128, 32),
    (1, 32, 8, 7, 256, 256),
    (2, 1, 1, 333, 64, 64),
]
TRITON_SHAPES = [
    (1, 1, 1, 1, 64, 64),
    (2, 3, 1, 7, 80, 80),
    (1, 32, 8, 33, 128, 32),
    (1, 3, 1, 333, 256, 256),
]


def make_spec(rotary_dim: int) -> RopeScaling:
    return RopeScaling(
        "yarn", factor=8.0, original_max_position_embeddings=512, rope_theta=1e4,
        rotary_dim=rotary_dim,
    )  # fmt: skip


def make_qk(shape, layout, dtype, seed=0):
    """Random q, k in ``layout`` (thd packs batch × seq tokens)."""
    batch, hq, hk, seq, head_dim, _ = shape
    gen = torch.Generator().manual_seed(seed)

    def one(heads):
        if layout == "bhsd":
            dims = (batch, heads, seq, head_dim)
        elif layout == "bshd":
            dims = (batch, seq, heads, head_dim)
        else:
            dims = (batch * seq, heads, head_dim)
        return torch.randn(dims, generator=gen).to(dtype)

    return one(hq), one(hk)


def to_bshd(x, layout):
    if layout == "bhsd":
        return x.transpose(1, 2)
    return x[None] if layout == "thd" else x


def from_bshd(x, layout):
    if layout == "bhsd":
        return x.transpose(1, 2)
    return x[0] if layout == "thd" else x


def reference(x, layout, cos, sin, rotary_dim, interleaved):
    """float64 rotation as a complex product; ``cos``/``sin`` per token ``[1|B, S, rd/2]``."""
    xv = to_bshd(x, layout).double()
    half = rotary_dim // 2
    rot, tail = xv[..., :rotary_dim], xv[..., rotary_dim:]
    if interleaved:
        z = torch.complex(rot[..., 0::2], rot[..., 1::2])
    else:
        z = torch.complex(rot[..., :half], rot[..., half:])
    z = z * torch.complex(cos.double(), sin.double())[:, :, None, :]
    if interleaved:
        rot = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    else:
        rot = torch.cat((z.real, z.imag), dim=-1)
    return from_bshd(torch.cat((rot, tail), dim=-1), layout)


def assert_matches(out, ref):
    """The per-dtype tolerance of the module docstring."""
    assert out.shape == ref.shape
    if out.dtype == torch.float32:
        err = (out.double() - ref).abs()
        bound = FP32_TOL * (1 + ref.abs())
        assert (err <= bound).all(), f"max error {err.max().item():.3g}"
        return
    rounded = ref.to(out.dtype).double()
    _, exponent = torch.frexp(torch.maximum(rounded.abs(), out.double().abs()))
    exponent = torch.clamp(exponent - 1, min=MIN_EXPONENT[out.dtype])
    ulp = torch.pow(2.0, (exponent - MANTISSA_BITS[out.dtype]).double())
    err = (out.double() - rounded).abs() - FP32_TOL * (1 + ref.abs())
    assert (err <= ulp).all(), f"max error {(err / ulp).max().item():.3g} ulp"


def make_positions(shape, layout, gen):
    """Arbitrary positions (not sorted, repeats allowed) as the layout expects them."""
    batch, _, _, seq, _, _ = shape
    dims = (batch * seq,) if layout == "thd" else (batch, seq)
    return torch.randint(0, TABLE_ROWS, dims, generator=gen)


def run_case(shape, layout, interleaved, dtype, mode, backend, device="cpu", backward=False):
    """Our output and the float64 reference for one case; returns ``[(out, ref), ...]``.

    ``backward`` adds the gradients of q and k for random output gradients, against the
    reference rotation by −θ (a rotation's adjoint). benchmarks/gpu_kernels.py runs these
    cases on CUDA.
    """
    rotary_dim = shape[5]
    spec = make_spec(rotary_dim)
    q, k = (x.to(device).requires_grad_(backward) for x in make_qk(shape, layout, dtype))
    gen = torch.Generator().manual_seed(1)
    pos = make_positions(shape, layout, gen).to(device)
    table_dtype = torch.float32 if dtype == torch.float32 else dtype
    kwargs = dict(layout=layout, interleaved=interleaved, backend=backend)
    if mode == "table_free":
        out = apply_scaled_rotary(q, k, pos, spec, **kwargs)
        # The angle is float32 by contract; everything after it is float64 here.
        angle = (pos.float()[..., None] * spec.inv_freq().to(device)).double()
        factor = spec.attention_factor()
        cos, sin = angle.cos() * factor, angle.sin() * factor
    else:
        rows = torch.arange(TABLE_ROWS, device=device)
        table_cos, table_sin = rotary_cos_sin(spec, rows, dtype=table_dtype)
        cos, sin = table_cos[pos], table_sin[pos]
        if mode == "table":
            out = apply_rotary(q, k, table_cos, table_sin, pos, **kwargs)
        else:
            out = apply_rotary(q, k, cos, sin, **kwargs)
        half = rotary_dim // 2
        cos, sin = cos[..., :half], sin[..., :half]
    if layout == "thd":
        cos, sin = cos[None], sin[None]
    refs = [reference(x.detach(), layout, cos, sin, rotary_dim, interleaved) for x in (q, k)]
    pairs = list(zip(out, refs, strict=True))
    if backward:
        grads = [g.to(device) for g in make_qk(shape, layout, dtype, seed=2)]
        torch.autograd.backward(out, grads)
        pairs += [
            (x.grad, reference(g, layout, cos, -sin, rotary_dim, interleaved))
            for x, g in zip((q, k), grads, strict=True)
        ]
    return pairs


def packed_case(dtype, backend, device="cpu", lengths=(5, 1, 7, 300)):
    """thd with ``cu_seqlens`` (positions restart in every packed sequence), with tables and
    table-free: ``[(out, ref), ...]`` against the float64 reference at the restarted positions."""
    rotary_dim = 128
    spec = make_spec(rotary_dim)
    q, k = (x.to(device) for x in make_qk((1, 4, 2, sum(lengths), 128, rotary_dim), "thd", dtype))
    offsets = torch.tensor(lengths).cumsum(0)
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int32), offsets.int()]).to(device)
    pos = torch.cat([torch.arange(n) for n in lengths]).to(device)
    kwargs = dict(layout="thd", cu_seqlens=cu_seqlens, backend=backend)
    table_cos, table_sin = rotary_cos_sin(spec, torch.arange(max(lengths), device=device))
    angle = (pos.float()[:, None] * spec.inv_freq().to(device)).double()
    factor = spec.attention_factor()
    half = rotary_dim // 2
    runs = (
        (apply_scaled_rotary(q, k, None, spec, **kwargs), angle.cos() * factor,
         angle.sin() * factor),
        (apply_rotary(q, k, table_cos, table_sin, **kwargs), table_cos[pos][:, :half],
         table_sin[pos][:, :half]),
    )  # fmt: skip
    pairs = []
    for outs, cos, sin in runs:
        refs = [reference(x, "thd", cos[None], sin[None], rotary_dim, False) for x in (q, k)]
        pairs += list(zip(outs, refs, strict=True))
    return pairs


# -- positions up to 131071 (test_kernels_precision.py) -------------------------------------

LONG_SPEC = RopeScaling(
    "yarn", factor=32.0, original_max_position_embeddings=4096, rope_theta=1e6, rotary_dim=128
)
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 128
# libm differences in cos/sin (≤ 1 float32 ulp) on top of the shared angle rounding.
LIBM_SLACK = 1e-6


def long_context_case(device="cpu"):
    """q, k at positions up to 131071, their float64 reference, and transformers' rotary
    module (benchmarks/gpu_kernels.py runs this on CUDA)."""
    gen = torch.Generator().manual_seed(0)
    pos = torch.cat(
        [torch.tensor([131071, 131070, 65537]), torch.randint(0, 131072, (253,), generator=gen)]
    )
    q = torch.randn(1, HEADS, pos.numel(), HEAD_DIM, generator=gen).to(device)
    k = torch.randn(1, KV_HEADS, pos.numel(), HEAD_DIM, generator=gen).to(device)
    pos = pos.to(device)
    position_ids = pos[None]
    # Reference: the spec's float32 inv_freq, everything else exact in float64.
    angle = pos.double()[:, None] * LONG_SPEC.inv_freq().to(device).double()
    factor = LONG_SPEC.attention_factor()
    cos, sin = angle.cos() * factor, angle.sin() * factor

    def reference(x):
        x1, x2 = x.double().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    config = LlamaConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                         num_key_value_heads=KV_HEADS, **LONG_SPEC.to_hf(hf_format()))  # fmt: skip
    rope = LlamaRotaryEmbedding(config).to(device)
    assert torch.equal(rope.inv_freq.cpu(), LONG_SPEC.inv_freq())
    return q, k, position_ids, reference, rope


def max_error(outs, refs):
    return max((o.double() - r).abs().max().item() for o, r in zip(outs, refs, strict=True))


def transformers_rotary(q, k, position_ids, rope):
    cos, sin = rope(q, position_ids)
    return apply_rotary_pos_emb(q, k, cos, sin)


def our_rotary(q, k, position_ids, path, backend):
    if path == "table_free":
        return apply_scaled_rotary(q, k, position_ids, LONG_SPEC, backend=backend)
    cos, sin = rotary_cos_sin(LONG_SPEC, position_ids)
    return apply_rotary(q, k, cos, sin, backend=backend)
