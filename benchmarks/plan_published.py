"""`yarnlib plan` against per-GPU peaks that other projects published: each row's setup as
its source states it, the closest `yarnlib plan` flags (or why none express it), measured,
planned, their ratio, and whether the plan's verdict agrees with what happened. Prints the
table docs/plan.md carries between its `published` markers; the planned column is recomputed
from the current formulas on every run.

    python benchmarks/plan_published.py            # no GPU, no network: config.json fields only
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from yarnlib.plan.cli import GIB, report, setup_from_args
from yarnlib.plan.cli import add_arguments as plan_arguments

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from test_plan import QWEN3_8B, QWEN25_7B  # noqa: E402  (config.json fields as on the hub)

# Qwen/Qwen3-4B's config.json differs from Qwen3-8B's in these fields only (of those read here)
QWEN3_4B = {**QWEN3_8B, "hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True}
# Qwen/QwQ-32B (a Qwen2.5-32B): the fields that differ from Qwen2.5-7B's
QWQ_32B = {
    **QWEN25_7B,
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "num_hidden_layers": 64,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "max_position_embeddings": 40960,
}
SWIFT = "https://github.com/modelscope/ms-swift/blob/main/examples/train/long_text/"
HF_BLOG = "https://huggingface.co/blog/ulysses-sp"
GB = 10**9
SWIFT_7B = "Qwen2.5-7B full SFT, {} packed, 4×A100 80GB, ZeRO-3, checkpointing, FA2, batch 1"
HF_SETUP = (
    "Qwen3-4B full SFT (TRL SFTTrainer), {}, {}×H100 80GB, ZeRO-3 + CPU optimizer offload, "
    "checkpointing, FA2, batch 1"
)


def hf_row(length: int, measured: float | None, sp: int, offload: str) -> tuple:
    gpus = 1 if sp == 1 else 4
    setup = HF_SETUP.format(f"{length // 1024}K", gpus) + (f", Ulysses sp {sp}" if sp > 1 else "")
    flags = f"--engine sft --context {length} --gpus {gpus} --gpu-memory 80GB --offload {offload}"
    flags += f" --sp {sp}" if sp > 1 else ""
    outcome = "ran" if measured else "OOM"
    return HF_BLOG, setup, measured and int(measured * GB), outcome, QWEN3_4B, flags


HF_MEASURED = [(8192, 76.4, 1), (8192, 23.4, 4), (32768, 35.0, 4), (65536, 50.5, 4)]
HF_MEASURED += [(98304, 66.0, 4), (131072, None, 4)]
# (source, setup, measured bytes or None, outcome, config.json, `yarnlib plan` flags)
ROWS = [
    (
        SWIFT + "zero3.sh",
        SWIFT_7B.format(16384) + ", Liger",
        56 * GIB,
        "ran",
        QWEN25_7B,
        "--engine sft --context 16384 --gpus 4 --gpu-memory 80GB --offload none --logits chunked",
    ),
    (
        SWIFT + "liger_kernel.sh",
        SWIFT_7B.format(16384) + ", Liger (the same setup, another ms-swift version)",
        42 * GIB,
        "ran",
        QWEN25_7B,
        "--engine sft --context 16384 --gpus 4 --gpu-memory 80GB --offload none --logits chunked",
    ),
    (
        SWIFT + "sequence_parallel.sh",
        SWIFT_7B.format(16384) + ", Ulysses sp 4 (ms-swift's own)",
        43 * GIB,
        "ran",
        QWEN25_7B,
        "--engine sft --sp 4 --context 16384 --gpus 4 --gpu-memory 80GB --offload none",
    ),
    (
        SWIFT + "ulysses/sequence_parallel.sh",
        SWIFT_7B.format(65536) + ", Ulysses sp 4 (ms-swift's own), YaRN",
        53 * GIB,
        "ran",
        QWEN25_7B,
        "--engine sft --sp 4 --context 65536 --gpus 4 --gpu-memory 80GB --offload none",
    ),
    (
        SWIFT + "ulysses/sequence_parallel_512k.sh",
        "QwQ-32B LoRA (ms-swift: rank 8, all linear layers), 512000 packed, 8×A100 80GB, "
        "ZeRO-3 offload, Ulysses sp 8, Liger, YaRN",
        80 * GIB,
        "ran",
        QWQ_32B,
        "--engine sft --sp 8 --context 512000 --gpus 8 --gpu-memory 80GB --offload all "
        "--lora 8 --logits chunked",
    ),
    *(hf_row(length, measured, sp, "optimizer") for length, measured, sp in HF_MEASURED),
    *(hf_row(length, measured, sp, "none") for length, measured, sp in HF_MEASURED),
]
NOT_EXPRESSED = [
    (
        SWIFT + "ring_attention/sequence_parallel_256k.sh",
        "Qwen2.5-7B-Instruct LoRA, 256000, 4×A100, ZeRO-3 offload, ring attention sp 4, Liger",
        "42 GiB",
        "ring attention inside DeepSpeed",
    ),
    (
        SWIFT + "sequence_parallel.sh",
        "Qwen2.5-3B LoRA, 65536, 8×A100, DDP (no DeepSpeed), Ulysses sp 8, batch 4",
        "40 GiB",
        "DDP (full weights on every GPU) with sp",
    ),
    (
        "https://unsloth.ai/blog/llama3-3",
        "Llama-3.1-8B QLoRA (4-bit), HF + FA2, 1×80GB: longest context 28000",
        "max length",
        "4-bit QLoRA",
    ),
    (
        "https://github.com/Qihoo360/360-LLaMA-Factory",
        "Qwen2.5-7B full SFT, 8×A800, ZeRO-3 offload, zigzag ring sp 8: longest 210k",
        "max length",
        "ring attention inside DeepSpeed",
    ),
]


def planned(config: dict, flags: str) -> tuple[int, bool]:
    """The plan's update peak without its reserve (allocated bytes), and its verdict."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        parser = argparse.ArgumentParser()
        plan_arguments(parser)
        setup = setup_from_args(parser.parse_args([folder, *flags.split()]))
        result = report(setup)
    return result["phases"]["update"] - setup.reserve, result["fits"]


def _link(url: str) -> str:
    return f"[{url.rsplit('/', 1)[-1] or url}]({url})"


def table() -> str:
    lines = [
        "| source | setup | measured | `yarnlib plan` flags | planned (allocated) | "
        "measured / planned | verdict agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    for url, setup, measured, outcome, config, flags in ROWS:
        plan, fits = planned(config, flags)
        shown = f"{measured / GIB:.1f} GiB" if measured else outcome
        ratio = f"{measured / plan:.2f}" if measured else "—"
        verdict = "fits" if fits else "does not fit"
        agrees = "yes" if fits == (outcome == "ran") else "**no**"
        lines.append(
            f"| {_link(url)} | {setup} | {shown} | `{flags}` | {plan / GIB:.1f} GiB ({verdict}) "
            f"| {ratio} | {agrees} |"
        )
    for url, setup, measured, missing in NOT_EXPRESSED:
        lines.append(
            f"| {_link(url)} | {setup} | {measured} | not expressible: {missing} | — | — | — |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
