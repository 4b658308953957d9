"""Passkey retrieval: the landmark-attention prompt the YaRN paper uses, built to an exact token
length with the key at an exact depth, plus a harder variant with distractor keys.

Prompts are assembled from token ids (header, filler, key line, filler, question), so the
length and depth are exact for the tokenizer at hand; every method sees the same prompts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from yarnlib.eval.measure import Meter
from yarnlib.eval.methods import Method, apply_method
from yarnlib.eval.store import CellStore

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there.\n"
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_LINE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
DISTRACTOR_LINE = "\nThe {name} key is {key}. Remember it. {key} is the {name} key.\n"
DISTRACTOR_NAMES = ("spare", "old", "backup", "side", "gate", "garage", "office", "locker")
QUESTION = "\nWhat is the pass key? The pass key is"


@dataclass
class Prompt:
    input_ids: list[int]
    key: int
    key_start: int  # token index where the key line starts
    filler_tokens: int
    header_tokens: int


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_distractors(distractors: int) -> None:
    if not 0 <= distractors <= len(DISTRACTOR_NAMES):
        raise ValueError(
            f"distractors must be an integer in [0, {len(DISTRACTOR_NAMES)}], got {distractors!r}"
        )


def min_length(tokenizer, distractors: int = 0) -> int:
    """The shortest prompt possible (no filler at all)."""
    check_distractors(distractors)
    line = _ids(tokenizer, KEY_LINE.format(key=99999))
    extra = len(_ids(tokenizer, DISTRACTOR_LINE.format(name="garage", key=99999)))
    return (
        len(_ids(tokenizer, TASK))
        + len(line)
        + distractors * extra
        + len(_ids(tokenizer, QUESTION))
    )


def build_prompt(tokenizer, length: int, depth: float, seed, distractors: int = 0) -> Prompt:
    """A prompt of exactly ``length`` tokens whose key line starts ``depth`` of the way through
    the filler (0: right after the instructions, 1: right before the question)."""
    if not 0 <= depth <= 1:
        raise ValueError(f"depth must be in [0, 1], got {depth!r}")
    check_distractors(distractors)
    rng = random.Random(str(seed))
    keys = rng.sample(range(10000, 100000), distractors + 1)
    header, question = _ids(tokenizer, TASK), _ids(tokenizer, QUESTION)
    key_ids = _ids(tokenizer, KEY_LINE.format(key=keys[0]))
    names = rng.sample(DISTRACTOR_NAMES, distractors)
    extra = [
        _ids(tokenizer, DISTRACTOR_LINE.format(name=n, key=k))
        for n, k in zip(names, keys[1:], strict=True)
    ]
    n_filler = length - len(header) - len(key_ids) - len(question) - sum(map(len, extra))
    if n_filler < 0:
        shortest = length - n_filler
        raise ValueError(f"length must be >= {shortest} tokens for this prompt, got {length}")
    unit = len(_ids(tokenizer, FILLER + " "))
    filler = _ids(tokenizer, " ".join([FILLER] * (n_filler // max(unit, 1) + 2)))[:n_filler]
    # (offset in the filler, ids): distractors at random depths, the key at the requested one
    inserts = [(rng.randint(0, n_filler), ids) for ids in extra]
    key_offset = round(depth * n_filler)
    inserts.append((key_offset, key_ids))
    inserts.sort(key=lambda item: (item[0], item[1] is not key_ids))
    ids, position, key_start = list(header), 0, 0
    for offset, piece in inserts:
        ids += filler[position:offset]
        position = offset
        if piece is key_ids:
            key_start = len(ids)
        ids += piece
    ids += filler[position:] + question
    return Prompt(ids, keys[0], key_start, n_filler, len(header))


ANSWER = re.compile(r"\d(?:[\d,_ ]*\d)?")


def parse_answer(text: str) -> int | None:
    """The first number in a generated answer ("12345.", " 12,345", "is 12345 and"), or None."""
    match = ANSWER.search(text)
    if match is None:
        return None
    return int(re.sub(r"[,_ ]", "", match.group()))


@torch.no_grad()
def answer(model, tokenizer, prompt: Prompt, max_new_tokens: int = 8) -> str:
    """Greedy decoding of a few tokens after the prompt."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt.input_ids], device=device)
    output = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
    )
    return tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True)


def run_passkey(
    model,
    tokenizer,
    methods: list[Method],
    lengths: list[int],
    depths: list[float],
    trials: int,
    store: CellStore,
    seed: int = 0,
    distractors: int = 0,
    max_new_tokens: int = 8,
    max_cells: int | None = None,
) -> list[tuple]:
    """Compute every missing (method, length, depth) cell into ``store``; returns those computed."""
    cells = [
        (m, n, d)
        for m in methods
        for n in lengths
        for d in depths
        if not store.has(method=m.label, length=n, depth=d)
    ]
    if max_cells is not None:
        cells = cells[:max_cells]
    computed = []
    device = next(model.parameters()).device
    total = sum(n for _, n, _ in cells) * trials
    with tqdm(total=total, unit="tok", unit_scale=True, desc="passkey") as bar:
        for m, n, d in cells:
            apply_method(model, m)
            bar.set_postfix_str(f"{m.label} @ {n}, depth {d:.0%}")
            results = []
            with Meter(device) as meter:
                for trial in range(trials):
                    prompt = build_prompt(tokenizer, n, d, f"{seed}:{n}:{d}:{trial}", distractors)
                    text = answer(model, tokenizer, prompt, max_new_tokens)
                    results.append({"key": prompt.key, "answer": parse_answer(text), "text": text})
                    bar.update(n)
            correct = sum(r["answer"] == r["key"] for r in results)
            store.add(
                {
                    "method": m.label,
                    "scaling": m.method,
                    "factor": m.factor,
                    "length": n,
                    "depth": d,
                    "accuracy": correct / trials,
                    "correct": correct,
                    "trials": trials,
                    "distractors": distractors,
                    "answers": results,
                    **meter.fields(n * trials),
                }
            )
            computed.append((m.label, n, d))
    apply_method(model, Method("none", 1.0))
    return computed
