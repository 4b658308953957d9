"""Real file-system faults for test_safe_writes (run inside a mount namespace of its own, as root
there): ``yarnlib eval perplexity`` into a tmpfs of growing size until it fits, then
``config --output`` and ``eval --output`` into a read-only mount; or (``finetune``) ``yarnlib
finetune --save-every 1`` into a tmpfs where its second checkpoint runs out of room at several
points. Prints one JSON line: a record per run (exit code, last stderr line, files left,
temporary files, partial result files; for finetune the checkpoints left and their digests).

Usage: full_disk_worker.py MOUNT_DIR MODEL_DIR DATA_DIR
       full_disk_worker.py finetune MOUNT_DIR MODEL_DIR DATA_DIR CACHE_DIR
"""

import contextlib
import hashlib
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
    for path in sorted(p for p in out.glob("*") if p.is_file()) if out.is_dir() else []:
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


def digests(folder: Path) -> dict[str, str]:
    """sha256 of each file under ``folder`` (a checkpoint), by relative name."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def pages(path: Path) -> int:
    """KiB a file takes in a tmpfs (whole 4 KiB pages)."""
    return -(-path.stat().st_size // 4096) * 4


# what a checkpoint holds, in the order accelerate's save_state and then yarnlib write it
CHECKPOINT_FILES = ("model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl",
                    "custom_checkpoint_0.pkl", "run.json")  # fmt: skip
# the files the disk runs out in: safetensors' writer, torch.save's (a large and a small file),
# and yarnlib's own writer
FULL_AT = ("model.safetensors", "optimizer.bin", "random_states_0.pkl", "run.json")


def staged_when_removed() -> list[list[str]]:
    """Record what each removed .tmp folder held: which file the disk ran out in (the wrapper
    only looks; the real ``atomic.remove`` runs)."""
    from yarnlib import atomic

    seen, remove = [], atomic.remove

    def looking(path):
        if Path(path).name.endswith(".tmp") and Path(path).is_dir():
            seen.append(sorted(p.name for p in Path(path).iterdir()))
        remove(path)

    atomic.remove = looking
    return seen


def finetune_worker(root: Path, model: str, data: str, cache: str) -> list[dict]:
    from accelerate.state import AcceleratorState

    argv = ["finetune", "--model", model, "--dataset", data, "--cache-dir", cache,
            "--seq-len", "32", "--batch-size", "2", "--steps", "3", "--stop-after", "2",
            "--save-every", "1", "--method", "yarn", "--factor", "2", "--lr", "1e-3",
            "--warmup-steps", "0", "--report-to", "none"]  # fmt: skip
    out = root / "out"
    argv += ["--output", str(out)]
    checkpoints = out / "checkpoints"
    first = checkpoints / "step-000001"
    staged = staged_when_removed()
    mount(root, "size=64m")  # room for both checkpoints: the reference
    runs = [run("finetune enough", argv, out)]
    runs[-1]["checkpoint_files"] = sorted(p.name for p in first.iterdir())
    AcceleratorState._reset_state(True)
    reference = digests(first)
    kib = {name: pages(first / name) for name in CHECKPOINT_FILES}
    for name in FULL_AT:
        # the log and the first checkpoint fit, the second the files before ``name`` and half
        # of it
        before = sum(kib[n] for n in CHECKPOINT_FILES[: CHECKPOINT_FILES.index(name)])
        size = 4 + sum(kib.values()) + before + kib[name] // 8 * 4
        shutil.rmtree(out)
        subprocess.run(["mount", "-o", f"remount,size={size}k", str(root)], check=True)
        staged.clear()
        runs.append(run("finetune full", argv, out))
        AcceleratorState._reset_state(True)
        runs[-1].update(
            full_at=name,
            checkpoints=sorted(p.name for p in checkpoints.iterdir()),
            first_kept=digests(first) == reference,
            staged=staged[:],
        )
    return runs


if __name__ == "__main__":
    if sys.argv[1] == "finetune":
        results = finetune_worker(Path(sys.argv[2]), *sys.argv[3:6])
    else:
        results = main_worker(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
    print(json.dumps(results))
