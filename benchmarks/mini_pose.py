"""PoSE in miniature (issue 28): the 256-token LLaMA of benchmarks/mini_yarn_paper.py extended
with YaRN to 1024 (4×), 2048 (8×) and (issue 49, ``--factors 16``) 4096 (16×) several ways, at
the same number of steps:

- ``none``: the YaRN patch, no training;
- ``full``: ``yarnlib finetune`` on rows of N tokens;
- ``pose``: ``yarnlib finetune --pose --target-length N`` on rows of 256 tokens (2 chunks);
- ``window``: the same 256-token rows without PoSE (consecutive positions): what the extra
  training alone does, so that ``pose`` minus ``window`` is the effect of the skips;
- ``pose-tokens``: PoSE with as many tokens per step as ``full`` (factor × the rows).

Perplexity on the held-out plays at 256…N (the held-out token stream cut into windows of the
length; the same tokens for every arm), tokens and seconds per step, and the peak RSS of each
training process (one process per run, so peaks do not mix). Writes results.json and prints
the table.

    nice -n 10 .venv/bin/python benchmarks/mini_pose.py --output benchmarks/results/mini_pose
    nice -n 10 .venv/bin/python benchmarks/mini_pose.py --factors 16 \\
        --output benchmarks/out/mini_pose

(the second: the 16× point in an ignored folder that holds a copy of results.json, since the
pretrained model and the arms' models are not committed; copy its results.json back when done.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from mini_yarn_paper import HELD_OUT, build_base, perplexities  # benchmarks/, beside this

import yarnlib
from yarnlib.documents import DEFAULT_DATASET

WINDOW = 256  # the base model's context, and PoSE's row length
ARMS = ("none", "full", "pose", "window", "pose-tokens")
LENGTHS = (256, 512, 1024, 2048, 4096)  # perplexity at each of these up to the target


def finetune(output: Path, *argv: str) -> list[dict]:
    """One ``yarnlib finetune`` in its own process (its peak RSS is its own); its log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "yarnlib.finetune", *argv, "--output", str(output),
               "--report-to", "none", "--overwrite"]  # fmt: skip
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (output / "log.jsonl").read_text().splitlines()]


def summary(log: list[dict]) -> dict:
    """Tokens per step, median seconds per step, peak RSS (GiB) of the run."""
    elapsed = [0.0] + [r["elapsed_s"] for r in log]
    seconds = sorted(b - a for a, b in zip(elapsed, elapsed[1:], strict=False))
    return {
        "steps": log[-1]["step"],
        "tokens_per_step": log[-1]["tokens"] // log[-1]["step"],
        "seconds_per_step": seconds[len(seconds) // 2],
        "peak_rss_gib": max(r["memory_gib"] for r in log),
        "final_loss": log[-1]["loss"],
    }


def arm_model(args, output: Path, pretrained: Path, arm: str, factor: int, common) -> tuple:
    """(model extended by ``arm``, its training summary; empty without training)."""
    from transformers import AutoModelForCausalLM

    if arm == "none":
        model = AutoModelForCausalLM.from_pretrained(pretrained)
        return yarnlib.patch(model, method="yarn", factor=factor), {}
    target = WINDOW * factor
    rows = {
        "full": ["--seq-len", str(target)],
        "pose": ["--seq-len", str(WINDOW), "--pose", "--target-length", str(target)],
        "window": ["--seq-len", str(WINDOW)],
        "pose-tokens": ["--seq-len", str(WINDOW), "--pose", "--target-length", str(target)],
    }[arm]
    rows_per_step = args.batch_size * (factor if arm == "pose-tokens" else 1)
    folder = output / f"{arm}-x{factor}"
    log = finetune(
        folder, "--model", str(pretrained), "--method", "yarn", "--factor", str(factor), *rows,
        "--batch-size", str(rows_per_step), "--steps", str(args.steps), "--lr", "1e-3",
        "--warmup-steps", "5", *common,
    )  # fmt: skip
    return AutoModelForCausalLM.from_pretrained(folder / "model"), summary(log)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="benchmarks/results/mini_pose")
    p.add_argument("--data", default=str(DEFAULT_DATASET))
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--pretrain-steps", type=int, default=400)
    p.add_argument("--steps", type=int, default=60, help="fine-tuning steps of every arm")
    p.add_argument("--batch-size", type=int, default=2, help="rows per step of every arm")
    p.add_argument("--factors", default="4,8")
    p.add_argument("--eval-tokens", type=int, default=32768)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    files = sorted(Path(args.data).glob("*.txt"))
    train_files, eval_files = files[:-HELD_OUT], files[-HELD_OUT:]
    data = ["--dataset", *map(str, train_files), "--cache-dir", str(output / "cache")]
    common = (*data, "--schedule", "linear", "--chunk-size", "0", "--no-gradient-checkpointing")
    pretrained = output / "pretrain" / "model"
    if not pretrained.is_dir():  # as mini_yarn_paper.py: 400 steps × 8 rows × 256 tokens
        base = build_base(output / "init", train_files, args.vocab)
        finetune(output / "pretrain", "--model", str(base), "--method", "none", "--seq-len",
                 str(WINDOW), "--batch-size", "8", "--steps", str(args.pretrain_steps), "--lr",
                 "3e-3", "--warmup-steps", "20", "--weight-decay", "0.1", *common)  # fmt: skip
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    text = "".join(f.read_text() for f in eval_files)
    held_out = torch.tensor(tokenizer(text, verbose=False)["input_ids"][: args.eval_tokens])
    results_path = output / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {"runs": {}}
    # the factors and the folder differ between runs that share this file; the rest must not
    results["settings"] = {k: v for k, v in vars(args).items() if k not in ("factors", "output")}
    results["held_out"] = [f.name for f in eval_files]
    for factor in (int(f) for f in args.factors.split(",")):
        target = WINDOW * factor
        lengths = [n for n in LENGTHS if n <= target]
        for arm in ARMS:
            name = f"{arm} ×{factor}"
            if name in results["runs"]:
                continue  # a rerun goes on where the last one stopped
            model, run = arm_model(args, output, pretrained, arm, factor, common)
            run["perplexity"] = {
                str(n): v for n, v in perplexities(model, held_out, lengths).items()
            }
            results["runs"][name] = run
            results_path.write_text(json.dumps(results, indent=1))
    print(table(results))


def table(results: dict) -> str:
    lengths = [str(n) for n in LENGTHS]
    head = ["run", *(f"ppl {n}" for n in lengths), "tokens/step", "s/step", "peak RSS GiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, run in results["runs"].items():
        ppl = [f"{run['perplexity'][n]:.2f}" if n in run["perplexity"] else "" for n in lengths]
        cost = ["-", "-", "-"]
        if "steps" in run:
            cost = [str(run["tokens_per_step"]), f"{run['seconds_per_step']:.2f}",
                    f"{run['peak_rss_gib']:.2f}"]  # fmt: skip
        lines.append("| " + " | ".join([name, *ppl, *cost]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
