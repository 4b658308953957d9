"""PoSE position ids (yarnlib.pose): the sampler's properties, document restarts, the kernel at
skipped positions against float64, and flash-attn's view of the sequence starts."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_cases import assert_matches, reference

import yarnlib
from yarnlib import RopeScaling
from yarnlib.kernels import apply_rotary, apply_scaled_rotary
from yarnlib.pose import check_pose, pose_position_ids, restart_at


def draws(count, window, target, chunks, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return pose_position_ids(count, window, target, chunks, generator=generator)


@pytest.mark.parametrize("chunks", [1, 2, 3, 16])
def test_positions_follow_the_paper(chunks):
    window, target = 16, 64
    ids, starts = draws(400, window, target, chunks)
    assert ids.dtype == starts.dtype == torch.int64
    assert ids.shape == (400, window) and starts.shape == (400, chunks)
    assert (starts[:, 0] == 0).all() and (ids[:, 0] == 0).all()  # chunk 0 from position 0
    lengths = torch.diff(starts, append=torch.full((400, 1), window))
    assert (lengths >= 1).all() and (lengths.sum(1) == window).all()
    assert (ids < target).all() and (ids[:, 1:] > 0).all()  # 0 only at the row start
    step = torch.diff(ids)
    inside = torch.ones_like(step, dtype=torch.bool)
    rows = torch.arange(400)[:, None].expand(-1, chunks - 1)
    inside[rows, starts[:, 1:] - 1] = False  # the step into each later chunk
    assert (step[inside] == 1).all()  # contiguous within a chunk
    assert (step >= 1).all()  # skips are non-decreasing: chunks never overlap
    skips = ids.gather(1, starts) - starts
    assert (torch.diff(skips) >= 0).all() and (skips[:, 0] == 0).all()


def test_draws_cover_the_target_and_skip_uniformly():
    window, target, count = 8, 40, 3000
    ids, starts = draws(count, window, target, 2)
    assert set(ids.flatten().tolist()) == set(range(target))
    # two chunks: the skip is uniform on {0, …, target - window}, the first chunk's length
    # uniform on {1, …, window - 1}; means within 5 standard errors
    skip = (ids[:, -1] - (window - 1)).double()
    most = target - window
    sd = math.sqrt(((most + 1) ** 2 - 1) / 12)
    assert abs(skip.mean() - most / 2) < 5 * sd / math.sqrt(count)
    assert skip.min() == 0 and skip.max() == most
    first = starts[:, 1].double()
    sd = math.sqrt(((window - 1) ** 2 - 1) / 12)
    assert abs(first.mean() - window / 2) < 5 * sd / math.sqrt(count)


def test_same_seed_same_ids_other_seed_other_ids():
    a, b, c = draws(4, 32, 512, 3, seed=5), draws(4, 32, 512, 3, seed=5), draws(4, 32, 512, 3, 6)
    assert torch.equal(a.position_ids, b.position_ids) and torch.equal(
        a.chunk_starts, b.chunk_starts
    )
    assert not torch.equal(a.position_ids, c.position_ids)


def test_a_document_inside_a_row_starts_at_zero_and_keeps_its_skips():
    ids = torch.tensor([[0, 1, 2, 9, 10, 11, 12, 30]])
    starts = torch.zeros_like(ids, dtype=torch.bool)
    starts[0, 4] = True  # a document begins at offset 4, inside the second chunk
    assert restart_at(ids, starts).tolist() == [[0, 1, 2, 9, 0, 1, 2, 20]]
    drawn = pose_position_ids(1, 8, 64, 3, generator=torch.Generator(), document_starts=starts)
    assert drawn.position_ids[0, 4] == 0 and (drawn.position_ids[0, 5:] > 0).all()


@pytest.mark.parametrize(
    ("window", "target", "chunks", "field"),
    [(16, 16, 2, "target_length"), (16, 8, 2, "target_length"), (16, 64, 0, "chunks"),
     (16, 64, 17, "chunks"), (16, 64.0, 2, "target_length"), (0, 64, 1, "window")],
)  # fmt: skip
def test_bad_sizes_are_refused_by_name(window, target, chunks, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        check_pose(window, target, chunks)


def test_public_function():
    assert yarnlib.pose_position_ids is pose_position_ids


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_kernel_at_skipped_positions_matches_float64(backend):
    """Table-free angles from PoSE ids (up to 32767 from a 64-token row), forward and
    backward, against the float64 rotation at the spec's float32 angles."""
    spec = RopeScaling("yarn", factor=8.0, original_max_position_embeddings=4096,
                       rope_theta=1e4, rotary_dim=64)  # fmt: skip
    pos = draws(2, 64, 32768, 3, seed=1).position_ids
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 64, 64, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, 64, 64, generator=gen, requires_grad=True)
    angle = (pos.float()[..., None] * spec.inv_freq()).double()
    cos, sin = angle.cos() * spec.attention_factor(), angle.sin() * spec.attention_factor()
    table = spec.inv_freq()[None] * torch.arange(32768, dtype=torch.float32)[:, None]
    table_cos, table_sin = (f(table) * spec.attention_factor() for f in (torch.cos, torch.sin))
    for outs in (
        apply_scaled_rotary(q, k, pos, spec, backend=backend),
        apply_rotary(q, k, table_cos, table_sin, pos, rotary_dim=64, backend=backend),
    ):
        for out, x in zip(outs, (q, k), strict=True):
            assert_matches(out, reference(x.detach(), "bhsd", cos, sin, 64, False))
        grads = [torch.randn(o.shape, generator=gen) for o in outs]
        dq, dk = torch.autograd.grad(outs, (q, k), grads)
        for got, g in zip((dq, dk), grads, strict=True):
            assert_matches(got, reference(g, "bhsd", cos, -sin, 64, False))
