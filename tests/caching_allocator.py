"""A model of PyTorch's CUDA caching allocator, replayed over the allocations of a real step.

No GPU here, so the reserved figure (``max_memory_reserved()``, what nvidia-smi and most
published peaks show) cannot be read; but which tensors are allocated and freed, in which order
and of which size, is the same on CPU. ``trace`` records that sequence from torch's CPU profiler
and ``replay`` runs it through the rules of ``c10/cuda/CUDACachingAllocator.cpp`` with its default
settings (no ``max_split_size_mb``, no expandable segments, no ``empty_cache``):

* sizes round up to 512 bytes; requests up to 1 MiB use the small pool, the rest the large one;
* a request takes the smallest free block of its pool at least its size (best fit); a block
  larger than needed is split when the rest exceeds 1 MiB (large pool) or 512 bytes (small);
* with no such block a new segment is reserved: 2 MiB (small pool), 20 MiB for requests under
  10 MiB, else the request rounded up to 2 MiB; segments are never returned;
* a freed block merges with free neighbours in its own segment only.
"""

from __future__ import annotations

import bisect
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20
SMALL = MIB  # kSmallSize
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc


def trace(step) -> list[tuple[int, int]]:
    """(address, bytes) of every allocation (bytes > 0) and free (< 0) while ``step()`` runs,
    in order, from torch's CPU profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    return [(int(e["args"]["Addr"]), int(e["args"]["Bytes"])) for e in memory]


@dataclass
class Block:
    segment: int
    offset: int
    size: int
    small: bool  # its segment's pool
    free: bool = True


def _round(size: int) -> int:
    return max(512, -(-size // 512) * 512)


def _segment_size(size: int) -> int:
    if size <= SMALL:
        return 2 * MIB
    if size < MIN_LARGE_ALLOC:
        return 20 * MIB
    return -(-size // (2 * MIB)) * (2 * MIB)


class CachingAllocator:
    def __init__(self):
        self.segments: list[list[Block]] = []  # each segment's blocks in address order
        self.live: dict[int, Block] = {}  # by the traced address
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0

    def _free_blocks(self, small: bool) -> list[Block]:
        found = (b for seg in self.segments for b in seg if b.free and b.small == small)
        return sorted(found, key=lambda b: (b.size, b.segment, b.offset))

    def malloc(self, address: int, nbytes: int) -> None:
        size = _round(nbytes)
        small = size <= SMALL
        candidates = self._free_blocks(small)
        i = bisect.bisect_left([b.size for b in candidates], size)
        if i < len(candidates):
            block = candidates[i]
        else:
            self.segments.append([Block(len(self.segments), 0, _segment_size(size), small)])
            self.reserved += self.segments[-1][0].size
            block = self.segments[-1][0]
        rest = block.size - size
        if rest > (512 - 1 if small else SMALL):  # should_split
            seg = self.segments[block.segment]
            tail = Block(block.segment, block.offset + size, rest, small)
            seg.insert(seg.index(block) + 1, tail)
            block.size = size
        block.free = False
        self.live[address] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, address: int) -> None:
        block = self.live.pop(address)
        self.allocated -= block.size
        block.free = True
        seg = self.segments[block.segment]
        i = seg.index(block)
        for j in (i + 1, i - 1):  # merge with free neighbours in the same segment
            if 0 <= j < len(seg) and seg[j].free:
                first, second = sorted((seg[i], seg[j]), key=lambda b: b.offset)
                first.size += second.size
                seg.remove(second)
                i = seg.index(first)


def replay(events: list[tuple[int, int]]) -> CachingAllocator:
    """The allocator after ``events``; frees of memory allocated before the trace began are
    skipped."""
    allocator = CachingAllocator()
    for address, nbytes in events:
        if nbytes > 0:
            allocator.malloc(address, nbytes)
        elif address in allocator.live:
            allocator.free(address)
    return allocator
