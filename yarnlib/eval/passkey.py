"""Passkey retrieval: the landmark-attention prompt the YaRN paper uses, built to an exact token
length with the key at an exact depth, plus a harder variant with distractor keys.

Prompts are assembled from token ids (header, filler, key line, filler, question), so the
length and depth are exact for the tokenizer at hand; every method sees the same prompts.

Every prompt starts with the same header and filler up to its key, so a method whose rotary
tables do not depend on the length reuses the KV cache of the previous prompt for that common
prefix (cells run in the order of their key position): only the rest is computed, in chunks.
Attention is causal, so the answer is the one of a full forward, up to float rounding. The
dynamic methods scale by the whole prompt's length and always run each prompt in full.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from yarnlib.eval.measure import Meter
from yarnlib.eval.methods import Method, apply_method
from yarnlib.eval.store import CellStore
from yarnlib.patches.patch import patch_state
from yarnlib.spec import RopeScaling

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


# Tokens per forward after a reused prefix: such a forward attends through an explicit mask
# (no causal block skipping), so the masked triangle of each chunk is computed for nothing.
CHUNK = 2048


class PromptCache:
    """The KV cache of the prompt a model answered last, for the next prompt's common prefix."""

    def __init__(self):
        self.ids: list[int] = []
        self.kv = DynamicCache()
        self.reused = 0  # prompt tokens taken from the cache instead of computed

    def prefix(self, ids: list[int]) -> int:
        """Crop the cache to its common prefix with ``ids`` (at least the last token of ``ids``
        is left to compute) and return that prefix's length."""
        n = 0
        for a, b in zip(self.ids, ids[:-1], strict=False):
            if a != b:
                break
            n += 1
        self.kv.crop(n)
        self.ids = self.ids[:n]
        self.reused += n
        return n


def shares_prefixes(model) -> bool:
    """Whether the rotary tables ``model`` runs are the same at every length."""
    state = patch_state(model)
    spec = state.spec if state is not None else RopeScaling.from_hf(model.config)
    return not spec.tables_depend_on_length


@torch.no_grad()
def prefill(model, ids: list[int], cache: PromptCache) -> torch.Tensor:
    """Logits of the last token of ``ids``, computing only what follows its common prefix with
    ``cache``; the cache then holds ``ids``."""
    device = next(model.parameters()).device
    begin = cache.prefix(ids)
    step = len(ids) if begin == 0 else CHUNK  # from 0: one causal forward
    for start in range(begin, len(ids), step):
        chunk = torch.tensor([ids[start : start + step]], device=device)
        out = model(input_ids=chunk, past_key_values=cache.kv, use_cache=True, logits_to_keep=1)
    cache.ids = list(ids)
    return out.logits[0, -1]


@torch.no_grad()
def answer(model, tokenizer, prompt: Prompt, max_new_tokens=8, cache: PromptCache | None = None):
    """Greedy decoding of a few tokens after the prompt; with ``cache``, the prompt's common
    prefix with the previous one is taken from it (decoded tokens land in the cache beyond the
    prompt, and the next ``prefix`` crops them)."""
    if cache is None:
        return _generate(model, tokenizer, prompt, max_new_tokens)
    device = next(model.parameters()).device
    logits = prefill(model, prompt.input_ids, cache)
    stop = _eos_ids(model, tokenizer)
    new = [int(logits.argmax())]
    while new[-1] not in stop and len(new) < max_new_tokens:
        step = torch.tensor([[new[-1]]], device=device)
        logits = model(input_ids=step, past_key_values=cache.kv, use_cache=True).logits[0, -1]
        new.append(int(logits.argmax()))
    return tokenizer.decode(new, skip_special_tokens=True)


def _eos_ids(model, tokenizer) -> set[int]:
    """The tokens ``generate`` stops at: the generation config's, else the tokenizer's."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    return set(eos if isinstance(eos, list) else [eos]) - {None}


def _generate(model, tokenizer, prompt: Prompt, max_new_tokens: int) -> str:
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


def key_order(tokenizer, cell: tuple, distractors: int) -> tuple[float, int]:
    """Where a cell's key sits: cells in this order share the longest prefixes."""
    _, n, d = cell
    return d * (n - min_length(tokenizer, distractors)), n


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
    share_prefixes: bool = True,
) -> list[tuple]:
    """Compute every missing (method, length, depth) cell into ``store``; returns those computed.
    ``share_prefixes=False`` runs every prompt in full (the reference for the shared path)."""
    cells = [
        (m, n, d)
        for m in methods
        for n in lengths
        for d in depths
        if not store.has(method=m.label, length=n, depth=d)
    ]
    order = {m: i for i, m in enumerate(methods)}
    cells.sort(key=lambda c: (order[c[0]], *key_order(tokenizer, c, distractors)))
    if max_cells is not None:
        cells = cells[:max_cells]
    computed = []
    device = next(model.parameters()).device
    total = sum(n for _, n, _ in cells) * trials
    cache, running = None, None
    with tqdm(total=total, unit="tok", unit_scale=True, desc="passkey") as bar:
        for m, n, d in cells:
            if m != running:
                apply_method(model, m)
                running = m
                cache = PromptCache() if share_prefixes and shares_prefixes(model) else None
            bar.set_postfix_str(f"{m.label} @ {n}, depth {d:.0%}")
            results = []
            reused = cache.reused if cache is not None else 0
            with Meter(device) as meter:
                for trial in range(trials):
                    prompt = build_prompt(tokenizer, n, d, f"{seed}:{n}:{d}:{trial}", distractors)
                    text = answer(model, tokenizer, prompt, max_new_tokens, cache)
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
                    "reused_prompt_tokens": (cache.reused if cache is not None else 0) - reused,
                    **meter.fields(n * trials),
                }
            )
            computed.append((m.label, n, d))
    apply_method(model, Method("none", 1.0))
    return computed
