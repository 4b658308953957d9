"""Real file-system faults for test_safe_writes (run inside a mount namespace of its own, as root
there): ``yarnlib eval perplexity`` into a tmpfs of growing size until it fits, then
``config --output`` and ``eval --output`` into a read-only mount. Prints one JSON line: a record
per run (exit code, last stderr line, files left, temporary files, partial result files).

Usage: full_disk_worker.py MOUNT_DIR MODEL_DIR DATA_DIR
"""

import contextlib
import io
import json
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

from yarnlib.cli import main

PNG_END = b"IEND\xaeB`\x82"


def mount(folder: Path, options: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)


def partial(out: Path) -> list[str]:
    """Result files under their final names that are empty or cut short."""
    bad = []
    for path in sorted(out.glob("*")) if out.is_dir() else []:
        data = path.read_bytes()
        try:
            if path.suffix == ".jsonl":
                [json.loads(line) for line in data.decode().splitlines()]
            elif path.suffix == ".json":
                json.loads(data)
            elif path.suffix == ".csv":
                assert data.endswith(b"\n") and data.count(b"\n") >= 2
            elif path.suffix == ".png":
                assert data.endswith(PNG_END)
        except (ValueError, AssertionError):
            bad.append(path.name)
    return bad


def run(case: str, argv: list[str], out: Path) -> dict:
    err = io.StringIO()
    crashed = False
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except BaseException:  # a traceback: what the tests look for
            traceback.print_exc()
            code, crashed = 1, True
    lines = err.getvalue().strip().splitlines()
    return {
        "case": case,
        "command": argv[0],
        "code": code,
        "traceback": crashed or "Traceback" in err.getvalue(),
        "last_line": lines[-1] if lines else "",
        "files": sorted(p.name for p in out.glob("*")) if out.is_dir() else [],
        "leftovers": sorted(p.name for p in out.parent.rglob("*.tmp")),
        "partial": partial(out),
    }


def main_worker(root: Path, model: str, data: str) -> list[dict]:
    runs = []
    eval_argv = ["eval", "perplexity", "--model", model, "--dataset", data, "--methods",
                 "none,yarn:2", "--lengths", "64,192", "--samples", "1"]  # fmt: skip
    mount(root, "size=4k")
    # a page (4 KiB) a file: room for cells.jsonl only, then also the JSON, then the CSV but not
    # the picture, then enough
    for kib in (4, 8, 12, 256):
        subprocess.run(["mount", "-o", f"remount,size={kib}k", str(root)], check=True)
        for path in root.iterdir():
            shutil.rmtree(path)
        out = root / "out"
        runs.append(run("full", [*eval_argv, "--output", str(out)], out))
        runs[-1]["size_kib"] = kib
        if runs[-1]["code"] == 0:
            break
    for path in root.iterdir():
        shutil.rmtree(path)
    (root / "existing").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
    config_argv = ["config", model, "--factor", "2", "--output", str(root / "scaled")]
    runs.append(run("read-only config", config_argv, root / "scaled"))
    out = root / "existing"
    runs.append(run("read-only eval", [*eval_argv, "--output", str(out)], out))
    return runs


if __name__ == "__main__":
    results = main_worker(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
    print(json.dumps(results))
