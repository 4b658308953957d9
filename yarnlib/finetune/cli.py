"""``yarnlib finetune …`` and ``accelerate launch -m yarnlib.finetune …``: the arguments."""

from __future__ import annotations

import argparse

from yarnlib.model_arg import add_model_argument, check_model_given
from yarnlib.spec import METHODS, canonical_method

DEFAULT_LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p, "model")
    g = p.add_argument_group("model")
    g.add_argument("--method", default="yarn", help=f"RoPE scaling: {', '.join(METHODS)}")
    g.add_argument("--factor", type=float, default=None, help="scale factor s (needed unless none)")
    g.add_argument("--original-max-position-embeddings", type=int, default=None)
    g.add_argument(
        "--attn-implementation", default="auto", help="auto|sdpa|eager|flash_attention_2"
    )
    g.add_argument("--use-kernel", default="auto", type=_kernel, help="auto|true|false")
    g = p.add_argument_group("data")
    g.add_argument("--dataset", nargs="+", required=True, help="datasets id, .txt/.jsonl/.parquet")
    g.add_argument("--text-column", default="text")
    g.add_argument("--split", default="train")
    g.add_argument("--dataset-config", default=None)
    g.add_argument("--seq-len", type=int, required=True, help="tokens per packed row")
    g.add_argument(
        "--no-cross-document-attention",
        dest="cross_document_attention",
        action="store_false",
        help="each packed document attends only to itself; positions restart per document",
    )
    g.add_argument(
        "--cache-dir",
        help="tokenized data cache (default: $YARNLIB_CACHE/finetune, and $YARNLIB_CACHE "
        "defaults to ~/.cache/yarnlib)",
    )
    g = p.add_argument_group("PoSE: train a long context with short rows (arXiv 2309.10400)")
    g.add_argument(
        "--pose",
        action="store_true",
        help="rows of --seq-len tokens carry position ids that skip across --target-length",
    )
    g.add_argument(
        "--target-length",
        type=int,
        default=None,
        help="the context PoSE trains (> --seq-len); --factor defaults to it / the original",
    )
    g.add_argument("--pose-chunks", type=int, default=2, help="chunks per row (default 2)")
    g = p.add_argument_group("optimization (defaults: the YaRN paper)")
    g.add_argument("--steps", type=int, required=True, help="optimizer steps of the schedule")
    g.add_argument("--batch-size", type=int, default=1, help="rows per micro-batch per process")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=float, default=2e-5)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.95)
    g.add_argument("--warmup-steps", type=int, default=20)
    g.add_argument("--schedule", default="linear", help="linear|constant (after the warm-up)")
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="0 disables clipping")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("memory")
    g.add_argument(
        "--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false"
    )
    g.add_argument(
        "--chunk-size", type=int, default=1024, help="loss chunk in tokens; 0 = full logits"
    )
    g.add_argument("--mixed-precision", default="auto", help="auto (bf16 on GPU)|no|bf16|fp16")
    g = p.add_argument_group("LoRA (peft)")
    g.add_argument("--lora", action="store_true")
    g.add_argument("--lora-rank", type=int, default=16)
    g.add_argument("--lora-alpha", type=float, default=32.0)
    g.add_argument("--lora-dropout", type=float, default=0.0)
    g.add_argument("--lora-targets", default=DEFAULT_LORA_TARGETS)
    g = p.add_argument_group("output")
    g.add_argument("--output", required=True, help="folder: log.jsonl, checkpoints/, model/")
    g.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: never)")
    g.add_argument("--keep-checkpoints", type=int, default=2, help="newest kept; 0 keeps all")
    g.add_argument("--resume", default=None, help="'latest' or a checkpoint folder")
    g.add_argument(
        "--overwrite", action="store_true", help="replace an earlier run (model/, checkpoints/)"
    )
    g.add_argument("--stop-after", type=int, default=None, help="stop (and checkpoint) at step N")
    g.add_argument("--log-every", type=int, default=1)
    g.add_argument("--report-to", default="auto", help="auto|none|tensorboard,wandb,swanlab")


def _kernel(text: str):
    values = {"auto": "auto", "true": True, "false": False}
    if text.lower() not in values:
        raise argparse.ArgumentTypeError(f"use_kernel: {text!r}; allowed: auto, true, false")
    return values[text.lower()]


def check_pose_args(args) -> None:
    if args.pose and args.target_length is None:
        raise ValueError("target_length: --pose needs --target-length N (the context to train)")
    if args.target_length is not None and not args.pose:
        raise ValueError(
            f"target_length: {args.target_length} given without --pose; allowed: add --pose, or "
            "drop --target-length (without PoSE the rows are the training length)"
        )
    if not args.pose:
        return
    if args.target_length <= args.seq_len:
        raise ValueError(
            f"target_length: {args.target_length} is not longer than --seq-len {args.seq_len}; "
            f"allowed: a target > {args.seq_len} (PoSE trains a long context from short rows)"
        )
    if not 1 <= args.pose_chunks <= args.seq_len:
        raise ValueError(
            f"pose_chunks: {args.pose_chunks}; allowed: 1 … seq_len={args.seq_len} (every chunk "
            "holds at least one token of the row)"
        )


def check_args(args) -> None:
    check_pose_args(args)
    if args.factor is None and canonical_method(args.method) != "none" and not args.pose:
        raise ValueError(f"factor: required for method {args.method!r} (e.g. --factor 4)")
    positive = ("steps", "batch_size", "grad_accum", "log_every", "chunk_size", "lora_rank")
    for name in positive:
        minimum = 0 if name == "chunk_size" else 1
        if getattr(args, name) < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {getattr(args, name)!r}")
    for name in ("save_every", "keep_checkpoints", "warmup_steps"):
        if getattr(args, name) < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {getattr(args, name)!r}")
    if args.overwrite and args.resume:
        raise ValueError(
            f"overwrite: --overwrite starts a new run, --resume {args.resume} continues one; "
            "allowed: one of them"
        )
    if args.stop_after is not None and not 1 <= args.stop_after <= args.steps:
        raise ValueError(f"stop_after must be in [1, steps={args.steps}], got {args.stop_after!r}")
    if args.lr <= 0 or args.weight_decay < 0 or not (0 <= args.beta1 < 1 and 0 <= args.beta2 < 1):
        raise ValueError(
            f"optimizer: lr > 0, weight_decay >= 0, betas in [0, 1) required; got lr={args.lr}, "
            f"weight_decay={args.weight_decay}, betas=({args.beta1}, {args.beta2})"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="yarnlib finetune", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    check_model_given(args)
    return args


def run(args) -> int:
    from accelerate import PartialState

    from yarnlib.finetune.loop import train

    check_args(args)
    result = train(args)
    if not PartialState().is_main_process:  # one line for the run, not one per rank
        return 0
    if result.model_dir is not None:
        print(f"saved {result.model_dir}")
    else:
        print(f"stopped at step {result.steps} of {args.steps}; continue with --resume latest")
    return 0


DESCRIPTION = (
    "Fine-tune a RoPE model at a longer context with a scaled rotary embedding (accelerate: "
    "one GPU, DDP, FSDP2, DeepSpeed, context parallel)."
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("finetune", help=DESCRIPTION, description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=run)
