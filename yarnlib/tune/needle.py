"""The retrieval objectives of ``yarnlib tune`` (``--objective needle|mix``).

A needle window is a calibration window of exactly N tokens with K key lines ("The red key is
12345. Remember it.") placed at depths spread over its text, and at its end the K questions,
each followed by its answer ("What is the red key? The red key is 12345."). The needle NLL is
the mean NLL of the answer tokens: they can only be predicted by retrieving a key up to N
tokens back, most of them farther back than the original context L. As in LongRoPE2 (arXiv
2502.20082), this scores what the mean NLL of text beyond L does not: local prediction
dominates that mean, and a table can lower it while losing long-range retrieval (SmolLM2 at
32k: docs/results.md). ``mix`` weighs both in one forward: (1 - w) x the NLL of the window's
other tokens at positions >= L, plus w x the needle NLL.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

import yarnlib
from yarnlib.eval.perplexity import token_nlls
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import patch_arguments

NAMES = ("red", "blue", "green", "gold", "grey", "white", "black", "brown")
KEY_LINE = "\nThe {name} key is {key}. Remember it.\n"
QUESTION = "\nWhat is the {name} key? The {name} key is"
ANSWER = " {key}"
END = "."


@dataclass
class NeedleWindow:
    input_ids: torch.Tensor  # [N]
    answers: list[int]  # positions of the answer tokens
    keys: list[int]
    key_starts: list[int]  # where each key line starts (in the order of ``keys``)


def check_needles(needles: int) -> None:
    if not 1 <= needles <= len(NAMES):
        raise ValueError(f"needles: {needles!r}; allowed: an integer in [1, {len(NAMES)}]")


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def needle_window(tokenizer, text_ids: list[int], length: int, needles: int, seed) -> NeedleWindow:
    """``length`` tokens: the start of ``text_ids`` with key line k at depth (k + 1/2) / K of
    the text, then the questions in a seeded order, each with its answer."""
    check_needles(needles)
    rng = random.Random(f"needle:{seed}")
    names = rng.sample(NAMES, needles)
    keys = rng.sample(range(10000, 100000), needles)
    lines = [
        _ids(tokenizer, KEY_LINE.format(name=n, key=k)) for n, k in zip(names, keys, strict=True)
    ]
    asked = rng.sample(range(needles), needles)
    tail, answers = [], []
    for i in asked:
        tail += _ids(tokenizer, QUESTION.format(name=names[i]))
        answer = _ids(tokenizer, ANSWER.format(key=keys[i]))
        answers.append((len(tail), len(answer)))
        tail += answer + _ids(tokenizer, END)
    n_text = length - sum(map(len, lines)) - len(tail)
    if n_text < needles or len(text_ids) < n_text:
        raise ValueError(
            f"length: a needle window of {length} tokens needs {n_text} tokens of text, the "
            f"sample has {len(text_ids)}; allowed: samples and lengths that leave room for text"
        )
    ids, position, starts = [], 0, []
    for k, line in enumerate(lines):
        offset = round((k + 0.5) / needles * n_text)
        ids += text_ids[position:offset]
        position = offset
        starts.append(len(ids))
        ids += line
    ids += text_ids[position:n_text]
    base = len(ids)
    ids += tail
    positions = [base + start + j for start, count in answers for j in range(count)]
    return NeedleWindow(torch.tensor(ids), positions, keys, starts)


def needle_windows(tokenizer, samples: list[torch.Tensor], needles: int, prefix: str = ""):
    """One needle window per sample, of the sample's length (keys seeded by its index)."""
    return [
        needle_window(tokenizer, ids.tolist(), len(ids), needles, f"{prefix}{i}")
        for i, ids in enumerate(samples)
    ]


@torch.no_grad()
def needle_objective(
    model, windows: list[NeedleWindow], spec: RopeScaling, original: int, weight: float | None
) -> dict:
    """``objective``: the needle NLL (``weight`` None) or the ``mix``; with the needle NLL,
    the NLL of the other tokens beyond and within L beside it."""
    yarnlib.patch(model, **patch_arguments(spec))
    answers, beyond, within = [], [], []
    for window in windows:
        nll = token_nlls(model, window.input_ids).double()
        is_answer = torch.zeros(nll.shape[0], dtype=torch.bool)
        is_answer[window.answers] = True
        answers.append(nll[is_answer])
        beyond.append(nll[original:][~is_answer[original:]])
        within.append(nll[1:original][~is_answer[1:original]])
    needle = float(torch.cat(answers).mean())
    text = float(torch.cat(beyond).mean())
    return {
        "objective": needle if weight is None else (1 - weight) * text + weight * needle,
        "needle_nll": needle,
        "nll_beyond_original": text,
        "nll_within_original": float(torch.cat(within).mean()),
        "answer_tokens": sum(len(a) for a in answers),
    }
