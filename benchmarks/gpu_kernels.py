"""GPU check step: the compiled Triton kernel against the float64 reference of the kernel tests
(tests/kernel_cases.py), within the tests' tolerances.

First packed sequences (thd with cu_seqlens) and the long-context case of
test_kernels_precision.py (positions up to 131071, our error against transformers' own); then
every case of the tests' Triton grid (shapes with GQA, MQA and partial rotary; layouts bhsd,
bshd, thd; rotate-half and interleaved; float32, float16, bfloat16; table, per-token and
table-free angles), forward and backward. On a GPU every new specialisation compiles (about a
second each), so the grid runs in a shuffled order until its time budget is spent, and the
JSON (rewritten as results come) says how many cases ran.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
import time

import kernel_cases as kc  # the kernel tests' cases, without pytest (absent on the GPU)
import torch
from gpu_check import CHECKS_FAILED, absent_on_gpu_machine, step_arguments, write_json

from yarnlib.kernels import triton_rotary

BUDGET_S = 60  # grid cases stop starting after this; the driver kills the step at 100 s
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


def packed(device) -> list[dict]:
    """thd with cu_seqlens (positions restart in every sequence), each dtype; the failures."""
    failures = []
    for dtype in kc.DTYPES:
        try:
            for out, ref in kc.packed_case(dtype, "triton", device):
                kc.assert_matches(out, ref)
        except Exception as error:  # recorded like a failed case
            failures.append({"case": f"packed cu_seqlens {dtype}", "error": repr(error)})
    return failures


def report(path, state: dict) -> tuple[bool, list[str]]:
    """Write what is known so far (a step killed at its time limit keeps it); (passed, lines)."""
    rows, failures = state["precision"], state["failures"]
    passed = not failures and all(r["ok"] for r in rows) and state["cases_run"] is not None
    grid = (
        "grid not run yet"
        if state["cases_run"] is None
        else f"{state['cases_run']} of {state['cases_total']} grid cases (forward + backward)"
    )
    summary = [f"{grid}, 3 packed (cu_seqlens), {len(failures)} failed"]
    summary += [f"FAILED {f['case']}: {f['error']}" for f in failures[:5]]
    for r in rows:
        if "error" in r:
            summary.append(f"FAILED positions ≤ 131071: {r['error']}")
            continue
        verdict = "ok" if r["ok"] else "WORSE THAN TRANSFORMERS"
        summary.append(
            f"positions ≤ 131071, {r['dtype'].removeprefix('torch.')} {r['path']}: max error "
            f"{r['ours']:.3g} (transformers {r['transformers']:.3g}) {verdict}"
        )
    write_json(path, {**state, "passed": passed, "summary": summary,
                      "absent_on_gpu_machine": absent_on_gpu_machine()})  # fmt: skip
    return passed, summary


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
    state = {"device": str(device), "compiled": not interprets, "cases_total": len(cases),
             "cases_run": None, "budget_s": BUDGET_S, "failures": packed(device)}  # fmt: skip
    try:
        state["precision"] = precision(device)
    except Exception as error:  # recorded like a failed case
        state["precision"] = [{"path": "all", "dtype": "all", "ok": False, "error": repr(error)}]
    report(args.out, state)
    # the grid last: it runs until the budget is spent
    budget = math.inf if args.dry_run else BUDGET_S  # a loaded CI machine runs them all
    state["cases_run"], failures = run_cases(cases, device, start + budget)
    state["failures"] += failures
    state["seconds"] = round(time.monotonic() - start, 1)
    passed, summary = report(args.out, state)
    print("\n".join(summary))
    return 0 if passed else CHECKS_FAILED


if __name__ == "__main__":
    sys.exit(main())
