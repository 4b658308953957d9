"""yarnlib.kernels against a float64 reference: both backends, every layout, pairing and dtype
(the cases, the reference and the tolerances: kernel_cases.py).

The Triton cases (test_kernels_triton.py) run through its interpreter on CPU tensors
(TRITON_INTERPRET=1, set before Triton is first imported), on fewer and smaller shapes than
the torch backend because every interpreted launch costs tens of milliseconds.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import itertools  # noqa: E402

import pytest  # noqa: E402
from kernel_cases import (  # noqa: E402
    DTYPES,
    LAYOUTS,
    MODES,
    TORCH_SHAPES,
    assert_matches,
    run_case,
)


def cases(shapes):
    return [
        pytest.param(*c, id="-".join(map(str, (*c[0], *c[1:]))).replace("torch.", ""))
        for c in itertools.product(shapes, LAYOUTS, (False, True), DTYPES, MODES)
    ]


@pytest.mark.parametrize("shape, layout, interleaved, dtype, mode", cases(TORCH_SHAPES))
def test_torch_backend_matches_float64_reference(shape, layout, interleaved, dtype, mode):
    for out, ref in run_case(shape, layout, interleaved, dtype, mode, "torch"):
        assert out.dtype == dtype
        assert_matches(out, ref)
