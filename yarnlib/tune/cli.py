"""``yarnlib tune``: search the YaRN knobs for a model and a target length on calibration text."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from yarnlib.documents import load_documents
from yarnlib.eval.cli import DTYPES, positive
from yarnlib.eval.methods import Method, check_methods
from yarnlib.eval.store import CellStore
from yarnlib.models import load_config, load_model, resolve
from yarnlib.spec_file import write_json, write_spec_file
from yarnlib.tune.search import Search, objective, start_point, to_spec

TRIALS = "trials.jsonl"
BEST = "best.json"
FINAL = "final.json"


def samples_of(field: str, sources, tokenizer, text_column: str, length: int, count: int):
    """The first ``length`` tokens of the first ``count`` documents that have that many."""
    docs = load_documents(sources, text_column)
    samples = []
    for _, text in docs:
        ids = tokenizer(text)["input_ids"]
        if len(ids) >= length:
            samples.append(torch.tensor(ids[:length]))
        if len(samples) == count:
            return samples
    if not samples:
        raise ValueError(
            f"{field}: no document has the target length of {length} tokens; allowed: documents "
            "at least that long"
        )
    return samples


def run(args) -> int:
    for field in ("target_length", "budget", "samples"):
        positive(field, getattr(args, field))
    if args.dtype not in DTYPES:
        raise ValueError(f"dtype: {args.dtype!r}; allowed: {', '.join(DTYPES)}")
    config = load_config(args.model)
    native = check_methods(config, [])
    original = args.original_max_position_embeddings or native.original_max_position_embeddings
    positive("original_max_position_embeddings", original)
    if args.target_length <= original:
        raise ValueError(
            f"target_length: {args.target_length} is not beyond the original context {original}; "
            "allowed: a length > original_max_position_embeddings"
        )
    check_methods(config, [Method("yarn", args.target_length / original)])
    output = Path(args.output)
    settings = {
        "model": args.model,
        "dtype": args.dtype,
        "target_length": args.target_length,
        "original_max_position_embeddings": original,
        "dataset": args.dataset,
        "text_column": args.text_column,
        "samples": args.samples,
    }
    store = CellStore(output, ("key",), settings, resume=True, filename=TRIALS)
    tokenizer = AutoTokenizer.from_pretrained(resolve(args.model))
    length = args.target_length
    calibration = samples_of(
        "dataset", args.dataset, tokenizer, args.text_column, length, args.samples
    )
    held_out = None
    if args.held_out:
        held_out = samples_of(
            "held_out", args.held_out, tokenizer, args.text_column, length, args.samples
        )
    model, _ = load_model(args.model, DTYPES[args.dtype])

    def save_best(spec, record):
        write_spec_file(
            output / BEST, spec, model=args.model, target_length=length,
            objective=record["objective"], trial=record["trial"],
            nll_within_original=record["nll_within_original"],
        )  # fmt: skip

    search = Search(model, calibration, native, original, length, store, args.budget, save_best)
    try:
        best = search.run(args.seed)
    except KeyboardInterrupt:  # exit 130, as shells do, saying how to go on
        print(
            f"\ninterrupted: finished trials are in {output / TRIALS}, the best so far in "
            f"{output / BEST}; rerun the same command to continue",
            file=sys.stderr,
        )
        return 130
    start_spec = to_spec(native, original, start_point(length / original))
    best_spec = to_spec(native, original, search.best_point)
    final = {
        "settings": {**settings, "budget": args.budget, "seed": args.seed},
        "trials": len(search.seen),
        "computed_now": search.computed,
        "start": {"spec": start_spec.fields(), "calibration": _scores(store, start_spec)},
        "best": {"spec": best_spec.fields(), "calibration": _scores(store, best_spec)},
        "objective": "mean NLL of the tokens at positions >= original_max_position_embeddings",
    }
    if held_out is not None:
        for name, spec in (("start", start_spec), ("best", best_spec)):
            final[name]["held_out"] = objective(model, held_out, spec, original)
    write_json(output / FINAL, final)
    start_value = final["start"]["calibration"]["objective"]
    print(f"trials: {len(search.seen)} ({search.computed} computed now); {output / TRIALS}")
    print(f"start (yarn defaults): {start_value:.4f}; best: {best['objective']:.4f}")
    print(f"best: {best_spec.describe()}")
    print(f"spec: {output / BEST}; results: {output / FINAL}")
    return 0


def _scores(store: CellStore, spec) -> dict:
    for record in store.done.values():
        if record["spec"] == spec.fields():
            return {k: record[k] for k in ("objective", "nll_within_original")}
    return {}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="search the YaRN knobs for a model and target length (no fine-tuning)",
        description="Coordinate search from the YaRN defaults over factor (>= N/L), beta_fast, "
        "beta_slow and the attention factor, minimising the NLL of calibration tokens beyond "
        f"the original context. Writes {TRIALS} (a rerun continues), {BEST} (the best spec so "
        f"far, for --spec of config / vllm-args / eval) and {FINAL}.",
    )
    p.add_argument("--model", required=True, help="local folder, hub id, or 'smollm2'")
    p.add_argument("--target-length", type=int, required=True, help="context N to reach")
    p.add_argument(
        "--original-max-position-embeddings", type=int, help="L (default: from the config)"
    )
    p.add_argument("--dataset", nargs="+", required=True, help="calibration .txt/.jsonl/.parquet")
    p.add_argument("--held-out", nargs="+", help="documents for the final numbers")
    p.add_argument("--text-column", default="text", help="column of .jsonl/.parquet")
    p.add_argument("--samples", type=int, default=2, help="documents of N tokens per trial")
    p.add_argument("--budget", type=int, default=20, help="trials (objective evaluations)")
    p.add_argument("--seed", type=int, default=0, help="order of the coordinate moves")
    p.add_argument("--output", required=True, help="folder for trials, best.json, final.json")
    p.add_argument("--dtype", default="float32", help=", ".join(DTYPES))
    p.set_defaults(func=run)
