"""The plan's training-step peak against a measured one: a tiny Llama's real training step on
CPU (``yarnlib finetune``'s loss, backward and AdamW), peak resident memory minus the
baseline, in a fresh process; benchmarks/plan_memory.py runs the full table."""

import sys

import pytest

from yarnlib.plan.measure import TINY, measure_in_subprocess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")


@pytest.mark.parametrize(
    "precision, checkpointing, chunk",
    [("fp32", False, 0), ("bf16", True, 1024)],
)
def test_measured_peak_within_15_percent_of_the_plan(precision, checkpointing, chunk):
    row = dict(model=TINY, tokens=2048, precision=precision, attn="sdpa")
    result = measure_in_subprocess(dict(row, checkpointing=checkpointing, chunk=chunk))
    assert result["measured_bytes"] > 50 * 2**20  # well above the allocator's noise
    assert 0.85 <= result["measured_bytes"] / result["planned_bytes"] <= 1.15
