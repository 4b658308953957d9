"""Passkey retrieval: the landmark-attention prompt the YaRN paper uses, built to an exact token
length with the key at an exact depth, plus a harder variant with distractor keys.

Prompts are assembled from token ids (header, filler, key line, filler, question), so the
length and depth are exact for the tokenizer at hand; every method sees the same prompts.

Two layouts. ``independent`` (the default): every prompt is its own draw, with its own key,
its own stretch of a real text (the haystack) and its own depth, so a length's prompts are
independent trials and a rate has an honest interval. ``classic``: the prompts of a cell share
the classic filler and the depth, only the key differs (older results; the trials of a cell
are then nearly one draw).

Classic prompts start with the same header and filler up to their key, so a prompt reuses the
KV cache of the previous one for that common prefix (cells run by length, then depth) and
computes only the rest, in chunks. Attention is causal, so the answer is the one of a full
forward, up to float rounding. Where the tables depend on the length (dynamic methods), only
prompts of one length share, with the scale fixed at prompt + new tokens as ``generate`` does.
Independent prompts share only the header, too short to reuse: each is a full forward.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from yarnlib.documents import DEFAULT_DATASET, load_documents
from yarnlib.eval.measure import Meter
from yarnlib.eval.methods import Method, apply_method, scaling_fields
from yarnlib.eval.stats import rate_fields
from yarnlib.eval.store import CELLS, CellStore, content_id
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


def classic_filler(tokenizer, count: int, offset: int = 0) -> list[int]:
    """``count`` tokens of the classic sentences repeated, from ``offset`` tokens in."""
    unit = len(_ids(tokenizer, FILLER + " "))
    repeats = (count + offset) // max(unit, 1) + 2
    return _ids(tokenizer, " ".join([FILLER] * repeats))[offset : offset + count]


def build_prompt(tokenizer, length: int, depth: float, seed, distractors: int = 0) -> Prompt:
    """A prompt of exactly ``length`` tokens whose key line starts ``depth`` of the way through
    the filler (0: right after the instructions, 1: right before the question): the classic
    filler from its start; only the seed's keys (and decoys' places) differ between seeds."""
    check_distractors(distractors)
    rng = random.Random(str(seed))
    keys = rng.sample(range(10000, 100000), distractors + 1)
    return assemble(tokenizer, length, depth, keys, rng, lambda n: classic_filler(tokenizer, n))


def assemble(tokenizer, length: int, depth: float, keys: list[int], rng, filler_of) -> Prompt:
    """Header, ``filler_of(n)`` (n tokens) with the key line of ``keys[0]`` at ``depth`` and
    decoy lines of ``keys[1:]`` at places drawn from ``rng``, question: ``length`` tokens."""
    if not 0 <= depth <= 1:
        raise ValueError(f"depth must be in [0, 1], got {depth!r}")
    distractors = len(keys) - 1
    check_distractors(distractors)
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
    filler = filler_of(n_filler)
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


LAYOUTS = ("independent", "classic")


def load_haystack(tokenizer, sources: list[str] | None) -> list[int]:
    """The token ids of the haystack documents (default: the packaged plays) one after the
    other, each followed by a blank line: the text independent prompts cut their filler from."""
    try:
        docs = load_documents(sources)
    except ValueError as error:  # the same checks as a dataset, named as the option
        raise ValueError(str(error).replace("dataset:", "haystack:", 1)) from None
    texts = [text for _, text in docs if text.strip()]  # a blank one adds only blank lines
    if not texts:  # checked before the blank lines are appended, which would pass for text
        named = ", ".join(sources or [str(DEFAULT_DATASET)])
        raise ValueError(
            f"haystack: {named} holds no text (empty or whitespace only); allowed: files with text"
        )
    ids: list[int] = []
    for text in texts:
        ids += _ids(tokenizer, text + "\n\n")
    return ids


CELL_KEYS = ("method", "length", "depth")


def cell_store(output, settings: dict, layout, resume: bool, report: bool, **options) -> CellStore:
    """The cells of a passkey run. A haystack of text keys them on its tokens
    (``haystack_tokens``), not only its path: after the file changes, ``--resume`` draws the
    trials again from the new text instead of pooling those cut from the old one. Cells keyed
    on the path alone (written before) cannot tell whether the text changed since: ``--report``
    (which computes nothing) still reads them as they are, a resumed computation refuses them."""
    if layout is None or layout.haystack is None:  # the classic sentences: no file to change
        return CellStore(output, CELL_KEYS, settings, resume, **options)
    keyed = {**settings, "haystack_tokens": content_id([torch.tensor(layout.haystack)])}
    if report:
        return CellStore(output, CELL_KEYS, keyed, resume, aliases=(settings,), **options)
    if resume and (old := CellStore(output, CELL_KEYS, settings, True, **options).done):
        named = ", ".join(settings["haystack"] or ["the packaged plays"])
        raise ValueError(
            f"resume: {Path(output) / CELLS} holds {len(old)} cells keyed on the haystack's path "
            f"alone (written before passkey keyed them on its text), which cannot tell whether "
            f"{named} changed since; allowed: --report to read them as they are, or a run "
            "without --resume (or another --output) to draw them again"
        )
    return CellStore(output, CELL_KEYS, keyed, resume, **options)


def cut(haystack: list[int], offset: int, count: int) -> list[int]:
    """``count`` tokens of ``haystack`` from ``offset`` on, wrapping round at its end."""
    return list(itertools.islice(itertools.cycle(haystack), offset, offset + count))


@dataclass(frozen=True)
class Independent:
    """Prompts as independent draws: per length ``trials`` prompts, each with its own key, its
    own filler offset in the haystack (None: the classic sentences, whose offsets differ only
    within their period), its own depth. The depth range [low, high] is cut into ``bins``
    equal bins, one cell each; trial t goes to bin t mod bins, and the depths of a bin's
    trials are stratified over it (one uniform draw in each of its equal slices)."""

    haystack: list[int] | None
    low: float = 0.0
    high: float = 1.0
    bins: int = 3

    def __post_init__(self):
        if not 0 <= self.low <= self.high <= 1:
            raise ValueError(f"depths: [{self.low}, {self.high}]; allowed: 0 <= low <= high <= 1")
        if self.bins < 1:
            raise ValueError(f"depth_bins must be a positive integer, got {self.bins!r}")
        if self.low == self.high and self.bins != 1:  # one depth: one cell
            object.__setattr__(self, "bins", 1)

    def edges(self, b: int) -> tuple[float, float]:
        width = (self.high - self.low) / self.bins
        return self.low + b * width, self.low + (b + 1) * width

    def cell_depths(self) -> list[float]:
        """The cells' depth keys: each bin's centre."""
        return [round(sum(self.edges(b)) / 2, 6) for b in range(self.bins)]

    def bin_of(self, depth: float) -> int:
        return self.cell_depths().index(depth)

    def period(self, tokenizer) -> int:
        if self.haystack is None:
            return len(_ids(tokenizer, FILLER + " "))
        return len(self.haystack)

    def draws(self, tokenizer, length: int, trials: int, seed) -> list[tuple[int, int, float]]:
        """(key, filler offset, depth) of every trial of ``length``: the same for every method.
        Keys, and offsets where the haystack is long enough, are drawn without replacement."""
        rng = random.Random(f"independent:{seed}:{length}")
        keys = rng.sample(range(10000, 100000), trials)
        period = self.period(tokenizer)
        if period >= trials:
            offsets = rng.sample(range(period), trials)
        else:
            offsets = [rng.randrange(period) for _ in range(trials)]
        out = []
        for t in range(trials):
            b, j = t % self.bins, t // self.bins
            lo, hi = self.edges(b)
            count = len(range(b, trials, self.bins))
            out.append((keys[t], offsets[t], lo + (hi - lo) * (j + rng.random()) / count))
        return out

    def prompts(self, tokenizer, length, depth, trials, seed, distractors):
        """(trial, draw fields, builder) of the trials in the cell of ``depth`` (a bin centre)."""
        b = self.bin_of(depth)
        draws = self.draws(tokenizer, length, trials, seed)
        out = []
        for t in range(b, trials, self.bins):
            key, offset, placed = draws[t]
            out.append((t, {"prompt_depth": placed, "offset": offset}, self.builder(
                tokenizer, length, placed, key, offset, f"{seed}:{length}:{t}", distractors
            )))  # fmt: skip
        return out

    def builder(self, tokenizer, length, depth, key, offset, seed_text, distractors):
        def build() -> Prompt:
            rng = random.Random(f"independent:{seed_text}")
            decoys = [k for k in rng.sample(range(10000, 100000), distractors + 1) if k != key]
            if self.haystack is None:
                filler_of = lambda n: classic_filler(tokenizer, n, offset)  # noqa: E731
            else:
                filler_of = lambda n: cut(self.haystack, offset, n)  # noqa: E731
            return assemble(tokenizer, length, depth, [key, *decoys[:distractors]], rng, filler_of)

        return build


def classic_prompts(tokenizer, length, depth, trials, seed, distractors):
    """(trial, draw fields, builder) of a classic cell: one depth, the seed's keys."""
    return [
        (t, {}, functools.partial(
            build_prompt, tokenizer, length, depth, f"{seed}:{length}:{depth}:{t}", distractors
        ))
        for t in range(trials)
    ]  # fmt: skip


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
    layout: Independent | None = None,
    max_trials: int | None = None,
) -> list[tuple]:
    """Compute every missing (method, length, depth) cell into ``store``; returns those computed.
    Classic layout (``layout`` None): ``trials`` prompts per depth of ``depths``. Independent
    ``layout``: ``trials`` prompts per length over its depth bins (``depths`` is ignored; the
    cells are keyed by the bins' centres).
    ``share_prefixes=False`` runs every prompt in full (the reference for the shared path).
    ``trial_store`` (keys method, length, depth, trial) holds each finished trial, so a run
    killed inside a cell (tens of minutes at 32k on a CPU) resumes from its last trial.
    ``max_trials``: stop after that many new prompts (into ``trial_store``), taking the cells
    with the fewest finished prompts first, so that a run cut into pieces fills the cells (and
    rows, one invocation each) evenly."""
    if layout is not None:
        depths = layout.cell_depths()
    cells = [
        (m, n, d)
        for m in methods
        for n in lengths
        for d in depths
        if not store.has(method=m.label, length=n, depth=d)
    ]
    order = {m: i for i, m in enumerate(methods)}
    cells.sort(key=lambda c: (order[c[0]], c[1], c[2]))  # keys deeper and deeper: longer reuse
    prompts_of = classic_prompts if layout is None else layout.prompts
    cell_prompts = {(n, d): prompts_of(tokenizer, n, d, trials, seed, distractors)
                    for _, n, d in cells}  # fmt: skip
    if max_trials is not None:
        if trial_store is None:
            raise ValueError("max_trials needs a trial_store to keep the prompts it computes")

        def finished(cell):
            m, n, d = cell
            return sum(trial_store.has(method=m.label, length=n, depth=d, trial=t)
                       for t, _, _ in cell_prompts[n, d])  # fmt: skip

        cells.sort(key=finished)  # stable: the order above among equals
    if max_cells is not None:
        cells = cells[:max_cells]
    computed = []
    device = next(model.parameters()).device
    budget = max_trials
    total = sum(n * len(cell_prompts[n, d]) for _, n, d in cells)
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
            prompts = cell_prompts[n, d]
            with Meter(device) as meter:
                for trial, drawn, build in prompts:
                    key = dict(method=m.label, length=n, depth=d, trial=trial)
                    if trial_store is not None and trial_store.has(**key):
                        done = trial_store.done[trial_store.key(key)]
                        results.append({f: done[f] for f in (*drawn, "key", "answer", "text")})
                        resumed += 1
                    else:
                        if budget is not None and budget <= 0:
                            break
                        prompt = build()
                        text = answer(model, tokenizer, prompt, max_new_tokens, cache)
                        result = {**drawn, "key": prompt.key, "answer": parse_answer(text),
                                  "text": text}  # fmt: skip
                        results.append(result)
                        if trial_store is not None:
                            trial_store.add(
                                {**result, **key}
                            )  # the key last: no field may shadow it
                        if budget is not None:
                            budget -= 1
                    bar.update(n)
            if len(results) < len(prompts):  # max_trials spent inside this cell
                break
            correct = sum(r["answer"] == r["key"] for r in results)
            where = {}
            if layout is not None:  # the cell's bin of depths
                low, high = layout.edges(layout.bin_of(d))
                where = {"depth_low": low, "depth_high": high}
            store.add(
                {
                    "method": m.label,
                    **scaling_fields(model, m),
                    "length": n,
                    "depth": d,
                    **where,
                    **rate_fields(correct, len(prompts)),
                    "distractors": distractors,
                    "answers": results,
                    "reused_prompt_tokens": (cache.reused if cache is not None else 0) - reused,
                    "resumed_trials": resumed,  # taken from trial_store: not in the timing
                    **meter.fields(n * (len(prompts) - resumed)),
                }
            )
            computed.append((m.label, n, d))
    apply_method(model, Method("none", 1.0))
    return computed


def by_length(records: list[dict]) -> list[dict]:
    """Per (method, length): the trials of all its cells pooled, with the Wilson interval (the
    draws of an independent layout are independent across its cells too)."""
    pooled: dict[tuple, list[int]] = {}
    for r in records:
        counts = pooled.setdefault((r["method"], r["length"]), [0, 0])
        counts[0] += r["correct"]
        counts[1] += r["trials"]
    return [
        {"method": m, "length": n, **rate_fields(correct, trials)}
        for (m, n), (correct, trials) in pooled.items()
    ]
