"""`yarnlib plan`'s per-layer activation terms against one real Qwen3-4B-shaped decoder layer on
CPU: bf16 weights (as FSDP's mixed precision runs them), gradient checkpointing (transformers'
default, non-reentrant), SDPA, a 2048-entry vocabulary so that the layer, not the loss head, is
the step's peak. The step's allocations are traced and replayed through the allocator's rules
(tests/caching_allocator.py); the plan's figure is ``memory.activation_peak`` for the same
shape and tokens: the checkpoints kept plus the larger of the head (beside what the final norm
keeps for it) and one recomputed layer with its backward. Rows already in the JSON are kept,
so an interrupted run resumes.

    OMP_NUM_THREADS=2 python benchmarks/plan_layer.py        # 2k, 8k, 16k: ~7 min on 2 cores
    python benchmarks/plan_layer.py --device cuda --tokens 65536 131072 262144 \
        --out $OUT/plan_layer_cuda.json                      # a GPU: max_memory_allocated

On a GPU the peak is ``torch.cuda.max_memory_allocated()`` over the step above what was
allocated before it (the same step; SDPA picks the CUDA kernels there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM

from yarnlib.chunked_loss import causal_lm_loss
from yarnlib.plan import memory
from yarnlib.plan.shapes import shape_from_config

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from caching_allocator import replay, trace  # noqa: E402

OUT = Path(__file__).parent / "results" / "plan_layer" / "qwen3_4b_layer.json"
MIB = 2**20
# Qwen/Qwen3-4B's layer (config.json), one of them, and a small vocabulary
QWEN3_4B_LAYER = {
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 1,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 2048,
    "tie_word_embeddings": True,
}


def measure(tokens: int, device: str = "cpu") -> dict:
    config = AutoConfig.for_model(**QWEN3_4B_LAYER, max_position_embeddings=max(40960, tokens))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.to(device, torch.bfloat16).gradient_checkpointing_enable({"use_reentrant": False})
    model.train()
    ids = torch.randint(0, config.vocab_size, (1, tokens), device=device)

    def step():
        causal_lm_loss(model, ids, chunk_size=1024)[0].backward()

    step()  # the grads exist from here on, as in training
    if device == "cpu":
        peak = replay(trace(step)).peak_allocated
    else:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    shape = shape_from_config(config.to_dict())
    precision = memory.PRECISIONS["bf16-fsdp"]
    acts = memory.activations(shape, tokens, precision, checkpointing=True, attn="sdpa", chunk=1024)
    planned = memory.activation_peak(acts)
    return {
        "device": device,
        "tokens": tokens,
        "measured_bytes": peak,
        "planned_bytes": planned,
        "planned_terms_bytes": {
            "kept": acts.saved,
            "recompute": acts.recompute,
            "backward": acts.backward,
            "head": acts.head,
            "final_norm": acts.final_norm,
        },
        "ratio": peak / planned,
    }


def table(rows: list[dict]) -> str:
    lines = ["| tokens | measured MiB | planned MiB | measured / planned |", "|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["tokens"]):
        lines.append(
            f"| {r['tokens']} | {r['measured_bytes'] / MIB:.1f} | {r['planned_bytes'] / MIB:.1f} "
            f"| {r['ratio']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--device", default="cpu", help="cpu (traced) or cuda")
    args = parser.parse_args()
    rows = json.loads(args.out.read_text())["rows"] if args.out.exists() else []
    done = {r["tokens"] for r in rows}
    for tokens in tqdm([t for t in args.tokens if t not in done], desc="layer", unit="row"):
        rows.append(measure(tokens, args.device))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"layer": QWEN3_4B_LAYER, "rows": rows}, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
