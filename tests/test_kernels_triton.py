"""The Triton backend against the float64 reference of kernel_cases.py (tolerances there).

Runs through Triton's interpreter on CPU tensors; a separate file so that ``pytest -n 2
--dist loadfile`` runs it beside the torch-backend cases.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from kernel_cases import TRITON_SHAPES, assert_matches, run_case  # noqa: E402
from test_kernels import cases  # noqa: E402


@pytest.mark.parametrize("shape, layout, interleaved, dtype, mode", cases(TRITON_SHAPES))
def test_triton_backend_matches_float64_reference(shape, layout, interleaved, dtype, mode):
    for out, ref in run_case(shape, layout, interleaved, dtype, mode, "triton"):
        assert out.dtype == dtype
        assert_matches(out, ref)
