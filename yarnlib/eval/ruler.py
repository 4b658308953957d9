"""RULER (Hsieh et al., 2024) through lm-eval's own task files, offline, on a scaled model.

lm-eval 0.4.13 ships RULER's tasks in ``lm_eval/tasks/ruler/``. Their prompts are generated
for the model's tokenizer at run time, and three kinds of source feed them:

* ``synthetic``: noise sentences, generated needles, variable chains and words
  (``niah_single_1``, ``niah_multikey_2/3``, ``ruler_vt``, ``ruler_cwe``, ``ruler_fwe``): run
  exactly as lm-eval defines them.
* ``essay``: Paul Graham's essays, fetched from the network (``niah_single_2/3``,
  ``niah_multikey_1``, ``niah_multivalue``, ``niah_multiquery``): run with lm-eval's generator
  and parameters, the essays replaced by a local haystack (the packaged plays by default).
* ``qa``: SQuAD / HotpotQA dev files, fetched from the network: run only when the file lies in
  ``--qa-dir``.

Each cell (row, task, length) builds its task with its own seed, so its prompts do not depend
on which other cells ran before it (a resumed run answers the same prompts), and is scored by
the task's own ``process_results`` through ``lm_eval.evaluator.evaluate``.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from yarnlib import atomic
from yarnlib.documents import DEFAULT_DATASET, load_documents
from yarnlib.eval.stats import wilson
from yarnlib.models import cache_dir

SYNTHETIC = "synthetic"
ESSAY = "essay"
QA = "qa"
SOURCES = {
    "niah_single_1": SYNTHETIC,
    "niah_single_2": ESSAY,
    "niah_single_3": ESSAY,
    "niah_multikey_1": ESSAY,
    "niah_multikey_2": SYNTHETIC,
    "niah_multikey_3": SYNTHETIC,
    "niah_multivalue": ESSAY,
    "niah_multiquery": ESSAY,
    "ruler_vt": SYNTHETIC,
    "ruler_cwe": SYNTHETIC,
    "ruler_fwe": SYNTHETIC,
    "ruler_qa_squad": QA,
    "ruler_qa_hotpot": QA,
}
# the file lm-eval downloads for each QA task (the last part of its URL in qa_utils.py)
QA_FILES = {"ruler_qa_squad": "dev-v2.0.json", "ruler_qa_hotpot": "hotpot_dev_distractor_v1.json"}
DEFAULT_TASKS = tuple(t for t, source in SOURCES.items() if source != QA)
PUNKT = "tokenizers/punkt_tab/english"
# lm-eval's prompt generators (in the module of each task's dataset function); each is called
# for 500 prompts, drawn one after the other from the global RNGs, so the first k of them are
# the same whether 500 or k are generated
GENERATORS = (
    "generate_samples",
    "sys_vartrack_w_noise_random",
    "sys_word_pair_random",
    "sys_kwext",
)


def ruler_folder() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent / "ruler"


def check_tasks(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in SOURCES]
    if unknown or not names:
        raise ValueError(
            f"tasks: {', '.join(unknown) or 'none given'}; allowed: {', '.join(SOURCES)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"tasks: {','.join(names)} names a task twice")
    return names


def qa_skips(tasks: list[str], qa_dir: Path | None) -> dict[str, str]:
    """The QA tasks whose data is not on disk, each with the one line saying why."""
    skips = {}
    for task in (t for t in tasks if SOURCES[t] == QA):
        if qa_dir is None or not (qa_dir / QA_FILES[task]).is_file():
            where = f"{qa_dir}/{QA_FILES[task]}" if qa_dir else f"--qa-dir DIR/{QA_FILES[task]}"
            skips[task] = (
                f"{task} skipped: its data ({QA_FILES[task]}) is downloaded by lm-eval from the "
                f"network; put the file at {where} to run it"
            )
    return skips


@dataclass(frozen=True)
class Haystack:
    """The text that replaces Paul Graham's essays: RULER's essay haystack is the essays'
    words (whitespace collapsed), cut by word count; these are the words of ``sources``."""

    words: tuple[str, ...]
    name: str
    content: str  # a hash of the words: cells are keyed on the text, not on its path

    @classmethod
    def load(cls, sources: list[str] | None) -> Haystack:
        try:
            docs = load_documents(sources)
        except ValueError as error:  # the same checks as a dataset, named as the option
            raise ValueError(str(error).replace("dataset:", "haystack:", 1)) from None
        words = tuple(re.sub(r"\s+", " ", " ".join(text for _, text in docs)).strip().split(" "))
        if words == ("",):
            raise ValueError(f"haystack: {sources!r} holds no text; allowed: non-empty documents")
        name = "packaged plays" if not sources else ", ".join(sources)
        digest = hashlib.sha1("\n".join(words).encode()).hexdigest()[:12]
        return cls(words, name, digest)


def ensure_sentence_splitter() -> str:
    """The essay tasks split the haystack into sentences with nltk's ``punkt_tab``, which
    lm-eval downloads when it is missing. Without it, a Punkt model trained (unsupervised) on the
    packaged plays is written to the yarnlib cache once and used instead. Returns which."""
    import nltk

    root = cache_dir() / "nltk_data"
    try:
        found = nltk.data.find(PUNKT)
    except LookupError:
        if not (root / PUNKT / "ortho_context.tab").is_file():
            write_punkt(root / PUNKT)
        nltk.data.path.append(str(root))
        found = nltk.data.find(PUNKT)  # now found: importing lm-eval's RULER downloads nothing
    # (asked again in the same process, nltk finds ours on the path it was added to)
    if Path(getattr(found, "path", str(found))).is_relative_to(root):
        return "punkt trained on the packaged plays"
    return "nltk punkt_tab"


def write_punkt(folder: Path) -> None:
    from nltk.tabdata import TabEncoder
    from nltk.tokenize.punkt import PunktTrainer

    text = "\n".join(t for _, t in load_documents([str(DEFAULT_DATASET)]))
    params = PunktTrainer(text).get_params()
    encode = TabEncoder()
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "collocations.tab": encode.tups2tab(params.collocations),
        "sent_starters.txt": encode.set2txt(params.sent_starters),
        "abbrev_types.txt": encode.set2txt(params.abbrev_types),
        "ortho_context.tab": encode.ivdict2tab(params.ortho_context),  # last: marks complete
    }
    for name, content in files.items():
        atomic.write_text(folder / name, content, field="cache")


@contextlib.contextmanager
def substituted(namespace: dict, replacements: dict):
    """Names of a module's globals replaced for the block (the data sources of a task)."""
    previous = {name: namespace[name] for name in replacements}
    namespace.update(replacements)
    try:
        yield
    finally:
        namespace.update(previous)


def local_dataset(build, source: str, samples: int, haystack: Haystack | None, qa_dir):
    """lm-eval's ``custom_dataset`` function of a task, generating only the ``samples`` prompts
    that are answered, with its network source replaced by the local one: the essay words by
    the haystack's, the QA download by the file in ``qa_dir``."""
    namespace = build.__globals__
    replacements = {name: first_prompts(namespace[name], samples) for name in GENERATORS
                    if name in namespace}  # fmt: skip
    if source == ESSAY:
        original = namespace["get_haystack"]

        def get_haystack(type_haystack):
            return list(haystack.words) if type_haystack == ESSAY else original(type_haystack)

        replacements["get_haystack"] = get_haystack
    elif source == QA:
        replacements["download_json"] = lambda url: json.loads(
            (qa_dir / url.rsplit("/")[-1]).read_text()
        )

    def build_locally(**kwargs):
        with substituted(namespace, replacements):
            return build(**kwargs)

    return build_locally


def first_prompts(generate, samples: int):
    # fwe's generator is called without num_samples: its own default (500) applies
    default = inspect.signature(generate).parameters["num_samples"].default

    def generate_first(*args, num_samples=default, **kwargs):
        return generate(*args, num_samples=min(num_samples, samples), **kwargs)

    return generate_first


def task_configs() -> dict[str, Path]:
    """Task name → the YAML file of lm-eval's RULER folder that defines it."""
    from lm_eval.tasks._yaml_loader import load_yaml

    found = {}
    for path in sorted(ruler_folder().glob("*.yaml")):
        config = load_yaml(path, resolve_func=False, recursive=False)
        if isinstance(config.get("task"), str):
            found[config["task"]] = path
    return found


def cell_seed(seed: int, task: str, length: int) -> int:
    return int.from_bytes(hashlib.sha1(f"{seed}:{task}:{length}".encode()).digest()[:4], "big")


def build_task(task: str, length: int, samples: int, tokenizer_name: str, seed: int,
               haystack: Haystack | None = None, qa_dir: Path | None = None):  # fmt: skip
    """lm-eval's task ``task`` at one length, its first ``samples`` prompts generated from the
    cell's seed."""
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    config = load_yaml(task_configs()[task])
    config.pop("tag", None)
    build = config["custom_dataset"]
    config["custom_dataset"] = local_dataset(build, SOURCES[task], samples, haystack, qa_dir)
    config["metadata"] = {
        **config.get("metadata", {}),
        "tokenizer": tokenizer_name,
        "max_seq_lengths": [length],
    }
    state = random.getstate(), np.random.get_state()
    random.seed(cell_seed(seed, task, length))  # RULER's generators draw from the global RNGs
    np.random.seed(cell_seed(seed, task, length) % 2**32)
    try:
        return ConfigurableTask(config=config)
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])


def evaluate_cell(lm, task_obj, task: str, length: int, samples: int) -> dict:
    """The first ``samples`` prompts of a built task, answered by ``lm`` and scored by the
    task's own ``process_results``: each score is the fraction of the expected strings found
    in the answer (RULER's string_match_all / _part)."""
    from lm_eval.evaluator import evaluate

    started = time.perf_counter()
    out = evaluate(lm, {"tasks": {task: task_obj}}, limit=samples, bootstrap_iters=0,
                   log_samples=True, verbosity="WARNING")  # fmt: skip
    logged = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    scores = [float(s[str(length)]) for s in logged]
    prompts = hashlib.sha1("\n".join(s["doc"]["input"] for s in logged).encode()).hexdigest()
    return {
        **score_fields(scores),
        "answers": [s["filtered_resps"][0][:200] for s in logged],
        "expected": [s["doc"]["outputs"] for s in logged],
        # RULER's `length`: the prompt's tokens plus the most it may generate
        "ruler_length": [int(s["doc"]["length"]) for s in logged],
        "prompts_id": prompts[:12],
        "seconds": round(time.perf_counter() - started, 1),
    }


def score_fields(scores: list[float]) -> dict:
    """Mean score with a Wilson 95 % interval over the samples. A score in [0, 1] with mean p
    has variance at most p(1 − p), so for the partial-credit tasks (several values to find) the
    interval of a 0/1 rate with the same mean is conservative."""
    low, high = wilson(sum(scores), len(scores))
    return {
        "scores": scores,
        "samples": len(scores),
        "score": sum(scores) / len(scores),
        "ci_low": round(low, 4),
        "ci_high": round(high, 4),
    }


def make_lm(model, tokenizer, max_length: int):
    """lm-eval's ``hf`` model around an already loaded (and patched in place) model: one set of
    weights serves every row; each answer ends once its score is settled (ruler_lm.py)."""
    from yarnlib.eval.ruler_lm import RulerLM

    return RulerLM(pretrained=model, tokenizer=tokenizer, batch_size=1, max_length=max_length)


def run_ruler(lm, rows, tasks, lengths, samples, store, build, max_cells=None) -> list[dict]:
    """Every missing (row, task, length) cell, shortest lengths first; ``rows`` are
    ``(method, apply)`` pairs (``apply`` sets the model up for that row and returns the fields
    the record carries), ``build(task, length)`` makes a task. Each cell is appended to
    ``store`` when done."""
    from tqdm import tqdm

    todo = [(n, t, m, apply) for n in lengths for t in tasks for m, apply in rows
            if not store.has(method=m.label, task=t, length=n)]  # fmt: skip
    todo = todo[:max_cells] if max_cells else todo
    built: dict[tuple, object] = {}
    computed = []
    for length, task, method, apply in tqdm(todo, desc="ruler cells"):
        if (task, length) not in built:
            built = {(task, length): build(task, length)}  # one task in memory at a time
        fields = apply(method)
        cell = evaluate_cell(lm, built[task, length], task, length, samples)
        record = {"method": method.label, "task": task, "length": length, **fields, **cell}
        store.add(record)
        computed.append(record)
    return computed


def averages(records: list[dict], tasks: list[str]) -> list[dict]:
    """Per (row, length) where every task has its cell: the mean of the task scores, and a
    Wilson interval of all its samples pooled (equal samples per task: the same mean)."""
    cells = {(r["method"], r["length"], r["task"]): r for r in records}
    rows = []
    for method, length in dict.fromkeys((r["method"], r["length"]) for r in records):
        mine = [cells.get((method, length, t)) for t in tasks]
        if None in mine:
            continue
        scores = [s for r in mine for s in r["scores"]]
        low, high = wilson(sum(scores), len(scores))
        mean = sum(r["score"] for r in mine) / len(mine)
        rows.append({"method": method, "length": length, "score": mean, "samples": len(scores),
                     "ci_low": round(low, 4), "ci_high": round(high, 4)})  # fmt: skip
    return rows


def default_threshold(rows: list[dict], native: int) -> float | None:
    """The base model's own average at its native length: the ``none`` row there."""
    base = [r["score"] for r in rows if r["method"] == "none" and r["length"] == native]
    return base[0] if base else None


def effective_lengths(rows: list[dict], threshold: float | None) -> dict[str, int | None]:
    """Per row, RULER's effective context length: the longest tested length up to which the
    average stays at or above ``threshold`` at every tested length (None: not even the
    shortest)."""
    if threshold is None:
        return {}
    found: dict[str, int | None] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        best = None
        for r in sorted((r for r in rows if r["method"] == method), key=lambda r: r["length"]):
            if r["score"] < threshold:
                break
            best = r["length"]
        found[method] = best
    return found


def percent(record: dict) -> str:
    return (
        f"{100 * record['score']:.0f} [{100 * record['ci_low']:.0f}–{100 * record['ci_high']:.0f}]"
    )


def markdown(records, rows, tasks, lengths, threshold, effective, sources) -> str:
    """One table per row: score (%) per task and length with its 95 % interval, the average
    over the tasks, then the effective length against the threshold."""
    cells = {(r["method"], r["task"], r["length"]): r for r in records}
    means = {(r["method"], r["length"]): r for r in rows}
    shown = [n for n in lengths if any(k[2] == n for k in cells)]
    head = "| task | " + " | ".join(str(n) for n in shown) + " |\n|---|" + "---|" * len(shown)
    out = []
    for method in dict.fromkeys(r["method"] for r in records):
        lines = [f"### {method}", "", head]
        for task in tasks:
            values = [percent(cells[method, task, n]) if (method, task, n) in cells else "—"
                      for n in shown]  # fmt: skip
            lines.append(f"| {task}{sources.get(task, '')} | " + " | ".join(values) + " |")
        values = [f"**{percent(means[method, n])}**" if (method, n) in means else "—"
                  for n in shown]  # fmt: skip
        lines.append("| **average** | " + " | ".join(values) + " |")
        if threshold is not None:
            found = effective.get(method) or "below the threshold at every length"
            lines += ["", f"effective length (average ≥ {100 * threshold:.0f}): {found}"]
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"
