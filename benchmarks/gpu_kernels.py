"""GPU check step: the compiled Triton kernel against the float64 reference of the kernel tests.

Every case of the kernel tests' Triton grid (tests/kernel_cases.py: shapes with GQA, MQA and
partial rotary; layouts bhsd, bshd, thd; rotate-half and interleaved; float32, float16,
bfloat16; table, per-token and table-free angles), forward and backward, within the tests'
tolerances; then the long-context case of test_kernels_precision.py: positions up to 131071,
our error against transformers' own. On a GPU every new specialisation compiles (about a
second each), so the cases run in a shuffled order until the time budget is spent and the
JSON says how many ran.
"""

from __future__ import annotations

import itertools
import random
import sys
import time

import kernel_cases as kc  # the kernel tests' cases, without pytest (absent on the GPU)
import torch
from gpu_check import CHECKS_FAILED, absent_on_gpu_machine, step_arguments, write_json

from yarnlib.kernels import triton_rotary

BUDGET_S = 70  # cases stop starting after this; the driver kills the step at 100 s
DRY_RUN_CASES = 3


def case_name(case) -> str:
    shape, layout, interleaved, dtype, mode = case
    pairing = "interleaved" if interleaved else "half"
    return f"{shape} {layout} {pairing} {str(dtype).removeprefix('torch.')} {mode}"


def run_cases(cases, device, deadline) -> tuple[int, list[dict]]:
    """(cases run, failures); a failure is an error above tolerance or an exception."""
    failures, ran = [], 0
    for case in cases:
        if time.monotonic() > deadline:
            break
        ran += 1
        try:
            for out, ref in kc.run_case(*case, "triton", device=device, backward=True):
                kc.assert_matches(out, ref)
        except Exception as error:  # each failure is recorded; none stops the others
            failures.append({"case": case_name(case), "error": f"{type(error).__name__}: {error}"})
    return ran, failures


def precision(device) -> list[dict]:
    """Max error against float64 at positions up to 131071, ours (Triton) and transformers'."""
    q, k, position_ids, reference, rope = kc.long_context_case(device)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        qd, kd = q.to(dtype), k.to(dtype)
        refs = reference(qd), reference(kd)
        theirs = kc.max_error(kc.transformers_rotary(qd, kd, position_ids, rope), refs)
        for path in ("table_free", "table"):
            ours = kc.max_error(kc.our_rotary(qd, kd, position_ids, path, "triton"), refs)
            # the tests' criteria: float32 no worse than transformers (up to libm), bf16 better
            ok = ours <= theirs + kc.LIBM_SLACK if dtype == torch.float32 else ours < theirs
            rows.append({"dtype": str(dtype), "path": path, "ours": ours, "transformers": theirs,
                         "ok": ok})  # fmt: skip
    return rows


def main() -> int:
    args = step_arguments(__doc__)
    device = torch.device("cpu" if args.dry_run else "cuda")
    interprets = triton_rotary.interprets()  # the driver's environment decides
    if interprets != args.dry_run:
        raise SystemExit(f"the kernel would run {'inter' if interprets else 'com'}preted")
    cases = list(
        itertools.product(kc.TRITON_SHAPES, kc.LAYOUTS, (False, True), kc.DTYPES, kc.MODES)
    )
    random.Random(0).shuffle(cases)
    if args.dry_run:
        cases = cases[:DRY_RUN_CASES]
    start = time.monotonic()
    ran, failures = run_cases(cases, device, start + BUDGET_S)
    for dtype in kc.DTYPES:  # thd with cu_seqlens: positions restart in every sequence
        try:
            for out, ref in kc.packed_case(dtype, "triton", device):
                kc.assert_matches(out, ref)
        except Exception as error:  # recorded like a failed case
            failures.append({"case": f"packed cu_seqlens {dtype}", "error": repr(error)})
    try:
        rows = precision(device)
    except Exception as error:  # recorded like a failed case
        rows = [{"path": "all", "dtype": "all", "ok": False, "error": repr(error)}]
    passed = not failures and all(r["ok"] for r in rows)
    summary = [
        f"{ran} of {len(cases)} cases run (forward + backward) and 3 packed (cu_seqlens), "
        f"{len(failures)} failed"
        + ("" if ran == len(cases) else f" (time budget {BUDGET_S} s spent)"),
        *(f"FAILED {f['case']}: {f['error']}" for f in failures[:5]),
    ]
    for r in rows:
        if "error" in r:
            summary.append(f"FAILED positions ≤ 131071: {r['error']}")
            continue
        verdict = "ok" if r["ok"] else "WORSE THAN TRANSFORMERS"
        summary.append(
            f"positions ≤ 131071, {r['dtype'].removeprefix('torch.')} {r['path']}: max error "
            f"{r['ours']:.3g} (transformers {r['transformers']:.3g}) {verdict}"
        )
    write_json(args.out, {
        "device": str(device), "compiled": not interprets, "cases_total": len(cases),
        "cases_run": ran, "failures": failures, "precision": rows, "passed": passed,
        "seconds": round(time.monotonic() - start, 1), "summary": summary,
        "absent_on_gpu_machine": absent_on_gpu_machine(),
    })  # fmt: skip
    print("\n".join(summary))
    return 0 if passed else CHECKS_FAILED


if __name__ == "__main__":
    sys.exit(main())
