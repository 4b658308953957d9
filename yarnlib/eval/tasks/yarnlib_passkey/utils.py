"""Data and scoring for the ``yarnlib_passkey`` lm-eval task (prompts from yarnlib.eval.passkey)."""

from __future__ import annotations

import datasets
from transformers import AutoTokenizer

import yarnlib.eval.lm_eval_model  # noqa: F401  (loading this task makes --model yarnlib known)
from yarnlib.eval.passkey import build_prompt, parse_answer
from yarnlib.models import resolve


def passkey_dataset(
    pretrained=None,
    tokenizer=None,
    max_seq_lengths=(4096,),
    depths=(0.1, 0.5, 0.9),
    trials=5,
    distractors=0,
    seed=0,
    **_,
):
    """One row per (length, depth, trial); the tokenizer sizes prompts to exact token lengths."""
    name = tokenizer or pretrained
    if not isinstance(name, str):
        raise ValueError("metadata: yarnlib_passkey needs pretrained= or tokenizer= (a name)")
    tok = AutoTokenizer.from_pretrained(resolve(name))
    rows = []
    for length in max_seq_lengths:
        for depth in depths:
            for trial in range(trials):
                trial_seed = f"{seed}:{length}:{depth}:{trial}"
                prompt = build_prompt(tok, length, depth, trial_seed, distractors)
                rows.append(
                    {
                        "input": tok.decode(prompt.input_ids),
                        "answer": str(prompt.key),
                        "length": length,
                        "depth": depth,
                    }
                )
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def process_results(doc, results):
    return {"acc": float(parse_answer(results[0]) == int(doc["answer"]))}
