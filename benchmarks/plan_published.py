"""`yarnlib plan` against per-GPU peaks that other projects published: each row's setup as
its source states it, the closest `yarnlib plan` flags (or why none express it), measured,
planned and their ratio. Prints the table docs/plan.md carries between its `published`
markers; the planned column is recomputed from the current formulas on every run.

    python benchmarks/plan_published.py            # no GPU, no network: config.json fields only
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from yarnlib.plan.cli import GIB, report, setup_from_args
from yarnlib.plan.cli import add_arguments as plan_arguments

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from test_plan import QWEN3_8B, QWEN25_7B  # noqa: E402  (config.json fields as published on the hub)

# Qwen/Qwen3-4B's config.json differs from Qwen3-8B's in these fields only (of those read here)
QWEN3_4B = {**QWEN3_8B, "hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True}
SWIFT = "https://github.com/modelscope/ms-swift/blob/main/examples/train/long_text/"
HF_BLOG = "https://huggingface.co/blog/ulysses-sp"
GB = 10**9
# (source, setup, measured bytes, model config, plan flags or the reason none express it)
ROWS = [
    (
        SWIFT + "zero3.sh",
        "Qwen2.5-7B full SFT, 16384 packed, 4×A100 80GB, DeepSpeed ZeRO-3, Liger, "
        "checkpointing, FA2, batch 1",
        56 * GIB,
        QWEN25_7B,
        "--engine finetune --backend deepspeed --offload none --context 16384 --gpus 4 "
        "--gpu-memory 80GB",
    ),
    (
        SWIFT + "liger_kernel.sh",
        "the same setup, another ms-swift version",
        42 * GIB,
        QWEN25_7B,
        "--engine finetune --backend deepspeed --offload none --context 16384 --gpus 4 "
        "--gpu-memory 80GB",
    ),
    (
        HF_BLOG,
        "Qwen3-4B full SFT (TRL SFTTrainer), 8192, 1×H100 80GB, ZeRO-3 + CPU optimizer "
        "offload, checkpointing, FA2, batch 1, full logits",
        int(76.4 * GB),
        QWEN3_4B,
        "--engine finetune --backend deepspeed --offload optimizer --context 8192 --gpus 1 "
        "--gpu-memory 80GB --logits full",
    ),
]
NOT_EXPRESSED = [
    (
        SWIFT + "sequence_parallel.sh",
        "Qwen2.5-7B full, 16384, 4×A100, ZeRO-3, Ulysses sp 4",
        "43 GiB",
        "Ulysses sp in fine-tuning",
    ),
    (
        SWIFT + "ulysses/sequence_parallel.sh",
        "Qwen2.5-7B-Instruct full, 65536, 4×A100, ZeRO-3, Ulysses sp 4",
        "53 GiB",
        "Ulysses sp in fine-tuning",
    ),
    (
        SWIFT + "ring_attention/sequence_parallel_256k.sh",
        "Qwen2.5-7B-Instruct LoRA, 256000, 4×A100, ZeRO-3 offload, ring sp 4, Liger",
        "42 GiB",
        "LoRA; ring sp in DeepSpeed",
    ),
    (
        SWIFT + "ulysses/sequence_parallel_512k.sh",
        "QwQ-32B LoRA, 512000, 8×A100, ZeRO-3 offload, Ulysses sp 8, Liger",
        "80 GiB",
        "LoRA; Ulysses sp in fine-tuning",
    ),
    (
        HF_BLOG,
        "Qwen3-4B full SFT, 4×H100, ZeRO-3 + CPU optimizer offload, Ulysses sp 4: "
        "8K / 32K / 64K / 96K; 128K",
        "23.4 / 35.0 / 50.5 / 66.0 GB; OOM at 128K",
        "Ulysses sp in fine-tuning",
    ),
    (
        "https://unsloth.ai/blog/llama3-3",
        "Llama-3.1-8B QLoRA (4-bit), HF + FA2, 1×80GB: longest context 28000",
        "max length",
        "4-bit QLoRA",
    ),
    (
        "https://github.com/Qihoo360/360-LLaMA-Factory",
        "Qwen2.5-7B full SFT, 8×A800, ZeRO-3 offload, sp 8: longest 210k",
        "max length",
        "sequence parallel in fine-tuning",
    ),
]


def planned(config: dict, flags: str) -> tuple[int, bool]:
    """The plan's update peak without its reserve (allocated bytes), and its verdict."""
    import argparse

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        parser = argparse.ArgumentParser()
        plan_arguments(parser)
        setup = setup_from_args(parser.parse_args([folder, *flags.split()]))
        result = report(setup)
    return result["phases"]["update"] - setup.reserve, result["fits"]


def table() -> str:
    lines = [
        "| source | setup | measured | `yarnlib plan` flags | planned (allocated) | "
        "measured / planned |",
        "|---|---|---|---|---|---|",
    ]
    for url, setup, measured, config, flags in ROWS:
        plan, fits = planned(config, flags)
        lines.append(
            f"| [{url.rsplit('/', 1)[-1] or url}]({url}) | {setup} | {measured / GIB:.1f} GiB "
            f"| `{flags}` | {plan / GIB:.1f} GiB ({'fits' if fits else 'does not fit'}) | "
            f"{measured / plan:.2f} |"
        )
    for url, setup, measured, missing in NOT_EXPRESSED:
        lines.append(
            f"| [{url.rsplit('/', 1)[-1] or url}]({url}) | {setup} | {measured} | not "
            f"expressible: {missing} | — | — |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
