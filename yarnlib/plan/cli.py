"""``yarnlib plan``: per-GPU memory of a long-context GRPO or fine-tuning run, and the engine
settings that fit (exit 0), or what does not fit and the smallest change that would (exit 1)."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict
from pathlib import Path

import yaml

from yarnlib.model_arg import add_model_argument, model_folder
from yarnlib.plan import fragments, parallel, planner, rope
from yarnlib.plan.memory import ATTENTION
from yarnlib.plan.shapes import read_config, shape_from_config
from yarnlib.wording import count

GIB = 1024**3
UNITS = {"mb": 10**6, "mib": 1024**2, "gb": 10**9, "gib": GIB, "tb": 10**12, "tib": 1024**4}
UNIT_NAMES = "MB, MiB, GB, GiB, TB or TiB (e.g. 141GB, 80GiB, 81559MiB as nvidia-smi shows)"
DESCRIPTION = "Will a long-context run fit? Per-GPU memory and the engine settings that fit."


def parse_bytes(field: str, text: str) -> int:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match:
        raise ValueError(f"{field}: {text!r} is not a number with a unit; allowed: {UNIT_NAMES}")
    unit = match.group(2)
    if not unit:
        raise ValueError(f"{field}: {text!r} needs a unit; allowed: {UNIT_NAMES}")
    if unit.lower() not in UNITS:
        raise ValueError(f"{field}: unit {unit!r} of {text!r} is not known; allowed: {UNIT_NAMES}")
    value = float(match.group(1)) * UNITS[match.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{field}: {text!r} must be positive")
    return int(value)


def _positive(field: str, value: int | None, minimum: int = 1) -> None:
    if value is not None and value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value}")


def setup_from_args(args) -> planner.Setup:
    source = Path(args.model)  # a folder or its config.json; else a cached hub id or smollm2
    shape = shape_from_config(read_config(source if source.exists() else model_folder(source)))
    for field in ("prompt", "response"):
        _positive(field, getattr(args, field), 0)
    prompt, response = args.prompt or 0, args.response or 0
    context = args.context if args.context is not None else prompt + response
    if context <= 0:
        raise ValueError(
            f"context must be a positive integer (tokens of one sequence), got {context}; "
            "give --context N or --prompt P --response R"
        )
    if prompt + response > context:
        raise ValueError(f"context: {context} < prompt + response = {prompt + response}")
    fields = ("gpus", "nodes", "rollout_n", "sp", "cp", "tp", "max_num_batched_tokens")
    for field in (*fields, "micro_batch", "loss_chunk", "lora"):
        _positive(field, getattr(args, field))
    u = args.gpu_memory_utilization
    if u is not None and not 0 < u < 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1), got {u}")
    return planner.Setup(
        shape=shape,
        engine=args.engine,
        context=context,
        gpus=args.gpus,
        nodes=args.nodes,
        gpu_bytes=parse_bytes("gpu_memory", args.gpu_memory),
        prompt=prompt,
        response=response,
        rollout_n=args.rollout_n,
        sp=args.sp,
        cp=args.cp,
        tp=args.tp,
        offload=args.offload,
        shard=args.shard,
        checkpointing=args.checkpointing,
        attn=args.attn or ("sdpa" if (args.cp or 1) > 1 else "flash"),
        logits=args.logits,
        utilization=u,
        batched_tokens=_batched_tokens(args),
        reference=args.kl,
        reserve=parse_bytes("reserve", args.reserve),
        backend=args.backend or ("deepspeed" if args.engine in ("sft", "swift") else "fsdp"),
        micro_batch=args.micro_batch,
        chunk=_loss_chunk(args),
        sp_loss_chunk=(args.loss_chunk or 0) if args.engine == "swift" else 0,
        optim=args.optim or planner.OPTIMIZERS[0],
        trl_version=_trl_version(args.trl_version),
        activation_offload=args.activation_offload,
        lora_rank=args.lora or 0,
    )


def _batched_tokens(args) -> int:
    """``--max-num-batched-tokens``: vLLM's chunked-prefill budget (8192), which the verl and
    EasyR1 fragments set; TRL builds its colocated vLLM with its own."""
    if args.max_num_batched_tokens is None:
        return 8192
    if args.engine == "trl":
        raise ValueError(
            f"max_num_batched_tokens: TRL's colocated vLLM always runs "
            f"{planner.TRL_BATCHED_TOKENS}, which the plan uses; allowed: leave it out with "
            "--engine trl"
        )
    return args.max_num_batched_tokens


def _trl_version(text: str | None) -> tuple[int, int]:
    """``--trl-version MAJOR.MINOR`` (sft): the TRL whose loss the plan counts."""
    if text is None:
        return planner.TRL_TESTED
    match = re.fullmatch(r"\s*(\d+)\.(\d+)(\.\d+)?\s*", text)
    if not match:
        raise ValueError(f"trl_version: {text!r} is not a version; allowed: MAJOR.MINOR, e.g. 1.16")
    return int(match.group(1)), int(match.group(2))


def _loss_chunk(args) -> int:
    """``--loss-chunk``: yarnlib finetune's ``--chunk-size`` (for swift, ms-swift's
    ``CELOSS_PARALLEL_SIZE``: ``sp_loss_chunk``); the other engines fix their own."""
    if args.loss_chunk is None or args.engine == "swift":
        return planner.CHUNK
    if args.engine != "finetune":
        raise ValueError(
            f"loss_chunk: {args.engine} sets its own loss chunking (verl's fused kernels, "
            "Liger in TRL); allowed: --loss-chunk with --engine finetune or swift"
        )
    return args.loss_chunk


def report(setup: planner.Setup) -> dict:
    plan = planner.choose(setup)
    s, shape = setup, setup.shape
    out = {
        "model": {**asdict(shape), "params": shape.params},
        "run": {
            "engine": s.engine,
            "context": s.context,
            "prompt": s.prompt,
            "response": s.response,
            "gpus_per_node": s.gpus,
            "nodes": s.nodes,
            "gpu_bytes": s.gpu_bytes,
        },
        "valid": {
            "ulysses_sp": parallel.ulysses_degrees(shape, s.world),
            "vllm_tp": parallel.tensor_parallel_degrees(shape, s.gpus),
            "context_parallel_cp": parallel.context_parallel_degrees(s.world, s.context),
        },
        "chosen": {
            "sp": plan.sp,
            "cp": plan.cp,
            "tp": plan.tp,
            "offload": plan.offload,
            "logits": s.logits_mode,
            "checkpointing": s.checkpointing,
            "backend": s.backend,
            "activation_offload": s.activation_offload,
            "lora_rank": s.lora_rank,
            "micro_batch": s.micro_batch,
            "tokens_per_gpu": plan.tokens_per_gpu,
        },
        "bytes_per_gpu": plan.lines,
        "phases": plan.phases,
        "reserved_phases": {**plan.phases, **plan.reserved},
        "fits": plan.fits,
        "problems": plan.problems,
    }
    if s.engine in ("sft", "swift", "trl"):
        out["chosen"]["optim"] = s.optim
    if plan.kv is not None:
        out["chosen"]["gpu_memory_utilization"] = plan.utilization
        out["rollout"] = {
            "kv_bytes_per_token": plan.kv.bytes_per_token,
            "kv_blocks": plan.kv.blocks,
            "block_size": plan.kv.block_size,
            "kv_tokens": plan.kv.tokens,
            "sequences_at_once": plan.kv.sequences(s.context),
        }
    if plan.fits:
        out["fragment"] = fragments.RENDERERS[s.engine](plan)
        if s.engine in ("trl", "sft"):
            out["accelerate"] = fragments.accelerate(plan)
        if s.engine == "finetune":
            out["command"] = fragments.finetune_command(plan)
        if s.engine == "sft":
            out["command"] = fragments.sft_command(plan)
        if s.engine == "swift":
            out["command"] = fragments.swift_command(plan)
    else:
        out["suggestions"] = planner.suggestions(setup)
    advice = rope.hint(shape.rope, s.context)
    if advice:
        out["rope"] = advice
    return out


def format_report(r: dict) -> str:
    m, run, ch = r["model"], r["run"], r["chosen"]
    lines = [
        f"model: {m['model_type']}, {m['params'] / 1e9:.2f} B parameters, "
        f"{m['num_hidden_layers']} layers, {m['num_attention_heads']} heads / "
        f"{m['num_key_value_heads']} kv heads",
        f"run: {run['engine']}, {run['context']} tokens per sequence, "
        f"{count(run['gpus_per_node'], 'GPU')} × {count(run['nodes'], 'node')}, "
        f"{run['gpu_bytes'] / GIB:.1f} GiB each",
        f"valid: Ulysses sp {r['valid']['ulysses_sp']}, vLLM tp {r['valid']['vllm_tp']}, "
        f"context parallel cp {r['valid']['context_parallel_cp']}",
        "plan: " + ", ".join(f"{k} {v}" for k, v in ch.items()),
        "",
        f"{'per GPU':<44}{'GiB':>8}",
    ]
    lines += [f"  {k:<42}{v / GIB:>8.2f}" for k, v in r["bytes_per_gpu"].items()]
    lines += ["", "phase totals (with reserve)"]
    lines += [
        f"  {k:<42}{v / GIB:>8.2f} of {run['gpu_bytes'] / GIB:.1f}" for k, v in r["phases"].items()
    ]
    for k, v in r["reserved_phases"].items():
        if v != r["phases"][k]:
            lines.append(f"  {k + ', as nvidia-smi shows it':<42}{v / GIB:>8.2f} (the allocator "
                         "frees its cache before it fails: not in the verdict)")  # fmt: skip
    if "rollout" in r:
        ro = r["rollout"]
        lines.append(
            f"rollout: {ro['kv_bytes_per_token']} KV bytes/token per rank, {ro['kv_blocks']} "
            f"blocks of {ro['block_size']} = {ro['kv_tokens']} tokens: "
            f"{ro['sequences_at_once']} sequence(s) of {run['context']} at once"
        )
    if "rope" in r:
        lines.append(f"rope: {r['rope']}")
    if r["fits"] and run["engine"] == "swift":  # its settings are its command line
        lines += ["fits: yes", "", "# ms-swift (MODEL: the folder yarnlib config wrote)"]
        lines.append(r["command"])
    elif r["fits"]:
        lines += ["fits: yes", "", f"# {run['engine']} settings (merge into your recipe)"]
        lines.append(yaml.safe_dump(r["fragment"], sort_keys=False).rstrip())
        if "accelerate" in r:
            lines += [
                "# accelerate config for the actor (plan_accelerate.yaml)",
                yaml.safe_dump(r["accelerate"]),
            ]
        if "command" in r:
            lines += ["# then", r["command"]]
    else:
        lines += ["does not fit:"] + [f"  - {p}" for p in r["problems"]]
        lines += ["smallest changes that fit:"]
        lines += [f"  - {s}" for s in r["suggestions"]] or ["  - none found"]
    return "\n".join(lines)


def run(args) -> int:
    result = report(setup_from_args(args))
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0 if result["fits"] else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p, "model")  # also a config.json file
    p.add_argument(
        "--engine",
        choices=planner.ENGINES,
        default="verl",
        help="GRPO: verl, easyr1, trl; fine-tuning: finetune (yarnlib finetune), sft (TRL's "
        "SFTTrainer), swift (ms-swift's swift sft)",
    )
    p.add_argument("--context", type=int, default=None, help="tokens per sequence")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (GRPO)")
    p.add_argument("--response", type=int, default=None, help="response tokens (GRPO)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs per node")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpu-memory", required=True, help="memory of one GPU, e.g. 141GB or 80GiB")
    p.add_argument("--rollout-n", type=int, default=8, help="responses per prompt")
    p.add_argument("--sp", type=int, default=None, help="Ulysses degree (default: smallest fit)")
    p.add_argument(
        "--cp", type=int, default=None, help="context parallel degree (finetune; sft on fsdp)"
    )
    p.add_argument("--tp", type=int, default=None, help="vLLM tensor parallel degree")
    p.add_argument("--offload", choices=planner.OFFLOAD, default=None)
    p.add_argument("--shard", choices=("full", "hybrid"), default="full")
    p.add_argument(
        "--backend",
        choices=planner.BACKENDS,
        default=None,
        help="finetune, trl: FSDP2 (default) or DeepSpeed ZeRO-3 (--offload: its CPU offload); "
        "sft: deepspeed (default, Ulysses --sp) or fsdp (context parallel --cp); swift: deepspeed",
    )
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch per GPU")
    p.add_argument(
        "--loss-chunk",
        type=int,
        default=None,
        help="finetune: loss chunk in tokens (1024); swift: CELOSS_PARALLEL_SIZE, ms-swift's "
        "chunked sequence-parallel loss (unchunked)",
    )
    p.add_argument(
        "--lora",
        type=int,
        default=None,
        metavar="RANK",
        help="sft, swift, finetune under DeepSpeed: LoRA of this rank on q, k, v, o (swift: "
        "every linear layer) of a frozen base",
    )
    p.add_argument(
        "--optim",
        choices=planner.OPTIMIZERS,
        default=None,
        help="sft, swift, trl: transformers' optimizer (default adamw_torch_fused; adamw_torch is "
        "for-each, its default before torch 2.8, one more fp32 copy at the ZeRO-3 step)",
    )
    p.add_argument(
        "--activation-offload",
        action="store_true",
        help="verl, sft: checkpointed activations to CPU (enable_activation_offload; "
        "transformers' checkpoint offload)",
    )
    p.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    p.add_argument("--attn", choices=ATTENTION, default=None, help="default flash (sdpa with cp)")
    p.add_argument(
        "--logits",
        choices=("chunked", "full"),
        default=None,
        help="chunked: the engine's chunked loss (TRL, sft, swift: Liger's kernels); full: the "
        "loss over the full logits",
    )
    p.add_argument(
        "--trl-version",
        default=None,
        help="sft, trl: the TRL whose loss is planned (default 1.16: its fused LM head since "
        "1.15; before 1.13 the full logits, or Liger's with --logits chunked)",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="vLLM's (verl, EasyR1): 8192"
    )
    p.add_argument("--no-kl", dest="kl", action="store_false", help="no reference model")
    p.add_argument("--reserve", default="2GiB", help="per GPU outside the plan (CUDA, NCCL)")
    p.add_argument("--json", action="store_true")


def register(subparsers) -> None:
    parser = subparsers.add_parser("plan", help=DESCRIPTION, description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=run)
