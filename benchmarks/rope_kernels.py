"""Rotary embedding speed: transformers eager, torch.compile of it, Liger, and yarnlib.

Qwen2.5-7B-like shapes (28 q heads, 4 kv heads, head_dim 128, batch 1), bfloat16, yarn
factor 4. Forward and forward+backward; every path includes building its cos/sin (ours
table-free builds none). GB/s is over the minimum bytes: q and k read once and written
once per pass; `fwd / copy` is that bandwidth over a measured copy of the same bytes.

Two timings on CUDA. ``eager``: one call between two events, as a Python loop makes it, so
the host's launch overhead (~0.1-0.2 ms a call) counts whenever the device work is shorter.
``graph`` (from ``GRAPH_FROM`` tokens on): ``GRAPH_CALLS`` calls captured in a CUDA graph
and replayed, per call: the device's own time, as inside a captured or busy model.

    python benchmarks/rope_kernels.py                     # CUDA: 1k..128k; CPU: 1k..4k
    python benchmarks/rope_kernels.py --seq 1024 4096 --threads 1 --out results.json

On CPU only the torch paths run (no Liger; Triton only through its interpreter with
``--backend triton``, as benchmarks/gpu_check.py's dry run does), with one warm-up call
instead of two and lengths up to 4k, to keep the run under three minutes on two cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from gpu_check import absent_on_gpu_machine, write_json
from tqdm import tqdm
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from yarnlib import RopeScaling
from yarnlib.kernels import apply_rotary, apply_scaled_rotary, rotary_cos_sin

Q_HEADS, KV_HEADS, HEAD_DIM = 28, 4, 128
SPEC = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=32768,
                   rope_theta=1e6, rotary_dim=HEAD_DIM)  # fmt: skip
CUDA_SEQS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
CPU_SEQS = [1024, 2048, 4096]
GRAPH_FROM = 16384  # the targets' lengths (benchmarks/gpu_check.py); shorter ones are launch-bound
GRAPH_CALLS = 10  # calls per captured graph
# torch.compile's own guards and recompilations under a capture can leave the device in a state
# that fails the lengths after it; its eager numbers are kept
GRAPH_SKIP = {"hf_compile"}


def methods(device: torch.device, backend: str = "auto") -> dict:
    """name -> f(q, k, position_ids) returning (q, k); each includes its own cos/sin.

    ``backend`` is the one yarnlib's paths use (``"auto"``: Triton on CUDA)."""
    config = LlamaConfig(hidden_size=Q_HEADS * HEAD_DIM, num_attention_heads=Q_HEADS,
                         num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         **SPEC.to_hf("v5"))  # fmt: skip
    rope = LlamaRotaryEmbedding(config).to(device)

    def hf_eager(q, k, position_ids):
        cos, sin = rope(q, position_ids)
        return apply_rotary_pos_emb(q, k, cos, sin)

    def ours_table(q, k, position_ids):
        cos, sin = rotary_cos_sin(SPEC, position_ids)
        return apply_rotary(q, k, cos, sin, backend=backend)

    def ours_table_free(q, k, position_ids):
        return apply_scaled_rotary(q, k, position_ids, SPEC, backend=backend)

    found = {"hf_eager": hf_eager}
    if device.type == "cuda":
        try:
            from liger_kernel.transformers.rope import liger_rotary_pos_emb
        except Exception as error:  # absent, or not importable with this torch/transformers
            print(f"liger: not measured ({type(error).__name__}: {error})")
            liger_rotary_pos_emb = None
        if liger_rotary_pos_emb is not None:

            def liger(q, k, position_ids):
                cos, sin = rope(q, position_ids)
                return liger_rotary_pos_emb(q, k, cos, sin)

            found["liger"] = liger
    found["ours_table"] = ours_table
    found["ours_table_free"] = ours_table_free
    found["hf_compile"] = torch.compile(hf_eager)  # last: its compilations take the longest
    return found


def timer(fn, device: torch.device, repeats: int) -> float:
    """Median milliseconds of ``fn()`` after warm-up (compilation, autotuning, caches)."""
    for _ in range(2 if device.type == "cuda" else 1):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def graph_timer(fn, device: torch.device, repeats: int) -> float:
    """Median milliseconds per call of ``fn`` replayed from a CUDA graph of ``GRAPH_CALLS``
    calls: the device's time without the host's launch overhead."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compilation, caches, autograd
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    return timer(graph.replay, device, repeats) / GRAPH_CALLS


def measure(fn, seq: int, device: torch.device, dtype: torch.dtype, repeats: int, timer=timer):
    """``{"forward_ms", "fwd_bwd_ms"}`` of ``fn`` at ``seq`` tokens, per call, by ``timer``."""
    q = torch.randn(1, Q_HEADS, seq, HEAD_DIM, device=device, dtype=dtype)
    k = torch.randn(1, KV_HEADS, seq, HEAD_DIM, device=device, dtype=dtype)
    position_ids = torch.arange(seq, device=device)[None]
    grads = torch.randn_like(q), torch.randn_like(k)
    q_leaf, k_leaf = q.clone().requires_grad_(), k.clone().requires_grad_()

    def forward():
        with torch.no_grad():
            fn(q, k, position_ids)

    def forward_backward():
        torch.autograd.backward(fn(q_leaf, k_leaf, position_ids), grads)

    return {
        "forward_ms": timer(forward, device, repeats),
        "fwd_bwd_ms": timer(forward_backward, device, repeats),
    }


def graph_row(fn, seq: int, device: torch.device, dtype: torch.dtype, repeats: int) -> dict:
    """``forward_graph_ms`` and ``fwd_bwd_graph_ms``, or ``graph_error`` for a path that
    cannot be captured (it keeps its eager numbers)."""
    try:
        found = measure(fn, seq, device, dtype, repeats, timer=graph_timer)
    except Exception as error:
        return {"graph_error": f"{type(error).__name__}: {error}"}
    return {"forward_graph_ms": found["forward_ms"], "fwd_bwd_graph_ms": found["fwd_bwd_ms"]}


def copy_ms(
    seq: int, device: torch.device, dtype: torch.dtype, repeats: int, graph: bool = False
) -> float:
    """A device-to-device copy of q and k: the same bytes as one rotary pass (``graph``: timed
    as ``graph_timer`` does)."""
    q = torch.randn(1, Q_HEADS, seq, HEAD_DIM, device=device, dtype=dtype)
    k = torch.randn(1, KV_HEADS, seq, HEAD_DIM, device=device, dtype=dtype)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    return (graph_timer if graph else timer)(
        lambda: (q_out.copy_(q), k_out.copy_(k)), device, repeats
    )


def check_against_torch(seq: int, device: torch.device) -> dict:
    """Max |Triton − torch backend| at positions up to ``seq`` − 1 (float32)."""
    q = torch.randn(1, Q_HEADS, seq, HEAD_DIM, device=device)
    k = torch.randn(1, KV_HEADS, seq, HEAD_DIM, device=device)
    position_ids = torch.arange(seq, device=device)[None]
    cos, sin = rotary_cos_sin(SPEC, position_ids)
    diffs = {}
    for name, run in (
        ("table", lambda b: apply_rotary(q, k, cos, sin, backend=b)),
        ("table_free", lambda b: apply_scaled_rotary(q, k, position_ids, SPEC, backend=b)),
    ):
        ours, oracle = run("triton"), run("torch")
        diffs[name] = max((a - b).abs().max().item() for a, b in zip(ours, oracle, strict=True))
    return diffs


def set_kernel_config(text: str) -> None:
    """``"TILE,WARPS"`` -> the Triton kernel's launch parameters for this process."""
    from yarnlib.kernels import triton_rotary

    try:
        tile, warps = (int(part) for part in text.split(","))
    except ValueError:
        raise SystemExit(f"--kernel-config: want TILE,WARPS (two integers), got {text!r}") from None
    triton_rotary.TILE_GPU, triton_rotary.NUM_WARPS_GPU = tile, warps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, nargs="+", help="sequence lengths (tokens)")
    parser.add_argument("--repeats", type=int, help="timed calls per measurement")
    parser.add_argument("--out", type=Path, help="JSON file (default: next to this script)")
    parser.add_argument("--threads", type=int, help="CPU threads (1 is steadier on a busy host)")
    parser.add_argument("--backend", default="auto", help="yarnlib's: auto, triton or torch")
    parser.add_argument("--methods", help="comma-separated subset of the methods (default: all)")
    parser.add_argument(
        "--kernel-config",
        metavar="TILE,WARPS",
        help="launch the Triton kernel with this tile and warp count instead of yarnlib's "
        "defaults (gpu_rope_configs.py finds the best)",
    )
    args = parser.parse_args()
    if args.kernel_config:
        set_kernel_config(args.kernel_config)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    seqs = args.seq or (CUDA_SEQS if device.type == "cuda" else CPU_SEQS)
    repeats = args.repeats or (20 if device.type == "cuda" else 3)
    out = args.out or Path(__file__).with_name(f"rope_kernels_{device.type}.json")
    fns = methods(device, args.backend)
    if args.methods:
        wanted = args.methods.split(",")
        unknown = sorted(set(wanted) - set(fns))
        if unknown:
            raise SystemExit(f"--methods: unknown {unknown}; available here: {', '.join(fns)}")
        fns = {name: fn for name, fn in fns.items() if name in wanted}
    checks = None
    if device.type == "cuda" or args.backend == "triton":  # correctness first, then speed
        checks = check_against_torch(max(seqs), device)
        print(f"float32 max |triton - torch| at {max(seqs)} positions: {checks}")
    rows: list[dict] = []
    info = {
        "device": (
            torch.cuda.get_device_name()
            if device.type == "cuda"
            else f"{platform.machine()} CPU, {os.cpu_count()} cores"
        ),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "shape": {"batch": 1, "q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM},
        "dtype": str(dtype),
        "spec": SPEC.describe(),
        "repeats": repeats,
        "kernel_config": args.kernel_config,
        "results": rows,
        "triton_vs_torch_max_abs_diff": checks,
    }
    with tqdm(total=len(seqs) * len(fns), desc="rope benchmark") as bar:
        for seq in seqs:
            pass_bytes = 2 * seq * (Q_HEADS + KV_HEADS) * HEAD_DIM * dtype.itemsize
            copy = copy_ms(seq, device, dtype, repeats)
            graph = device.type == "cuda" and seq >= GRAPH_FROM
            copy_graph = copy_ms(seq, device, dtype, repeats, graph=True) if graph else None
            for name, fn in fns.items():
                row = {"seq": seq, "method": name}
                try:
                    row.update(measure(fn, seq, device, dtype, repeats))
                    if graph and name not in GRAPH_SKIP:
                        row.update(graph_row(fn, seq, device, dtype, repeats))
                except Exception as error:  # one path failing here must not hide the others
                    rows.append({**row, "error": f"{type(error).__name__}: {error}"})
                    bar.update()
                    continue
                row["forward_gbps"] = pass_bytes / row["forward_ms"] / 1e6
                row["fwd_bwd_gbps"] = 2 * pass_bytes / row["fwd_bwd_ms"] / 1e6
                row["copy_ms"] = copy
                row["forward_of_copy"] = copy / row["forward_ms"]
                if "forward_graph_ms" in row:
                    row["copy_graph_ms"] = copy_graph
                    row["forward_graph_of_copy"] = copy_graph / row["forward_graph_ms"]
                rows.append(row)
                bar.update()
            info["absent_on_gpu_machine"] = absent_on_gpu_machine()
            write_json(out, info)  # after every length: a run stopped early keeps its rows
    print_table(rows)
    print(f"wrote {out}")


def print_table(rows: list[dict]) -> None:
    head = "| seq | method | fwd ms | fwd GB/s | fwd+bwd ms | fwd+bwd GB/s | fwd / copy |"
    graphs = any("forward_graph_ms" in r for r in rows)
    if graphs:
        head += " graph: fwd ms | fwd+bwd ms | fwd / copy |"
    print("\n" + head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        if "error" in r:
            print(f"| {r['seq'] // 1024}k | {r['method']} | {r['error']} |")
            continue
        line = (
            f"| {r['seq'] // 1024}k | {r['method']} | {r['forward_ms']:.3f} | "
            f"{r['forward_gbps']:.3g} | {r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_gbps']:.3g} |"
            f" {100 * r['forward_of_copy']:.0f} % |"
        )
        if "forward_graph_ms" in r:
            line += (
                f" {r['forward_graph_ms']:.3f} | {r['fwd_bwd_graph_ms']:.3f} |"
                f" {100 * r['forward_graph_of_copy']:.0f} % |"
            )
        elif graphs:
            line += f" {r.get('graph_error', '')} | | |"
        print(line)


if __name__ == "__main__":
    main()
