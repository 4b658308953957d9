"""ms-swift for the plan's tests, in a child process. `make venv` installs it into .venv/swift,
outside site-packages: it registers a vLLM general plugin that every vLLM engine of the suite
would load, and that plugin imports vision models needing torchvision, which the CPU stack
removes. A child run with that folder (and tests/) on PYTHONPATH sees it; nothing else does."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SWIFT = Path(sys.prefix) / "swift"


def run_with_swift(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python argv...`` with ms-swift importable; skips where make venv did not install it."""
    if not (SWIFT / "swift").is_dir():
        pytest.skip("ms-swift is not installed (make venv puts it in .venv/swift)")
    path = os.pathsep.join([str(SWIFT), str(Path(__file__).parent)])
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )
