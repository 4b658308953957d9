"""The plan's training-step peak against a measured one: a tiny Llama's real training step on
CPU (``yarnlib finetune``'s loss, backward and AdamW), peak resident memory minus the
baseline, in a fresh process; benchmarks/plan_memory.py runs the full table."""

import sys

import pytest
import transformers

from yarnlib.plan.measure import TINY, measure_in_subprocess

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")


# transformers 4.57 (the compat lane) hands SDPA a materialised [1, 1, T, T] bool mask on CPU
# where 5.x passes is_causal=True (checked by wrapping F.scaled_dot_product_attention): the
# float32 full-logits step peaks 16.5 % above the plan there (250 vs 215 MB at 2k, the extra
# already there in the forward: 2 layers x 16 MB for a float32 [T, T] each + the 4 MB mask would
# match). The plan models the pinned 5.x stack; the row is skipped there (a minute's run to
# show a known excess; docs/plan.md has the numbers).
OLD_TRANSFORMERS = int(transformers.__version__.split(".")[0]) < 5
FULL_LOGITS_ON_4 = pytest.mark.skipif(
    OLD_TRANSFORMERS, reason="transformers 4.x: a [T, T] SDPA mask per layer"
)


@pytest.mark.parametrize(
    "precision, checkpointing, chunk",
    [pytest.param("fp32", False, 0, marks=FULL_LOGITS_ON_4), ("bf16", True, 1024)],
)
def test_measured_peak_within_15_percent_of_the_plan(precision, checkpointing, chunk):
    row = dict(model=TINY, tokens=2048, precision=precision, attn="sdpa")
    result = measure_in_subprocess(dict(row, checkpointing=checkpointing, chunk=chunk))
    assert result["measured_bytes"] > 50 * 2**20  # well above the allocator's noise
    assert 0.85 <= result["measured_bytes"] / result["planned_bytes"] <= 1.15
