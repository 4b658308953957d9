"""Issue 49: one GRPO step of SmolLM2-135M at 128k with TRL's GRPOTrainer and HF generation.

A Knights-and-Knaves prompt padded with Shakespeare to ``--prompt-tokens`` (past 100k), yarn
×16 from 8192, through ``yarnlib.integrations.trl.apply`` (the scaled folder the actor loads).
The rollout is Hugging Face generation on the trainer's own model (``HFRollout``, TRL's
``rollout_func``; the GPU machine has no vLLM): the prompt prefilled into the KV cache in
chunks of 8192 tokens, as an inference engine does, then ``model.generate`` sampling from
that cache. Its log-probs (every prompt token, and the sampled tokens at the sampling temperature)
are compared with the actor's one-pass forward over the whole sequence: |Δ log p| within and
beyond L (``yarnlib.integrations.logprob_gap``). Peak device memory of the rollout and of the
update (TRL's forward and backward) stand beside ``yarnlib plan --engine trl`` for the same
shapes. Writes OUTPUT/summary.json.

    python benchmarks/gpu_128k_grpo.py --model smollm2 --output /tmp/grpo   # on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL
SLACK = 64  # decoding then re-encoding the distractor may shift the prompt's count a little


def autocast(dtype: str):
    """The rollout and the gap measurement in the precision of TRL's own forward."""
    if dtype == "bfloat16" and torch.cuda.is_available():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_mb() -> float | None:
    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 2**20, 1)


def reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


@torch.no_grad()
def prefill_logprobs(model, ids: list[int], chunk: int):
    """(log-prob of each prompt token after the first, the KV cache of all but the last prompt
    token): the prompt fed in chunks through the cache, as an inference engine's chunked
    prefill reads it; generation then starts from the last prompt token."""
    from transformers import DynamicCache

    tokens = torch.tensor([ids], device=model.device)
    cache = DynamicCache()
    scores = []
    for start in range(0, len(ids) - 1, chunk):
        piece = tokens[:, start : min(start + chunk, len(ids) - 1)]
        hidden = model.model(input_ids=piece, past_key_values=cache, use_cache=True)
        logits = model.lm_head(hidden.last_hidden_state[0]).float().log_softmax(-1)
        targets = tokens[0, start + 1 : start + 1 + piece.shape[1]]
        scores.append(logits.gather(-1, targets[:, None])[:, 0])
    return torch.cat(scores).cpu().tolist(), cache


@torch.no_grad()
def sample(model, ids: list[int], cache, length: int, count: int, temperature: float, eos: int):
    """``count`` completions by ``model.generate`` from (a copy of) the prefilled cache, plain
    multinomial sampling at ``temperature``; (token ids, their log-probs) per completion."""
    import copy

    tokens = torch.tensor([ids], device=model.device)
    completions = []
    for _ in range(count):
        out = model.generate(
            input_ids=tokens, attention_mask=torch.ones_like(tokens),
            past_key_values=copy.deepcopy(cache), do_sample=True, temperature=temperature,
            top_k=0, top_p=1.0, max_new_tokens=length, pad_token_id=eos, eos_token_id=eos,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
        new = out.sequences[0, len(ids) :].tolist()
        if eos in new:
            new = new[: new.index(eos) + 1]
        scores = [float((logits[0].float() / temperature).log_softmax(-1)[token])
                  for logits, token in zip(out.logits, new, strict=False)]  # fmt: skip
        completions.append((new, scores))
    return completions


class HFRollout:
    """``GRPOTrainer(rollout_func=HFRollout(dtype))``: generation with the trainer's model
    (KV cache, chunked prefill), recording what ``logprob_gap.gap`` compares."""

    def __init__(self, dtype: str, prefill_chunk: int):
        self.dtype, self.prefill_chunk = dtype, prefill_chunk
        self.records: list[dict] = []

    def __call__(self, prompts: list, trainer) -> dict:
        from yarnlib.integrations.trl_rollout import actor_logprobs, grouped

        started = time.perf_counter()
        reset_peak()
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        args = trainer.args
        prompt_ids = trainer._tokenize_prompts(prompts)[0]  # TRL's own templating/tokenizing
        completion_ids: list = [None] * len(prompt_ids)
        logprobs: list = [None] * len(prompt_ids)
        prompt_scores: list = [None] * len(prompt_ids)
        with autocast(self.dtype):
            for ids, indices in grouped(prompt_ids):
                scores, cache = prefill_logprobs(model, ids, self.prefill_chunk)
                found = sample(model, ids, cache, args.max_completion_length, len(indices),
                               args.temperature, trainer.processing_class.eos_token_id)  # fmt: skip
                del cache
                for index, (tokens, sampled) in zip(indices, found, strict=True):
                    completion_ids[index], logprobs[index] = tokens, sampled
                    prompt_scores[index] = scores
            generated = time.perf_counter()
            sequences = [p + c for p, c in zip(prompt_ids, completion_ids, strict=True)]
            actor = [actor_logprobs(model, s, len(p), args.temperature)
                     for s, p in zip(sequences, prompt_ids, strict=True)]  # fmt: skip
        model.train(was_training)
        self.records.append({
            "rollout_seconds": generated - started,
            "gap_seconds": time.perf_counter() - generated,
            "rollout_peak_mb": peak_mb(),
            "sequences": sequences,
            "prompt_lengths": [len(p) for p in prompt_ids],
            "rollout_logprobs": [p + c for p, c in zip(prompt_scores, logprobs, strict=True)],
            "actor_logprobs": actor,
        })  # fmt: skip
        reset_peak()  # what follows is TRL's update
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}


def completion_gap(record: dict) -> dict:
    """|Δ log p| of the sampled tokens only (all beyond L here): generation from the cache
    against the actor's forward, the ratio TRL's importance sampling would correct."""
    from yarnlib.vllm.check_rollout import stats

    deltas = [
        (torch.tensor(r[n - 1 :]) - a[n - 1 :]).abs()  # index i is the token at position i + 1
        for r, a, n in zip(record["rollout_logprobs"], record["actor_logprobs"],
                           record["prompt_lengths"], strict=True)
    ]  # fmt: skip
    return stats(torch.cat(deltas))


def planned(model_path: str, prompt: int, response: int, generations: int) -> dict:
    """``yarnlib plan --engine trl`` for the step's shapes on this device (no reference model:
    TRL's beta is 0)."""
    from yarnlib.cli import main as yarnlib_main

    memory = "80GiB"
    if torch.cuda.is_available():
        memory = f"{torch.cuda.get_device_properties(0).total_memory // 2**30}GiB"
    argv = ["plan", model_path, "--engine", "trl", "--prompt", str(prompt), "--response",
            str(response), "--gpus", "1", "--gpu-memory", memory, "--rollout-n",
            str(generations), "--attn", "sdpa", "--no-kl", "--json"]  # fmt: skip
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        yarnlib_main(argv)
    found = json.loads(text.getvalue())
    return {"argv": ["yarnlib", *argv], "phases_mb": {k: round(v / 2**20, 1) for k, v in
            found["phases"].items()}, "bytes_per_gpu": found["bytes_per_gpu"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2 or a model folder")
    p.add_argument("--factor", type=float, default=16.0)
    p.add_argument("--prompt-tokens", type=int, default=130000)
    p.add_argument("--completion-tokens", type=int, default=32)
    p.add_argument("--generations", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (TRL's bf16 autocast) or float32")
    p.add_argument("--prefill-chunk", type=int, default=8192, help="the rollout's prefill chunk")
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    from gpu_check import absent_on_gpu_machine  # benchmarks/, beside this script
    from transformers import AutoTokenizer

    import yarnlib.integrations.trl_rollout  # noqa: F401  (HFRollout's, before the check)
    from yarnlib import config
    from yarnlib.documents import DEFAULT_DATASET
    from yarnlib.integrations import knights_knaves, logprob_gap
    from yarnlib.integrations import trl as yarnlib_trl
    from yarnlib.models import resolve
    from yarnlib.spec_file import write_json

    # what this step's own code imports of what the GPU machine lacks (TRL then imports
    # datasets, carried as a wheel, and vLLM only where one is installed)
    ours = absent_on_gpu_machine()
    from datasets import Dataset
    from trl import GRPOTrainer

    source = resolve(args.model)
    spec = config.target_spec(source, "yarn", args.factor)
    cuda = torch.cuda.is_available()
    model_path, grpo_args = yarnlib_trl.apply(
        source, spec,
        dict(output_dir=str(args.output / "trainer"), use_cpu=not cuda,
             bf16=args.dtype == "bfloat16", max_steps=1,
             per_device_train_batch_size=args.generations, num_generations=args.generations,
             max_completion_length=args.completion_tokens, temperature=1.0,
             learning_rate=1e-6, gradient_checkpointing=True,
             model_init_kwargs={"dtype": "float32"}, logging_steps=1, report_to=[],
             save_strategy="no", seed=0),
        output=args.output / "model", max_prompt_length=args.prompt_tokens + SLACK,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    text = "\n\n".join(p.read_text() for p in sorted(DEFAULT_DATASET.glob("*.txt")))
    rows = knights_knaves.make_dataset(tokenizer, 1, 0, args.prompt_tokens, text)
    rollout = HFRollout(args.dtype, args.prefill_chunk)
    trainer = GRPOTrainer(
        model=model_path, reward_funcs=[knights_knaves.format_reward, knights_knaves.answer_reward],
        args=grpo_args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        rollout_func=rollout,
    )  # fmt: skip
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    update_peak = peak_mb()
    record = rollout.records[0]
    original = spec.original_max_position_embeddings
    log = next(e for e in trainer.state.log_history if "reward" in e)
    summary = {
        "model": args.model, "spec": spec.describe(), "dtype": args.dtype, "device":
            torch.cuda.get_device_name() if cuda else "cpu",
        "prompt_tokens": record["prompt_lengths"],
        "completion_tokens": [len(s) - n for s, n in
                              zip(record["sequences"], record["prompt_lengths"], strict=True)],
        "reward": log["reward"], "step_seconds": seconds,
        "rollout_seconds": record["rollout_seconds"], "gap_seconds": record["gap_seconds"],
        "gap": logprob_gap.gap(record["rollout_logprobs"], record["actor_logprobs"], original),
        "completion_gap": completion_gap(record),
        "peak_mb": {"rollout": record["rollout_peak_mb"], "update": update_peak},
        "absent_on_gpu_machine": ours,
        "rollout": f"HF: chunked prefill ({args.prefill_chunk}) into the KV cache, then sampling "
                   "from it; actor: one forward over the sequence",
    }  # fmt: skip
    write_json(args.output / "summary.json", summary)  # the measurement first: nothing after
    print(json.dumps({k: summary[k] for k in ("gap", "peak_mb", "step_seconds")}, indent=1))
    try:  # may lose it
        summary["plan"] = planned(model_path, max(record["prompt_lengths"]),
                                  args.completion_tokens, args.generations)  # fmt: skip
    except (Exception, SystemExit) as error:
        summary["plan"] = {"error": f"{type(error).__name__}: {error}"}
    write_json(args.output / "summary.json", summary)
    print("yarnlib plan:", summary["plan"].get("phases_mb") or summary["plan"]["error"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
