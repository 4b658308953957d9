"""Which tile and warp count the Triton rotary kernel should launch with on this GPU.

For each (tile, warps) of ``CONFIGS`` (tile: elements of one program's [tokens, heads, pairs]
block, so tokens per program = tile / (heads rounded up to a power of 2 × 64 pairs)):
yarnlib's table-free and table paths, forward and forward+backward, at ``SEQS`` tokens of
rope_kernels.py's shape (28 q heads, 4 kv heads, head_dim 128, bf16), timed from CUDA graphs
(rope_kernels.py's ``graph`` timing: the device's time, no launch overhead) against a copy of
the same bytes. ``best`` is the config with the highest geometric mean of copy time over
kernel time (per pass) across lengths, paths and phases; benchmarks/gpu_check.py hands it to
the ``rope_kernels`` step and yarnlib's defaults (``triton_rotary.TILE_GPU`` and
``NUM_WARPS_GPU``) come from it. Configs are tried until ``--budget`` seconds are spent
(yarnlib's defaults first); the JSON is rewritten after each.

    python benchmarks/gpu_rope_configs.py --out rope_configs.json      # CUDA
    python benchmarks/gpu_rope_configs.py --out x.json --dry-run       # CPU, interpreter, tiny
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from gpu_check import absent_on_gpu_machine, write_json
from rope_kernels import copy_ms, graph_timer, measure, methods, timer

from yarnlib.kernels import triton_rotary

# (tile, warps); yarnlib's defaults are tried first wherever they sit in this list
CONFIGS = [(2048, 4), (1024, 4), (2048, 2), (2048, 8), (4096, 4), (4096, 8), (4096, 16),
           (8192, 4), (8192, 8), (8192, 16), (16384, 8), (16384, 16)]  # fmt: skip
SEQS = [131072, 32768, 16384]
PATHS = ("ours_table_free", "ours_table")
REPEATS = 10
BUDGET_S = 55


def score(rows: list[dict]) -> float:
    """Geometric mean of copy / kernel time per pass (forward: one pass, fwd+bwd: two)."""
    shares = [r["copy_ms"] / r["forward_ms"] for r in rows]
    shares += [2 * r["copy_ms"] / r["fwd_bwd_ms"] for r in rows]
    return math.exp(sum(map(math.log, shares)) / len(shares))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the sweep")
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny")
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    seqs, configs = ([64], CONFIGS[:2]) if args.dry_run else (SEQS, CONFIGS)
    default = (triton_rotary.TILE_GPU, triton_rotary.NUM_WARPS_GPU)
    configs = [default] + [c for c in configs if c != default]
    fns = {name: fn for name, fn in methods(device, "triton").items() if name in PATHS}
    dtype, graph = torch.bfloat16, not args.dry_run
    timing = graph_timer if graph else timer
    copies = {seq: copy_ms(seq, device, dtype, REPEATS, graph=graph) for seq in seqs}
    info = {"device": torch.cuda.get_device_name() if graph else "cpu", "default": default,
            "seqs": seqs, "timing": "graph" if graph else "eager", "configs": []}  # fmt: skip
    deadline = time.monotonic() + args.budget
    for tile, warps in configs:
        if time.monotonic() > deadline:
            break
        triton_rotary.TILE_GPU, triton_rotary.NUM_WARPS_GPU = tile, warps
        rows = []
        for seq in seqs:
            for name, fn in fns.items():
                row = measure(fn, seq, device, dtype, REPEATS, timer=timing)
                rows.append({"seq": seq, "method": name, "copy_ms": copies[seq], **row})
        entry = {"tile": tile, "warps": warps, "score": score(rows), "rows": rows}
        info["configs"].append(entry)
        print(f"tile {tile:6d} warps {warps:2d}: copy share {entry['score']:.3f}", flush=True)
        best = max(info["configs"], key=lambda c: c["score"])
        info["best"] = f"{best['tile']},{best['warps']}"
        info["summary"] = [
            f"{len(info['configs'])} of {len(configs)} configs, {info['timing']} timing; copy "
            f"share (geometric mean over {seqs} tokens, both paths, fwd and fwd+bwd): default "
            f"{default[0]},{default[1]} {info['configs'][0]['score']:.3f}, best "
            f"{info['best']} {best['score']:.3f}"
        ]
        info["absent_on_gpu_machine"] = absent_on_gpu_machine()
        write_json(args.out, info)
    triton_rotary.TILE_GPU, triton_rotary.NUM_WARPS_GPU = default
    print(f"best: tile,warps = {info['best']} (yarnlib's default {default[0]},{default[1]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
