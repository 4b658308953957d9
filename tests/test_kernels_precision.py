"""Precision at long context: positions up to 131071, against a float64 reference.

The float32 angle position × inv_freq is the contract (one float32 ulp of an angle near
131071 is 2⁻⁷ rad), so every float32 path, transformers' included, carries that rounding.
What must not happen is anything worse: our error may not exceed transformers' own.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from kernel_cases import (  # noqa: E402
    LIBM_SLACK,
    long_context_case,
    max_error,
    our_rotary,
    transformers_rotary,
)


@pytest.fixture(scope="module")
def setup():
    return long_context_case()


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("path", ["table_free", "table"])
def test_float32_error_at_131071_is_no_larger_than_transformers(setup, backend, path):
    q, k, position_ids, reference, rope = setup
    refs = reference(q), reference(k)
    theirs = max_error(transformers_rotary(q, k, position_ids, rope), refs)
    ours = max_error(our_rotary(q, k, position_ids, path, backend), refs)
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
    ours = max_error(our_rotary(qb, kb, position_ids, "table_free", backend), refs)
    print(f"\nbf16 {backend}: ours {ours:.4g} transformers {theirs:.4g}")
    assert ours < theirs, (ours, theirs)
