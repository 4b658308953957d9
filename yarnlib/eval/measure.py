"""Wall time and peak memory of one evaluation cell.

On CPU the peak is the process's resident-set high-water mark (``VmHWM``), which Linux lets
a process reset by writing 5 to ``/proc/self/clear_refs``; on CUDA it is the allocator peak.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _vm_hwm_bytes() -> int | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Meter:
    """``with Meter(device) as m: ...`` then ``m.seconds`` and ``m.peak_memory_mb``."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.seconds = 0.0
        self.peak_memory_mb: float | None = None
        self.memory_kind = "cuda_allocated" if self.device.type == "cuda" else "cpu_rss"

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                CLEAR_REFS.write_text("5")
            except OSError:  # not Linux, or not allowed: the peak is then the process's peak
                self.memory_kind = "cpu_rss_since_start"
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _vm_hwm_bytes()
        self.seconds = time.perf_counter() - self.start
        self.peak_memory_mb = None if peak is None else round(peak / 2**20, 1)
        return False

    def fields(self, tokens: int) -> dict:
        return {
            "seconds": round(self.seconds, 3),
            "tokens_per_s": round(tokens / self.seconds, 2) if self.seconds else None,
            "peak_memory_mb": self.peak_memory_mb,
            "memory_kind": self.memory_kind,
        }
