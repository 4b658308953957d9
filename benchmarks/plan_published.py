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
from test_plan import LLAMA31_8B, QWEN3_8B, QWEN25_7B  # noqa: E402  (config.json fields as on the hub)

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
# ms-swift moved and rewrote its examples since (long_text/ is gone from main): each row links
# the commit whose script states the figure
SWIFT = "https://github.com/modelscope/ms-swift/blob/{}/examples/train/{}"
SWIFT_MAY8 = "e3f270866a5bf5e4ee47a1cfbf310c671f05388e"  # liger_kernel.sh 42GB, sp 16K 43GiB
SWIFT_MAY13 = "70ec3155d9e165e084746cf91bc2758ca24af8b7"  # sequence_parallel.sh at 65536
SWIFT_MAY16 = "c0d14cf3dedf0885341e22855ac967e528e48bb5"  # sequence_parallel_512k.sh added
SWIFT_JUL3 = "f9afe2dc62669094621f5f72aac8036caeaa36f7"  # ring_attention/ examples added
SWIFT_SEP6 = "223378d6dd9986ff8952f009d7b169473c55a9a8"  # sequence_parallel/ (DDP, sp 8)
SWIFT_MAY7 = "e2a5019da036b95bc20370c7b3377b91823c9789"  # zero3.sh's 56GB, before its fix
HF_BLOG = "https://huggingface.co/blog/ulysses-sp"
# ArcticTraining's recipes as of 2026-04-13; torchtitan's table before it moved (2025-06-13)
ALST = "https://github.com/snowflakedb/ArcticTraining/blob/"
ALST += "b28638e6c577ece34cc147ab3d45d27a7f66b33b/projects/sequence-parallelism/"
TITAN = "https://github.com/pytorch/torchtitan/blob/"
TITAN += "bf835b59d6897949ee5d1cb9ce7aa2b6dc84860c/docs/performance.md"
# what each source's peak is: torchtitan logs max_reserved_gib as "memory", ms-swift logs
# torch.cuda.max_memory_reserved() as memory(GiB) (get_max_cuda_memory); ArcticTraining's "NV"
# is NVML's used memory in GiB (arctic_training/debug/utils.py), what nvidia-smi shows; the
# Hugging Face blog does not say how it measured its "Peak Memory". All are compared with the
# plan's total (its allocated bytes plus the stated 2 GiB reserve); an allocated figure would
# be compared with the allocated bytes alone. The blog's "GB" are GiB: its 128K run "requires
# ~81 GB and OOMs" on an H100 that holds 85.5e9 bytes (79.6 GiB), and its co-author's tools
# (ArcticTraining's and DeepSpeed's see_memory_usage) print bytes / 2**30 as "GB".
RESERVED, NVML, UNSTATED = "max_memory_reserved", "NVML used (nvidia-smi)", "not stated"
# TRL's guide reads its peaks off PyTorch's memory profiles: allocated bytes (its 63.6 GB run
# "still fails" without expandable segments, so the reserved figure was higher); "GB" are GiB
# there too (its per-layer band at 96k tokens, 0.47 GB, is 98304 × 2560 × 2 bytes in GiB)
ALLOCATED = "allocated (memory profile)"
SWIFT_7B = "Qwen2.5-7B full SFT, {} packed, 4×A100 80GB, ZeRO-3, checkpointing, FA2, batch 1"
HF_SETUP = (
    "Qwen3-4B full SFT (TRL SFTTrainer), {}, {}×H100 80GB, ZeRO-3 + CPU optimizer offload, "
    "checkpointing, FA2, batch 1"
)
ALST_8B = "Llama-3.1-8B full SFT (ArcticTraining), {} packed, {}, ZeRO-3 + CPU {} offload, "
ALST_8B += "checkpointing, batch 1, "
A100, H100, H200 = "80GiB", "79GiB", "140GiB"  # as nvidia-smi shows them (docs/plan.md)


def hf_row(length: int, measured: float | None, sp: int, offload: str) -> tuple:
    gpus = 1 if sp == 1 else 4
    setup = HF_SETUP.format(f"{length // 1024}K", gpus) + (f", Ulysses sp {sp}" if sp > 1 else "")
    setup += (
        " — planned as stated"
        if offload == "optimizer"
        else " — planned with the states on the GPU"
    )
    if not measured:
        setup += " (the blog: 'requires ~81 GB')"
    flags = f"--engine sft --context {length} --gpus {gpus} --gpu-memory {H100} --offload {offload}"
    flags += f" --sp {sp}" if sp > 1 else ""
    flags += OLD_TRL
    outcome = "ran" if measured else "OOM"
    return HF_BLOG, setup, measured and int(measured * GIB), UNSTATED, outcome, QWEN3_4B, flags


def alst_row(recipe: str, setup: str, measured: float | None, flags: str) -> tuple:
    return ALST + recipe, setup, measured and int(measured * GIB), NVML, "ran", LLAMA31_8B, flags


HF_MEASURED = [(8192, 76.4, 1), (8192, 23.4, 4), (32768, 35.0, 4), (65536, 50.5, 4)]
HF_MEASURED += [(98304, 66.0, 4), (131072, None, 4)]
SWIFT_SFT = f"--engine swift --gpus 4 --gpu-memory {A100} --offload none --optim adamw_torch"
# TRL's long-context guide and its example (SFT at 1M tokens with FSDP2 and context parallel)
TRL_GUIDE = "https://huggingface.co/docs/trl/en/long_context_training"
TRL_1M = "https://github.com/huggingface/trl/blob/2c42f6659f78287d94e54eea18628ab33d836b07/"
TRL_1M += "examples/sft_qwen3_8b_1m_context/sft_qwen3_8b_1m_context.py"
TRL_CP = "--engine sft --backend fsdp --cp {0} --context 1048576 --gpu-memory 79GiB"
TRL_CP += " --offload none --activation-offload"
SWIFT_512K = (
    f"--engine swift --sp 8 --context 512000 --gpus 8 --gpu-memory {A100} --offload all "
    "--lora 8 --logits chunked --loss-chunk 2048"
)
# the TRL loss before 1.13 (transformers' over the full logits, or Liger's): the blog (March 2026)
# ran such a TRL, and ArcticTraining's loss is one of the two; any version below 1.13 plans alike
OLD_TRL = " --trl-version 1.12"
ALST_1 = "--engine sft --gpus 1 --sp 1 --offload all" + OLD_TRL
ALST_8 = f"--engine sft --gpus 8 --gpu-memory {H100} --offload optimizer --logits chunked"
ALST_8 += OLD_TRL
# (source, setup, measured bytes or None, what the figure is, outcome, config.json, flags)
ROWS = [
    (
        SWIFT.format(SWIFT_MAY8, "long_text/liger_kernel.sh"),
        SWIFT_7B.format(16384) + ", Liger",
        42 * GIB,
        RESERVED,
        "ran",
        QWEN25_7B,
        f"{SWIFT_SFT} --context 16384 --logits chunked",
    ),
    (
        SWIFT.format(SWIFT_MAY8, "long_text/sequence_parallel.sh"),
        SWIFT_7B.format(16384) + ", Ulysses sp 4 (ms-swift's own)",
        43 * GIB,
        RESERVED,
        "ran",
        QWEN25_7B,
        f"{SWIFT_SFT} --context 16384 --sp 4",
    ),
    (
        SWIFT.format(SWIFT_MAY13, "long_text/sequence_parallel.sh"),
        SWIFT_7B.format(65536) + ", Ulysses sp 4 (ms-swift's own), YaRN",
        53 * GIB,
        RESERVED,
        "ran",
        QWEN25_7B,
        f"{SWIFT_SFT} --context 65536 --sp 4",
    ),
    *(hf_row(length, measured, sp, "none") for length, measured, sp in HF_MEASURED),
    *(hf_row(length, measured, sp, "optimizer") for length, measured, sp in HF_MEASURED),
    alst_row(
        "run-h100-sp1-llama-8b-baseline.yml",
        ALST_8B.format(32000, "1×H100 80GB", "optimizer and parameter") + "FA2, no Liger",
        71.91,
        f"{ALST_1} --context 32000 --gpu-memory {H100}",
    ),
    alst_row(
        "run-h100-sp1-llama-8b-baseline.yml",
        ALST_8B.format(36000, "1×H100 80GB", "optimizer and parameter")
        + "FA2, no Liger (the recipe's length, 'close to oom')",
        None,
        f"{ALST_1} --context 36000 --gpu-memory {H100}",
    ),
    alst_row(
        "run-h200-sp1-llama-8b-baseline.yml",
        ALST_8B.format(65000, "1×H200", "optimizer and parameter") + "FA3, no Liger",
        137.36,
        f"{ALST_1} --context 65000 --gpu-memory {H200}",
    ),
    alst_row(
        "run-h200-sp1-llama-8b-liger.yml",
        ALST_8B.format(300000, "1×H200", "optimizer and parameter") + "FA3, Liger",
        134.96,
        f"{ALST_1} --context 300000 --gpu-memory {H200} --logits chunked",
    ),
    alst_row(
        "run-h100-sp8-llama-8b-no-ulysses-yes-liger-no-extras.yml",
        ALST_8B.format(160000, "8×H100 80GB", "optimizer") + "FA2, Liger, no sequence parallel",
        None,
        f"{ALST_8} --context 160000 --sp 1",
    ),
    alst_row(
        "run-h200-sp1-llama-8b-liger-offload.yml",
        ALST_8B.format(650000, "1×H200", "optimizer and parameter")
        + "FA3, Liger, checkpoints offloaded to CPU (ArcticTraining's own, planned as TRL's)",
        126.81,
        f"{ALST_1} --context 650000 --gpu-memory {H200} --logits chunked --activation-offload",
    ),
    alst_row(
        "run-h100-sp8-llama-8b-yes-act-offload.yml",
        ALST_8B.format(2400000, "8×H100 80GB", "optimizer")
        + "FA2, Liger, Ulysses sp 8, checkpoints offloaded to CPU (planned as TRL's)",
        None,
        f"{ALST_8} --context 2400000 --sp 8 --activation-offload",
    ),
    alst_row(
        "run-h100-sp8-llama-8b-no-mlp-no-act-offload.yml",
        ALST_8B.format(1100000, "8×H100 80GB", "optimizer") + "FA2, Liger, Ulysses sp 8",
        None,
        f"{ALST_8} --context 1100000 --sp 8",
    ),
]
ROWS += [
    (
        TRL_1M,
        "Qwen3-8B full SFT (TRL SFTTrainer; measured with TRL 1.13's `chunked_nll` loss, planned "
        "with 1.16's fused LM head: the peak is a layer's backward either way), 1048576, "
        "8×H100 80GB, FSDP2 with context parallel 8 (accelerate), checkpointing with "
        "transformers' `offload`, batch 1, YaRN ×32: the run the issue cites",
        int(56.2 * GIB),
        ALLOCATED,
        "ran",
        QWEN3_8B,
        f"{TRL_CP.format(8)} --gpus 8",
    ),
    (
        TRL_GUIDE,
        "Qwen3-4B full SFT (TRL SFTTrainer, its chunked loss; planned with 1.16's fused LM head, "
        "the peak a layer's backward), 1048576, 4×H100 80GB, FSDP2 with context parallel 4, "
        "checkpointing with `offload`, YaRN (the guide: 'needs 63.6 GB')",
        int(63.6 * GIB),
        ALLOCATED,
        "ran",
        QWEN3_4B,
        f"{TRL_CP.format(4)} --gpus 4",
    ),
]
TITAN_SETUP = (
    "Llama-3.1-8B pre-training (torchtitan), {}, 8×H100 96GB, FSDP {} × context parallel {}, "
    "full checkpointing, batch 1, loss on the full logits in float32; torch.compile and Float8 "
    "linears (not in the plan)"
)
# (context, FSDP degree, cp, Memory(GiB)): Table 2 of torchtitan's performance.md
TITAN_MEASURED = [(32768, 8, 1, 83.9), (65536, 4, 2, 84.2), (131072, 2, 4, 84.0)]
TITAN_MEASURED += [(262144, 1, 8, 84.5)]
ROWS += [
    (
        TITAN,
        TITAN_SETUP.format(length, fsdp, cp),
        int(measured * GIB),
        RESERVED,
        "ran",
        LLAMA31_8B,
        f"--engine finetune --context {length} --gpus 8 --cp {cp} --offload none --logits full "
        "--gpu-memory 96GB",
    )
    for length, fsdp, cp, measured in TITAN_MEASURED
]
NOT_EXPRESSED = [
    (
        SWIFT.format(SWIFT_MAY16, "long_text/sequence_parallel_512k.sh"),
        "QwQ-32B LoRA (ms-swift: rank 8, all linear layers), 512000 packed, 8×A100 80GB, "
        "ZeRO-3 offload, Ulysses sp 8, Liger, CELOSS_PARALLEL_SIZE 2048, YaRN; 'GPU Memory: "
        "8 * 80GiB', the card's whole memory: an outcome (it ran), not a peak",
        "ran",
        "ms-swift 3.x's chunked loss, which wrote its grads over the saved logits; the 4.6.0 "
        "the plan knows keeps a grad buffer beside them",
        (QWQ_32B, SWIFT_512K, "80GiB"),
    ),
    (
        TRL_GUIDE,
        "Qwen3-4B full SFT (TRL SFTTrainer), 96k, 1×H100 80GB, checkpointing, TRL's own chunked "
        "loss, without and with the checkpoints offloaded",
        "59.9 GB; 48.8 GB",
        "one GPU with the model loaded in bf16 keeps bf16 weights, grads and AdamW moments (the "
        "guide's 30 GB for 'the model and its optimizer'), no fp32 master; TRL's own loss",
        None,
    ),
    (
        SWIFT.format(SWIFT_JUL3, "long_text/ring_attention/sequence_parallel_256k.sh"),
        "Qwen2.5-7B-Instruct LoRA, 256000, 4×A100, ZeRO-3 offload, ring attention sp 4, Liger",
        "42 GiB",
        "ring attention inside DeepSpeed",
    ),
    (
        SWIFT.format(SWIFT_SEP6, "sequence_parallel/sequence_parallel.sh"),
        "Qwen2.5-3B LoRA, 65536, 8×A100, DDP (no DeepSpeed), Ulysses sp 8, batch 4",
        "40 GiB",
        "DDP (full weights on every GPU) with sp",
    ),
    (
        ALST + "run-h100-sp1-llama-8b.yml",
        "Llama-3.1-8B full SFT (ArcticTraining), 500000, 1×H100, ZeRO-3 + CPU optimizer and "
        "parameter offload, Liger, checkpoints offloaded to CPU, tiled MLP",
        "ran",
        "tiled MLP",
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


# figures their source replaced: shown, not counted
SUPERSEDED = [
    (
        SWIFT.format(SWIFT_MAY7, "long_text/zero3.sh"),
        SWIFT_7B.format(16384) + ", Liger",
        "56 GB",
        "liger_kernel.sh, the same script renamed with its figure corrected to 42 GB (ms-swift "
        "commit e3f2708, 2025-05-08)",
    ),
]


def planned(config: dict, flags: str) -> tuple[int, int, bool]:
    """The plan's peak over its phases: allocated bytes, the total as nvidia-smi and
    ``max_memory_reserved()`` show it (the reserve and the allocator's cache), and its
    verdict."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        parser = argparse.ArgumentParser()
        plan_arguments(parser)
        setup = setup_from_args(parser.parse_args([folder, *flags.split()]))
        result = report(setup)
    allocated = max(result["phases"].values()) - setup.reserve
    return allocated, max(result["reserved_phases"].values()), result["fits"]


def _link(url: str) -> str:
    return f"[{url.rsplit('/', 1)[-1] or url}]({url})"


def results() -> list[dict]:
    """Each expressed row planned: its ratio (None for an outcome without a peak) and whether
    the verdict agrees with what happened."""
    out = []
    for url, setup, measured, figure, outcome, config, flags in ROWS:
        allocated, total, fits = planned(config, flags)
        # an allocated figure against the allocated bytes; the others include the cache
        plan = allocated if figure == ALLOCATED else total
        out.append(
            {
                "url": url,
                "setup": setup,
                "measured": measured,
                "figure": figure,
                "outcome": outcome,
                "flags": flags,
                "planned": plan,
                "fits": fits,
                "ratio": measured / plan if measured else None,
                "agrees": fits == (outcome == "ran"),
            }
        )
    return out


def table() -> str:
    lines = [
        "| source | setup | measured (figure) | `yarnlib plan` flags | planned (total) | "
        "measured / planned | verdict agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results():
        measured = row["measured"]
        shown = f"{measured / GIB:.1f} GiB ({row['figure']})" if measured else row["outcome"]
        ratio = f"{row['ratio']:.2f}" if measured else "—"
        verdict = "fits" if row["fits"] else "does not fit"
        agrees = "yes" if row["agrees"] else "**no**"
        lines.append(
            f"| {_link(row['url'])} | {row['setup']} | {shown} | `{row['flags']}` | "
            f"{row['planned'] / GIB:.1f} GiB{' allocated' if row['figure'] == ALLOCATED else ''} "
            f"({verdict}) | {ratio} | {agrees} |"
        )
    for url, setup, measured, successor in SUPERSEDED:
        lines.append(
            f"| {_link(url)} | {setup} | {measured} | superseded by {successor} | — | — | — |"
        )
    for url, setup, measured, missing, *closest in NOT_EXPRESSED:  # closest: flags that run
        if closest and closest[0]:
            config, flags, card = closest[0]
            _, total, fits = planned(config, flags)
            verdict = "fits" if fits else "does not fit"
            missing += f"; closest, `{flags}`: {total / GIB:.1f} GiB, {verdict} on {card}"
        lines.append(
            f"| {_link(url)} | {setup} | {measured} | not expressible: {missing} | — | — | — |"
        )
    return "\n".join(lines)


def linear_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares slope and intercept of (local tokens, bytes)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return slope, mean_y - slope * mean_x


def hf_blog_fit() -> str:
    """The Hugging Face blog's four sp-4 peaks against local tokens (context / 4), beside the
    plan's totals with the optimizer as stated (offloaded) and on the GPU: the slopes are one
    term (activations and loss head per token), the intercepts the states."""
    measured = [(n // 4, peak * GIB) for n, peak, sp in HF_MEASURED if peak and sp == 4]
    m_slope, m_zero = linear_fit(measured)
    parts = [f"measured {m_slope / 1e6:.3f} MB per local token, {m_zero / GIB:.1f} GiB at zero"]
    for offload, what in (("none", "states on the GPU"), ("optimizer", "offloaded as stated")):
        plan = []
        for n, _ in measured:
            flags = f"--engine sft --context {n * 4} --gpus 4 --gpu-memory {H100} "
            plan.append((n, planned(QWEN3_4B, flags + f"--offload {offload} --sp 4" + OLD_TRL)[1]))
        p_slope, p_zero = linear_fit(plan)
        parts.append(f"planned, {what}: {p_slope / 1e6:.3f} MB, {p_zero / GIB:.1f} GiB")
    return "HF blog, sp 4: " + "; ".join(parts)


def summary(rows: list[dict]) -> str:
    """Rows within ±15 %, the median ratio, verdicts agreeing: the issue's targets."""
    ratios = sorted(r["ratio"] for r in rows if r["ratio"] is not None)
    within = sum(0.85 <= r <= 1.15 for r in ratios)
    middle = len(ratios) // 2
    median = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
    agree = sum(r["agrees"] for r in rows)
    return (
        f"{within} of {len(ratios)} peaks within ±15 %, median {median:.2f}; "
        f"{agree} of {len(rows)} verdicts agree"
    )


def statistics() -> str:
    """The issue's targets as of the current formulas, for docs/plan.md: the blog planned with
    its optimizer states on the GPU (what its figures show), then as it states it, and the fit
    of the blog's rows."""
    everything = results()
    main = [r for r in everything if "as stated" not in r["setup"]]
    stated = [r for r in everything if r["url"] != HF_BLOG or "as stated" in r["setup"]]
    return "\n".join(
        [
            f"- the blog's states on the GPU: {summary(main)}",
            f"- the blog as stated (CPU optimizer offload): {summary(stated)}",
            f"- {hf_blog_fit()}",
        ]
    )


if __name__ == "__main__":
    print(table())
    print()
    print(statistics())
