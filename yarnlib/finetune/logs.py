"""What a run reports: a JSONL line per logged step (always), the same numbers to the
trackers accelerate supports when they are installed, and peak memory."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch
from accelerate.utils import is_swanlab_available, is_tensorboard_available, is_wandb_available

from yarnlib import atomic

TRACKERS = {
    "tensorboard": is_tensorboard_available,
    "wandb": is_wandb_available,
    "swanlab": is_swanlab_available,
}
LOG_FILE = "log.jsonl"


def choose_trackers(report_to: str) -> list[str]:
    """``auto``: every installed tracker; ``none``; or a comma-separated list."""
    if report_to == "auto":
        return [name for name, available in TRACKERS.items() if available()]
    if report_to == "none":
        return []
    names = [n.strip() for n in report_to.split(",") if n.strip()]
    for name in names:
        if name not in TRACKERS:
            raise ValueError(
                f"report_to: {name!r}; allowed: auto, none, or a list of {', '.join(TRACKERS)}"
            )
        if not TRACKERS[name]():
            raise ValueError(f"report_to: {name!r} is not installed (pip install {name})")
    return names


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated accelerator memory, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**30 if sys.platform == "darwin" else 2**20)


class JsonlLog:
    def __init__(self, path: Path, enabled: bool):
        self.path = Path(path)
        self.enabled = enabled

    def write(self, record: dict) -> None:
        if self.enabled:
            atomic.append_text(self.path, json.dumps(record) + "\n", "log")

    def records(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]
