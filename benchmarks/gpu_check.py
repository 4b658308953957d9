"""One GPU pass, ready to run in one go: yarnlib's Triton kernel and the patched model on CUDA,
measured against the targets, in at most 8 minutes (sizes, repeats and per-step time limits).

    benchmarks/gpu_check.sh [--out DIR]                        # a CUDA machine (make gpu-check)
    python benchmarks/gpu_check.py --dry-run --out DIR         # CPU rehearsal, tiny sizes

Every step runs in a process of its own under its own time limit, so a failure, a hang or a
CUDA error that poisons a process does not hide the other steps:

- ``kernels`` (gpu_kernels.py): the compiled kernel against the kernel tests' float64
  reference, forward and backward, and at positions up to 131071;
- ``rope_configs`` (gpu_rope_configs.py): the kernel's tile and warp count that move the
  most bytes on this GPU (yarnlib's defaults come from it);
- ``rope_kernels`` (rope_kernels.py): speed at 1k..128k against transformers eager,
  torch.compile, Liger (when installed) and a device-to-device copy, per eager call and from
  CUDA graphs, with the kernel launched as ``rope_configs`` found best;
- ``model`` (gpu_model.py): a patched 7B-shaped model (2 layers) at 16k and 64k against the
  same model configured natively in transformers;
- ``long_context`` (gpu_long_context.py): ``yarnlib eval perplexity`` and ``yarnlib
  finetune`` at 32k with a random model of SmolLM2-135M's shape.

Each step writes ``DIR/<step>.json`` and its log to ``DIR/logs/``; this driver writes
``DIR/summary.json`` and ``DIR/summary.txt`` (the targets, met or missed) and prints the
summary. ``--dry-run`` runs the same steps on CPU tensors, Triton's interpreter and tiny
sizes, without time limits (tests/test_gpu_check.py runs it in CI, so the script cannot rot
between GPUs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# name: seconds it may take; with the start-up (~30 s) the pass fits in 8 minutes
STEPS = {"kernels": 100, "rope_configs": 80, "rope_kernels": 150, "model": 90, "long_context": 110}
BUDGET_S = 490  # all steps together: a step gets at most what is left of it
MIN_STEP_S = 20  # a step is not started with less time left than this
CHECKS_FAILED = 3  # a step's exit code when it ran to the end but a correctness check failed
LONG_SEQ = 16384  # the speed targets hold from this many tokens on
# Longest first: the targets' rows (≥ 16k) are in the JSON even if torch.compile's
# recompilations spend the step's time before the short lengths.
ROPE_SEQS = ["131072", "65536", "32768", "16384", "8192", "4096", "2048", "1024"]
DRY_RUN_ROPE = [
    "--seq", "64", "--repeats", "1", "--backend", "triton",
    "--methods", "hf_eager,ours_table,ours_table_free",
]  # fmt: skip
# (name, what, wanted, kind): the value must be at least ("min") or at most ("max") wanted
TARGETS = [
    ("copy_share", "ours forward bandwidth / copy bandwidth, ≥ 16k tokens", 0.8, "min"),
    ("vs_liger", "Liger / ours forward+backward time, ≥ 16k tokens", 1.3, "min"),
    ("vs_eager", "transformers eager / ours forward+backward time, ≥ 16k tokens", 4.0, "min"),
    ("model_time", "patched model with the kernel / native time", 1.0, "max"),
]


# What the GPU machine's Python lacks: a step that imports one of them fails there, so every
# step records what it imported of them and the dry run's test asserts none. (matplotlib is
# missing there too; the eval commands skip their plots without it.)
GPU_MACHINE_LACKS = ("pytest", "vllm", "flash_attn", "lm_eval", "datasets")


def absent_on_gpu_machine() -> list[str]:
    """The packages of GPU_MACHINE_LACKS this process has imported."""
    return sorted({name.split(".")[0] for name in sys.modules} & set(GPU_MACHINE_LACKS))


def write_json(path: Path, data) -> None:
    """Atomically: a killed run leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(data, indent=2, default=str) + "\n")
    staging.replace(path)


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def step_arguments(doc: str) -> argparse.Namespace:
    """The arguments every gpu_*.py step takes from this driver."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the step's JSON file")
    parser.add_argument("--scratch", type=Path, required=True, help="folder for large files")
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny")
    return parser.parse_args()


def step_command(
    name: str, out: Path, scratch: Path, dry_run: bool, kernel_config: str | None = None
) -> list[str]:
    if name == "rope_kernels":
        extra = DRY_RUN_ROPE if dry_run else ["--seq", *ROPE_SEQS]
        extra += ["--kernel-config", kernel_config] if kernel_config else []
        return [str(HERE / "rope_kernels.py"), "--out", str(out / f"{name}.json"), *extra]
    if name == "rope_configs":
        command = [str(HERE / "gpu_rope_configs.py"), "--out", str(out / f"{name}.json")]
        return command + (["--dry-run"] if dry_run else [])
    command = [str(HERE / f"gpu_{name}.py"), "--out", str(out / f"{name}.json")]
    return command + ["--scratch", str(scratch)] + (["--dry-run"] if dry_run else [])


def step_environment(dry_run: bool) -> dict:
    """The steps import yarnlib and the tests' helpers from this tree; a dry run hides any GPU
    and interprets Triton, a real run must compile it (the Makefile exports the interpreter)."""
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if dry_run:
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def run_step(command: list[str], log: Path, timeout_s: float, env: dict) -> dict:
    """Run one step in its own process group (compile workers die with it on a timeout)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with log.open("w") as stream:
        proc = subprocess.Popen(
            [sys.executable, *command],
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=None if math.isinf(timeout_s) else timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # also on Ctrl-C: the step runs in its own session, out of the terminal's reach
            with contextlib.suppress(ProcessLookupError):  # gone when every member has exited
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if code is None:
        status = "timeout"
    else:
        status = {0: "ok", CHECKS_FAILED: "checks failed"}.get(code, "error")
    return {
        "status": status,
        "returncode": code,
        "seconds": round(time.monotonic() - start, 1),
        "timeout_s": None if math.isinf(timeout_s) else round(timeout_s),
        "log": str(log),
    }


def modified(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def environment(dry_run: bool) -> dict:
    """Versions, and the GPU (a dry run does not import torch here: it hides any GPU)."""
    info = {"python": platform.python_version(), "cuda": False, "device": "cpu"}
    if not dry_run:
        import torch

        if torch.cuda.is_available():
            info.update(cuda=True, device=torch.cuda.get_device_name())
    for package in ("torch", "triton", "transformers", "accelerate", "liger-kernel"):
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = None
    return info


def step_lines(name: str, result: dict | None) -> list[str]:
    """What a step's JSON says in short (rope_kernels.py writes no summary of its own)."""
    if not result:
        return ["no result file"]
    lines = []
    if result.get("absent_on_gpu_machine"):
        lines.append(f"IMPORTS WHAT THE GPU MACHINE LACKS: {result['absent_on_gpu_machine']}")
    if name != "rope_kernels":
        return lines + result.get("summary", [])
    if result.get("kernel_config"):
        lines.append(f"kernel launched with tile,warps = {result['kernel_config']}")
    rows = result.get("results", [])
    seqs = sorted({r["seq"] for r in rows})
    lines.append(f"{len(rows)} rows, {seqs[0]}..{seqs[-1]} tokens" if rows else "no rows")
    lines += [f"FAILED {r['method']} at {r['seq']}: {r['error']}" for r in rows if "error" in r]
    diffs = result.get("triton_vs_torch_max_abs_diff")
    if diffs:
        lines.append(f"float32 max |triton - torch| at the longest length: {diffs}")
    return lines


def rope_targets(rope: dict) -> list[dict]:
    """The three speed targets from rope_kernels.json, at the long lengths (the longest one
    when none reaches LONG_SEQ, as in a dry run): per eager call (subject ``ours_*``) and,
    where measured, from CUDA graphs (subject ``ours_*, CUDA graph``: the device's time)."""
    rows = [r for r in rope.get("results", []) if "error" not in r]
    if not rows:
        return []
    long_from = min(LONG_SEQ, max(r["seq"] for r in rows))
    by = {(r["seq"], r["method"]): r for r in rows if r["seq"] >= long_from}
    seqs = sorted({seq for seq, _ in by})
    found = []
    for ours in ("ours_table_free", "ours_table"):
        for timing, suffix in (("", ""), (", CUDA graph", "_graph")):
            fwd_bwd, share = f"fwd_bwd{suffix}_ms", f"forward{suffix}_of_copy"
            mine = [by[(seq, ours)] for seq in seqs if share in by.get((seq, ours), {})]
            if not mine:
                continue
            subject = ours + timing
            found.append(target("copy_share", subject, min(r[share] for r in mine)))
            for name, other in (("vs_liger", "liger"), ("vs_eager", "hf_eager")):
                ratios = [
                    by[(r["seq"], other)][fwd_bwd] / r[fwd_bwd]
                    for r in mine
                    if fwd_bwd in by.get((r["seq"], other), {})
                ]
                found.append(
                    target(name, subject, min(ratios)) if ratios else unmeasured(name, subject)
                )
    return found


def unmeasured(name: str, subject: str) -> dict:
    what, wanted, kind = next((w, v, k) for n, w, v, k in TARGETS if n == name)
    return {"target": name, "subject": subject, "what": what, "value": None, "wanted": wanted,
            "kind": kind, "met": None}  # fmt: skip


def target(name: str, subject: str, value: float) -> dict:
    found = unmeasured(name, subject)
    wanted = found["wanted"]
    met = value >= wanted if found["kind"] == "min" else value <= wanted
    return {**found, "value": value, "met": met}


def all_targets(steps: dict) -> list[dict]:
    found = []
    rope = steps.get("rope_kernels", {}).get("result")
    if rope:
        found += rope_targets(rope)
    model = steps.get("model", {}).get("result")
    for row in (model or {}).get("rows", []):
        for phase in ("forward", "fwd_bwd"):
            ratio = row["kernel"][f"{phase}_ms"] / row["native"][f"{phase}_ms"]
            found.append(target("model_time", f"{phase} at {row['tokens']} tokens", ratio))
    return found


def summary_text(summary: dict) -> str:
    env = summary["environment"]
    lines = [
        f"yarnlib GPU check {summary['finished']}: {env['device']}, torch {env['torch']}, "
        f"triton {env['triton']}, transformers {env['transformers']}, "
        f"liger-kernel {env['liger-kernel'] or 'absent'}"
    ]
    if summary["dry_run"]:
        lines.append("DRY RUN: CPU tensors, Triton's interpreter, tiny sizes: numbers mean nothing")
    for name, step in summary["steps"].items():
        took = f", {step['seconds']} s" if "seconds" in step else ""
        took += f" (run of {step['from_run']})" if step.get("from_run") else ""
        lines.append(f"\n[{name}] {step['status']}{took}")
        if step.get("reason"):
            lines.append(f"  {step['reason']}")
        else:
            lines += [f"  {line}" for line in step_lines(name, step.get("result"))]
        if step["status"] in ("error", "timeout"):
            lines += [f"  | {line}" for line in step.get("log_tail", [])]
    if summary["targets"]:
        lines.append("\ntargets")
    for t in summary["targets"]:
        sign = "≥" if t["kind"] == "min" else "≤"
        wanted = f"wanted {sign} {t['wanted']:g}"
        if t["value"] is None:
            lines.append(f"  {t['what']} ({t['subject']}): not measured ({wanted})")
            continue
        verdict = "met" if t["met"] else "MISSED"
        lines.append(f"  {t['what']} ({t['subject']}): {t['value']:.3g} ({wanted}) {verdict}")
    return "\n".join(lines) + "\n"


def with_earlier_steps(path: Path, results: dict, dry_run: bool) -> dict:
    """This run's steps, and those of the summary already in ``path`` that this run did not
    redo (``--steps model`` after a fix keeps the others), in the order of STEPS."""
    earlier = read_json(path) or {}
    kept = earlier.get("steps", {}) if earlier.get("dry_run") == dry_run else {}
    for record in kept.values():
        record.setdefault("from_run", earlier.get("finished"))
    merged = {**kept, **results}
    return {name: merged[name] for name in STEPS if name in merged}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or ROOT / "benchmarks" / "out" / "gpu_check"),
        help="folder for the results (default: $OUT, else benchmarks/out/gpu_check)",
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny")
    parser.add_argument("--steps", default=",".join(STEPS), help="comma-separated subset")
    parser.add_argument(
        "--budget",
        type=float,
        help=f"seconds for all steps (default {BUDGET_S}; a dry run has no time limits: "
        "they are for the GPU, and a loaded CI machine must not fail on them)",
    )
    args = parser.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        parser.error(f"--steps: unknown {', '.join(unknown)}; allowed: {', '.join(STEPS)}")
    env_info = environment(args.dry_run)
    if not args.dry_run and not env_info["cuda"]:
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); "
              "--dry-run rehearses the pass on CPU", file=sys.stderr)  # fmt: skip
        return 2
    out = args.out.resolve()
    env = step_environment(args.dry_run)
    if args.budget is None:
        args.budget = math.inf if args.dry_run else BUDGET_S
    deadline = time.monotonic() + args.budget
    results: dict[str, dict] = {}
    scratch = Path(tempfile.mkdtemp(prefix="yarnlib-gpu-check-"))  # models, checkpoints
    try:
        for name in steps:
            left = deadline - time.monotonic()
            if left < MIN_STEP_S:
                reason = f"not started: {left:.0f} s left of the {args.budget:g} s budget"
                results[name] = {"status": "skipped", "reason": reason}
                continue
            limit = left if args.dry_run else min(STEPS[name], left)
            within = "no time limit" if math.isinf(limit) else f"at most {limit:.0f} s"
            print(f"[gpu_check] {name}: running ({within})", flush=True)
            result_file = out / f"{name}.json"  # an earlier run's file is not this run's result
            before = modified(result_file)
            found = results.get("rope_configs", {}).get("result") or {}
            command = step_command(name, out, scratch, args.dry_run, found.get("best"))
            record = run_step(command, out / "logs" / f"{name}.log", limit, env)
            fresh = modified(result_file) not in (None, before)
            record["result"] = read_json(result_file) if fresh else None
            if record["status"] != "ok":
                record["log_tail"] = tail(Path(record["log"]))
            results[name] = record
            print(f"[gpu_check] {name}: {record['status']} in {record['seconds']} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    steps_so_far = with_earlier_steps(out / "summary.json", results, args.dry_run)
    summary = {
        "finished": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "dry_run": args.dry_run,
        "environment": env_info,
        "budget_s": None if math.isinf(args.budget) else args.budget,
        "steps": steps_so_far,
        "targets": all_targets(steps_so_far),
    }
    write_json(out / "summary.json", summary)
    text = summary_text(summary)
    staging = out / ".summary.txt.tmp"
    staging.write_text(text)
    staging.replace(out / "summary.txt")
    print("\n" + text, end="")
    return 0 if all(step["status"] == "ok" for step in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
