"""Passkey retrieval: the landmark-attention prompt the YaRN paper uses, built to an exact token
length with the key at an exact depth, plus a harder variant with distractor keys.

Prompts are assembled from token ids (header, filler, key line, filler, question), so the
length and depth are exact for the tokenizer at hand; every method sees the same prompts.

Every prompt starts with the same header and filler up to its key, so a prompt reuses the KV
cache of the previous one for that common prefix (cells run by length, then depth) and
computes only the rest, in chunks. Attention is causal, so the answer is the one of a full
forward, up to float rounding. Where the tables depend on the length (dynamic methods), only
prompts of one length share, with the scale fixed at prompt + new tokens as ``generate`` does.
"""

from __future__ import annotations

import contextlib
import random
import re
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from yarnlib.eval.measure import Meter
from yarnlib.eval.methods import Method, apply_method
from yarnlib.eval.store import CellStore
from yarnlib.patches.patch import declare_length, patch_state
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


TRIALS = "passkey_trials.jsonl"  # one line per finished trial, beside the cells

# Tokens per forward after a reused prefix: such a forward attends through an explicit mask
# (no causal block skipping), so the masked triangle of each chunk is computed for nothing.
CHUNK = 2048
# A shorter common prefix is recomputed: the masked attention after it would cost more than
# the causal kernel's single pass saves (on CPU a masked key costs about 1.2x a causal one).
MIN_REUSE = 0.25


class PromptCache:
    """The KV cache of the prompt a model answered last, for the next prompt's common prefix.
    ``same_length_only``: the model's tables depend on the length (dynamic methods), so only
    a prompt of the same length may reuse it."""

    def __init__(self, same_length_only: bool = False):
        self.same_length_only = same_length_only
        self.ids: list[int] = []
        self.kv = DynamicCache()
        self.reused = 0  # prompt tokens taken from the cache instead of computed

    def prefix(self, ids: list[int]) -> int:
        """Crop the cache to the prefix ``ids`` reuses (their common prefix, leaving at least
        the last token of ``ids`` to compute; none if too short) and return its length."""
        n = 0
        if not (self.same_length_only and len(ids) != len(self.ids)):
            for a, b in zip(self.ids, ids[:-1], strict=False):
                if a != b:
                    break
                n += 1
        if n < MIN_REUSE * len(ids):
            n = 0
        surplus = self.kv.get_seq_length() - n  # decoded tokens included
        if n == 0:
            self.kv = DynamicCache()
        elif surplus > 0:
            self.kv.crop(-surplus)  # a count from the end: what transformers 4.5x and 5.x share
        self.ids = self.ids[:n]
        self.reused += n
        return n


def tables_depend_on_length(model) -> bool:
    """Whether the rotary tables ``model`` runs change with the sequence length."""
    state = patch_state(model)
    spec = state.spec if state is not None else RopeScaling.from_hf(model.config)
    return spec.tables_depend_on_length


def declared(model, length: int):
    """A dynamic method patched by yarnlib fixes its scale at ``length`` (as ``generate`` does
    for prompt + max_new_tokens), so every prompt of one length shares one set of tables."""
    state = patch_state(model)
    if state is None or not state.spec.is_dynamic:
        return contextlib.nullcontext()
    return declare_length(model, length)


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
    stop = _eos_ids(model, tokenizer)
    with declared(model, len(prompt.input_ids) + max_new_tokens):
        logits = prefill(model, prompt.input_ids, cache)
        new = [int(logits.argmax())]
        while new[-1] not in stop and len(new) < max_new_tokens:
            step = torch.tensor([[new[-1]]], device=device)
            logits = model(input_ids=step, past_key_values=cache.kv, use_cache=True).logits
            new.append(int(logits[0, -1].argmax()))
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
    trial_store: CellStore | None = None,
) -> list[tuple]:
    """Compute every missing (method, length, depth) cell into ``store``; returns those computed.
    ``share_prefixes=False`` runs every prompt in full (the reference for the shared path).
    ``trial_store`` (keys method, length, depth, trial) holds each finished trial, so a run
    killed inside a cell (tens of minutes at 32k on a CPU) resumes from its last trial."""
    cells = [
        (m, n, d)
        for m in methods
        for n in lengths
        for d in depths
        if not store.has(method=m.label, length=n, depth=d)
    ]
    order = {m: i for i, m in enumerate(methods)}
    cells.sort(key=lambda c: (order[c[0]], c[1], c[2]))  # keys deeper and deeper: longer reuse
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
                cache = None
                if share_prefixes:
                    cache = PromptCache(same_length_only=tables_depend_on_length(model))
            bar.set_postfix_str(f"{m.label} @ {n}, depth {d:.0%}")
            results, resumed = [], 0
            reused = cache.reused if cache is not None else 0
            with Meter(device) as meter:
                for trial in range(trials):
                    key = dict(method=m.label, length=n, depth=d, trial=trial)
                    if trial_store is not None and trial_store.has(**key):
                        done = trial_store.done[trial_store.key(key)]
                        results.append({f: done[f] for f in ("key", "answer", "text")})
                        resumed += 1
                    else:
                        seed_text = f"{seed}:{n}:{d}:{trial}"
                        prompt = build_prompt(tokenizer, n, d, seed_text, distractors)
                        text = answer(model, tokenizer, prompt, max_new_tokens, cache)
                        result = {"key": prompt.key, "answer": parse_answer(text), "text": text}
                        results.append(result)
                        if trial_store is not None:
                            trial_store.add({**key, **result})
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
                    "resumed_trials": resumed,  # taken from trial_store: not in the timing
                    **meter.fields(n * (trials - resumed)),
                }
            )
            computed.append((m.label, n, d))
    apply_method(model, Method("none", 1.0))
    return computed
