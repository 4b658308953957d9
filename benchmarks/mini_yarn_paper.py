"""A miniature of the YaRN paper's Table 1 on CPU, through ``yarnlib.finetune``.

1. pretrain: a tiny LLaMA from scratch at 256 tokens on 12 Shakespeare plays (BPE tokenizer
   trained on them), RoPE unscaled;
2. extend to 1024 with PI (linear), NTK and YaRN at s=4: perplexity on the 2 held-out plays at
   256…2048 tokens before and after the same fine-tuning budget at 1024 tokens per method;
3. step: tokens/s and peak memory of one training step of SmolLM2-135M at 2k/4k/8k with and
   without gradient checkpointing and the chunked loss.

Perplexity at length L: the held-out token stream cut into windows of L tokens, NLL of every
token but the first of each window (the same tokens for every method). Writes
``results.json`` and ``perplexity.png`` in --output and prints the tables.

    .venv/bin/python benchmarks/mini_yarn_paper.py --output benchmarks/results/mini_yarn_paper
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from accelerate.state import AcceleratorState
from tqdm.auto import tqdm

import yarnlib
from yarnlib.chunked_loss import token_nll
from yarnlib.documents import DEFAULT_DATASET
from yarnlib.eval.measure import Meter
from yarnlib.finetune.cli import check_args, parse_args
from yarnlib.finetune.data import labels_for
from yarnlib.finetune.loop import loss_of, train

METHODS = ("linear", "ntk", "yarn")
PARTS = ("paper", "step")
HELD_OUT = 2  # the last plays (by file name) are the evaluation set


def build_base(folder: Path, train_files: list[Path], vocab: int) -> Path:
    """A randomly initialised tiny LLaMA (L=256, 2 layers, hidden 128, head_dim 32) and a
    byte-level BPE tokenizer: small enough for a few minutes on 2 shared cores."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<eos>"])
    tokenizer.train([str(f) for f in train_files], trainer)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        rope_theta=10000.0, tie_word_embeddings=True, eos_token_id=0, bos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>").save_pretrained(folder)
    return folder


def finetune(model: str, files: list[Path], output: Path, cache: Path, *options: str):
    """One ``yarnlib finetune`` run in this process."""
    AcceleratorState._reset_state(True)
    argv = ["--model", model, "--dataset", *map(str, files), "--output", str(output),
            "--cache-dir", str(cache), "--report-to", "none", "--overwrite", *options]  # fmt: skip
    args = parse_args(argv)
    check_args(args)
    return train(args)


@torch.no_grad()
def perplexities(model, tokens: torch.Tensor, lengths: list[int]) -> dict[int, float]:
    model.eval()
    head = model.get_output_embeddings()
    result = {}
    for length in lengths:
        windows = tokens[: tokens.numel() // length * length].view(-1, length)
        total, count = 0.0, 0
        for batch in windows.split(max(1, 8192 // length)):
            hidden = model.base_model(input_ids=batch).last_hidden_state[:, :-1]
            nll = token_nll(hidden, head, batch[:, 1:])
            total, count = total + float(nll.double().sum()), count + nll.numel()
        result[length] = math.exp(total / count)
    return result


def run_paper(args, output: Path) -> dict:
    files = sorted(Path(args.data).glob("*.txt"))
    train_files, eval_files = files[:-HELD_OUT], files[-HELD_OUT:]
    cache = output / "cache"
    base_dir = build_base(output / "init", train_files, args.vocab)
    common = ("--schedule", "linear", "--chunk-size", "0", "--no-gradient-checkpointing")
    tic = time.perf_counter()
    pre = finetune(
        str(base_dir), train_files, output / "pretrain", cache, "--method", "none",
        "--seq-len", "256", "--batch-size", "8", "--steps", str(args.pretrain_steps),
        "--lr", "3e-3", "--warmup-steps", "20", "--weight-decay", "0.1", *common,
    )  # fmt: skip
    pretrain_s = time.perf_counter() - tic
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pre.model_dir)
    text = "".join(f.read_text() for f in eval_files)
    held_out = torch.tensor(tokenizer(text, verbose=False)["input_ids"][: args.eval_tokens])
    lengths = [256, 512, 1024, 2048]
    rows = {"none": perplexities(pre.model, held_out, lengths)}
    runs = {}
    for method in METHODS:
        before = AutoModelForCausalLM.from_pretrained(pre.model_dir)
        yarnlib.patch(before, method=method, factor=4)
        rows[f"{method} (no fine-tune)"] = perplexities(before, held_out, lengths)
        tic = time.perf_counter()
        tuned = finetune(
            str(pre.model_dir), train_files, output / f"finetune-{method}", cache,
            "--method", method, "--factor", "4", "--seq-len", "1024", "--batch-size", "2",
            "--steps", str(args.finetune_steps), "--lr", "1e-3", "--warmup-steps", "5", *common,
        )  # fmt: skip
        runs[method] = {
            "seconds": round(time.perf_counter() - tic, 1),
            "final_loss": tuned.losses[max(tuned.losses)],
        }
        rows[f"{method} (fine-tuned)"] = perplexities(tuned.model, held_out, lengths)
    return {
        "lengths": lengths,
        "perplexity": {name: {str(k): v for k, v in r.items()} for name, r in rows.items()},
        "held_out": [f.name for f in eval_files],
        "held_out_tokens": held_out.numel(),
        "pretrain": {
            "steps": args.pretrain_steps,
            "seq_len": 256,
            "batch": 8,
            "seconds": round(pretrain_s),
            "final_loss": pre.losses[max(pre.losses)],
        },  # fmt: skip
        "finetune": {"steps": args.finetune_steps, "seq_len": 1024, "batch": 2, "runs": runs},
    }


def one_step(model, length: int, checkpointing: bool, chunk_size: int) -> dict:
    """Forward + backward of one row of ``length`` tokens; peak RSS of the process."""
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator())
    head = model.get_output_embeddings()
    with Meter("cpu") as meter:
        loss = loss_of(model, head, {"input_ids": ids}, labels_for(ids, None), chunk_size)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return {
        "length": length, "gradient_checkpointing": checkpointing,
        "chunked_loss": chunk_size > 0, **meter.fields(length),
    }  # fmt: skip


def run_step(args, output: Path) -> list[dict]:
    from yarnlib.models import load_smollm2

    model, _ = load_smollm2()
    yarnlib.patch(model, method="yarn", factor=4)
    plan = [
        (n, gc, chunk) for n in args.step_lengths for gc in (True, False) for chunk in (1024, 0)
    ]
    # Above --all-configs-max only the memory-saving configuration runs: 30 layers of 8k
    # activations and 8k × 49k logits do not fit beside the other users of this machine.
    plan = [(n, gc, c) for n, gc, c in plan if n <= args.all_configs_max or (gc and c)]
    records = []
    for n, gc, chunk in tqdm(plan, desc="training step", unit="config"):
        records.append(one_step(model, n, gc, chunk))
        (output / "step.json").write_text(json.dumps(records, indent=1))
    return records


def tables(results: dict) -> str:
    lines = []
    paper = results.get("paper")
    if paper:
        lengths = paper["lengths"]
        lines.append("| method | " + " | ".join(str(n) for n in lengths) + " |")
        lines.append("|---" * (len(lengths) + 1) + "|")
        for name, row in paper["perplexity"].items():
            lines.append(f"| {name} | " + " | ".join(f"{row[str(n)]:.2f}" for n in lengths) + " |")
    if results.get("step"):
        lines += ["", "| tokens | grad. checkpointing | chunked loss | tokens/s | peak RSS (MiB) |"]
        lines.append("|---|---|---|---|---|")
        for r in results["step"]:
            lines.append(
                f"| {r['length']} | {r['gradient_checkpointing']} | {r['chunked_loss']} | "
                f"{r['tokens_per_s']:.0f} | {r['peak_memory_mb']:.0f} |"
            )
    return "\n".join(lines)


def plot(paper: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    lengths = paper["lengths"]
    colors = {"none": "black", "linear": "C0", "ntk": "C1", "yarn": "C2"}
    for name, row in paper["perplexity"].items():
        style = "--" if "no fine-tune" in name else "-"
        color = colors[name.split()[0]]
        ax.plot(lengths, [row[str(n)] for n in lengths], style, color=color, marker="o", label=name)
    ax.set(xscale="log", xlabel="context (tokens)", ylabel="perplexity (held-out plays)")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.axvline(256, color="grey", lw=0.5)
    ax.axvline(1024, color="grey", lw=0.5)
    ax.set_title("tiny LLaMA, L=256 → 1024 (s=4), Shakespeare")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="benchmarks/results/mini_yarn_paper")
    p.add_argument("--data", default=str(DEFAULT_DATASET))
    p.add_argument("--parts", default="paper,step", help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--pretrain-steps", type=int, default=400)
    p.add_argument("--finetune-steps", type=int, default=60)
    # One thread: on 2 cores shared with other jobs, two OpenMP threads ran a step 20-60x slower.
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-tokens", type=int, default=32768, help="held-out tokens scored")
    p.add_argument("--step-lengths", type=lambda t: [int(v) for v in t.split(",")],
                   default=[2048, 4096, 8192])  # fmt: skip
    p.add_argument("--all-configs-max", type=int, default=4096)
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    if not set(parts) <= set(PARTS):
        raise ValueError(f"parts: {args.parts!r}; allowed: {', '.join(PARTS)}")
    torch.set_num_threads(args.threads)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    results = {
        "settings": {k: v for k, v in vars(args).items()},
        "threads": torch.get_num_threads(),
    }
    if "paper" in parts:
        results["paper"] = run_paper(args, output)
        plot(results["paper"], output / "perplexity.png")
        (output / "results.json").write_text(json.dumps(results, indent=1))
    if "step" in parts:
        results["step"] = run_step(args, output)
    (output / "results.json").write_text(json.dumps(results, indent=1))
    print(tables(results))


if __name__ == "__main__":
    main()
