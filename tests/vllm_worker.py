"""Running a vLLM test module's worker: the module itself as a script in a subprocess (the
yarnlib plugin patches vLLM globally), its engines in-process on the CPU; the findings come
back as ``OUT/results.json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_worker(script: str, out: Path, *args, **env) -> dict:
    """``python script [args...] out`` with vLLM's CPU settings (plus ``env``)."""
    environ = dict(os.environ)
    environ.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_OMP_THREADS_BIND=environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1"),
        VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        **env,
    )
    proc = subprocess.run(
        [sys.executable, script, *map(str, args), str(out)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=900,
    )
    path = out / "results.json"
    if proc.returncode or not path.exists():
        raise AssertionError(f"worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(path.read_text())
