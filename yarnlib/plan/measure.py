"""Measure one training step's peak memory on CPU and set it beside the plan's.

The step is ``yarnlib finetune``'s: ``loss_of`` (chunked or full logits, float32 or bf16
autocast), backward, AdamW. Peak = the process's peak resident memory during the second step
minus its resident memory just before it (weights, optimizer states and allocator caches are
then in place, as the plan's "step" excludes them). Each measurement runs in a fresh process
with glibc's mmap threshold fixed at 64 KiB, so that a freed tensor leaves the resident set at
once instead of staying in malloc's heap: resident memory then follows the live tensors.

    python -m yarnlib.plan.measure '{"model": {...config.json...}, "tokens": 4096, ...}'
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any

# the tiny Llama of the CI check and the benchmark: activations of 2048 tokens ≫ allocator noise
TINY = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
# glibc: serve every allocation >= 64 KiB with mmap (released on free), never adapt it upwards
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak resident set size
        f.write("5")


def _build(row: dict[str, Any]):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import yarnlib

    if row.get("path"):
        model = AutoModelForCausalLM.from_pretrained(
            row["path"], dtype=torch.float32, attn_implementation=row["attn"]
        )
    else:
        torch.manual_seed(0)
        config = AutoConfig.for_model(**row["model"])
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation=row["attn"]
        )
    original = model.config.max_position_embeddings
    yarnlib.patch(model, factor=max(1.0, row["tokens"] / original), use_kernel=False)
    if row["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def measure(row: dict[str, Any]) -> dict[str, Any]:
    """Run two training steps of ``row`` here and return measured and planned bytes."""
    import torch

    from yarnlib.finetune.loop import loss_of
    from yarnlib.plan import memory
    from yarnlib.plan.shapes import shape_from_config

    torch.set_num_threads(row.get("threads", 1))  # per-thread scratch is small beside a step
    model = _build(row)
    head = model.get_output_embeddings()
    tokens, bf16 = row["tokens"], row["precision"] == "bf16"
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=generator)
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(model, head, {"input_ids": ids}, labels, row["chunk"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # optimizer states, one-off caches
    gc.collect()
    _reset_peak()
    baseline = _status("VmRSS")
    step()
    measured = _status("VmHWM") - baseline

    shape = shape_from_config(model.config.to_dict())
    precision = memory.PRECISIONS[row["precision"]]
    acts = memory.activations(
        shape,
        tokens,
        precision,
        checkpointing=row["checkpointing"],
        attn="eager" if row["attn"] == "eager" else "sdpa",
        chunk=row["chunk"],
    )
    params = [p.numel() for p in model.parameters()]
    planned = memory.step_peak(shape, acts, precision, sum(params), max(params))
    config = {k: v for k, v in model.config.to_dict().items() if isinstance(v, (int, str, bool))}
    return {
        **row,
        "measured_bytes": measured,
        "planned_bytes": planned,
        "config": config,
        "params": [sum(params), max(params)],
    }


def measure_in_subprocess(row: dict[str, Any], nice: int = 0, timeout: float | None = None):
    """``measure(row)`` in a fresh Python (``row["threads"]``, default one; the malloc settings
    above)."""
    env = {**os.environ, **MALLOC_ENV, "OMP_NUM_THREADS": str(row.get("threads", 1))}
    command = [sys.executable, "-m", "yarnlib.plan.measure", json.dumps(row)]
    if nice:
        command = ["nice", "-n", str(nice), *command]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"measurement of {row} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
