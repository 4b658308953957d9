"""``yarnlib tune``: search the YaRN knobs and per-frequency divisors for a model and a target
length on calibration text."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from yarnlib.documents import load_documents
from yarnlib.eval.cli import DTYPES, positive, warn_fewer_samples
from yarnlib.eval.methods import Method, check_methods
from yarnlib.eval.store import CellStore, content_id
from yarnlib.model_arg import add_model_argument
from yarnlib.models import load_config, load_model, resolve
from yarnlib.spec_file import write_json, write_spec_file
from yarnlib.tune.needle import check_needles, needle_objective, needle_windows
from yarnlib.tune.search import SPACES, Search, objective, to_spec, trial_key

TRIALS = "trials.jsonl"
BEST = "best.json"
FINAL = "final.json"
# what a resumed search reads from each stored trial
READ_BACK = ("trial", "space", "length", "objective", "nll_within_original")


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
    warn_fewer_samples(count, {length: len(samples)})
    return samples


def _recorded(path: Path) -> dict:
    """The JSON object in ``path``; {} where there is none (no file yet, or not ours)."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return payload if isinstance(payload, dict) else {}


# the objective's options, as best.json and final.json record them and as they are given
OBJECTIVE_OPTIONS = {
    "objective": "--objective", "needles": "--needles", "mix_weight": "--mix-weight"
}  # fmt: skip


def recorded_objective(output: Path) -> tuple[dict, str]:
    """What the search in ``output`` minimised and the file that says so: best.json's record,
    else (a search from before best.json recorded it) final.json's settings."""
    recorded = _recorded(output / BEST).get("minimised")
    if isinstance(recorded, dict):
        return recorded, BEST
    settings = _recorded(output / FINAL).get("settings")
    if not isinstance(settings, dict):  # no search finished here (or not ours)
        return {}, FINAL
    found = {k: settings[k] for k in OBJECTIVE_OPTIONS if k in settings}
    return {"objective": "nll", **found}, FINAL  # before --objective existed: nll


def check_same_search(output: Path, target_length: int, minimised: dict) -> None:
    """A folder holds one search, for one target length and one objective: another would start
    over and replace its best.json and final.json, so it is refused."""
    found = _recorded(output / BEST).get("target_length")
    if found is not None and found != target_length:
        raise ValueError(
            f"target_length: {output} holds a search for {found} tokens ({BEST}), this run asks "
            f"for {target_length}; allowed: --target-length {found} to continue it, or another "
            "--output"
        )
    recorded, source = recorded_objective(output)
    if not recorded:  # nothing searched here yet (or nothing recorded): nothing to replace
        return
    for field in OBJECTIVE_OPTIONS:
        if recorded.get(field) != minimised.get(field):
            raise ValueError(
                f"{field}: {output} holds a search minimising {_described(recorded)} ({source}), "
                f"this run asks for {_described(minimised)}; allowed: {_as_options(recorded)} to "
                "continue it, or another --output"
            )


def _described(minimised: dict) -> str:
    """``mix (needles 4, mix_weight 0.1)``: an objective and its parameters."""
    params = ", ".join(f"{k} {v}" for k, v in minimised.items() if k != "objective")
    return f"{minimised.get('objective')}" + (f" ({params})" if params else "")


def _as_options(minimised: dict) -> str:
    """``--objective mix --needles 4 --mix-weight 0.1``: the options that ask for it."""
    return " ".join(f"{o} {minimised[k]}" for k, o in OBJECTIVE_OPTIONS.items() if k in minimised)


def check_proxy(proxy_length: int | None, original: int, target_length: int) -> None:
    if proxy_length is not None and not original < proxy_length < target_length:
        raise ValueError(
            f"proxy_length: {proxy_length}; allowed: a length between the original context "
            f"{original} and the target length {target_length} (both excluded)"
        )


OBJECTIVES = {
    "nll": "mean NLL of the tokens at positions >= original_max_position_embeddings",
    "needle": "mean NLL of the answer tokens of the keys hidden in each window (needle NLL)",
    "mix": "(1 - mix_weight) x NLL of the other tokens at positions >= "
    "original_max_position_embeddings + mix_weight x needle NLL, in the needle windows",
}


def check_objective(args) -> None:
    if args.objective not in OBJECTIVES:
        raise ValueError(f"objective: {args.objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if args.objective == "nll":
        return
    check_needles(args.needles)
    if not 0 < args.mix_weight < 1:
        raise ValueError(f"mix_weight: {args.mix_weight!r}; allowed: a number in (0, 1)")
    if args.proxy_length is not None:
        raise ValueError(
            f"proxy_length: {args.proxy_length} with --objective {args.objective}: the questions "
            "sit at the end of each window, a proxy would cut them off; allowed: --objective nll"
        )


def objective_settings(args) -> dict:
    """What makes needle/mix trials comparable (nll trials keep the settings they always had,
    so the trials of earlier searches stay valid)."""
    if args.objective == "nll":
        return {}
    weight = {"mix_weight": args.mix_weight} if args.objective == "mix" else {}
    return {"objective": args.objective, "needles": args.needles, **weight}


def minimised(args) -> dict:
    """The objective the search minimises with its parameters (recorded in best.json and
    final.json, and what a rerun in the same folder must ask for)."""
    return {"objective": args.objective, **objective_settings(args)}


def scorers(args, model, tokenizer, calibration, held_out, original):
    """(search scorer, held-out scorer) for ``--objective``; None, None for nll (the search's
    own objective)."""
    if args.objective == "nll":
        return None, lambda spec: objective(model, held_out, spec, original)
    weight = args.mix_weight if args.objective == "mix" else None
    windows = needle_windows(tokenizer, calibration, args.needles)
    held = needle_windows(tokenizer, held_out, args.needles, "held_out:") if held_out else None
    return (
        lambda spec, length=None: needle_objective(model, windows, spec, original, weight),
        lambda spec: needle_objective(model, held, spec, original, weight),
    )


def run(args) -> int:
    for field in ("target_length", "budget", "samples", "confirm"):
        positive(field, getattr(args, field))
    if args.dtype not in DTYPES:
        raise ValueError(f"dtype: {args.dtype!r}; allowed: {', '.join(DTYPES)}")
    if args.space not in (*SPACES, "both"):
        raise ValueError(f"space: {args.space!r}; allowed: {', '.join(SPACES)}, both")
    config = load_config(args.model)
    native = check_methods(config, [])
    original = args.original_max_position_embeddings  # 0 is an error, not "from the config"
    if original is None:
        original = native.original_max_position_embeddings
    positive("original_max_position_embeddings", original)
    if args.target_length <= original:
        raise ValueError(
            f"target_length: {args.target_length} is not beyond the original context {original}; "
            "allowed: a length > original_max_position_embeddings"
        )
    check_proxy(args.proxy_length, original, args.target_length)
    check_objective(args)
    check_methods(config, [Method("yarn", args.target_length / original)])
    output = Path(args.output)
    check_same_search(output, args.target_length, minimised(args))
    settings = {
        "model": args.model,
        "dtype": args.dtype,
        "target_length": args.target_length,
        "original_max_position_embeddings": original,
        "text_column": args.text_column,
        "samples": args.samples,
    }
    settings.update(objective_settings(args))
    tokenizer = AutoTokenizer.from_pretrained(resolve(args.model))
    length = args.target_length
    calibration = samples_of(
        "dataset", args.dataset, tokenizer, args.text_column, length, args.samples
    )
    # Trials are keyed on the calibration tokens, not the files' paths: an edited file is
    # searched again, the same text under another path (a clone elsewhere) is not. Trials
    # written while the paths were part of the key still count (alias).
    settings["calibration"] = content_id(calibration)
    by_path = ({**settings, "dataset": args.dataset},)
    store = CellStore(
        output, ("key",), settings, resume=True, filename=TRIALS, required=READ_BACK,
        aliases=by_path,
    )  # fmt: skip
    held_out = None
    if args.held_out:
        held_out = samples_of(
            "held_out", args.held_out, tokenizer, args.text_column, length, args.samples
        )
    model, _ = load_model(args.model, DTYPES[args.dtype])
    scorer, held_out_scorer = scorers(args, model, tokenizer, calibration, held_out, original)

    def save_best(spec, record):
        write_spec_file(
            output / BEST, spec, model=args.model, target_length=length,
            minimised=minimised(args), objective=record["objective"],
            objective_length=record["length"],
            trial=record["trial"], nll_within_original=record["nll_within_original"],
        )  # fmt: skip

    search = Search(
        model, calibration, native, original, length, store, args.budget, save_best,
        proxy_length=args.proxy_length, slow_in_range=args.slow_in_range, scorer=scorer,
    )  # fmt: skip
    started = time.perf_counter()
    try:
        search.run(args.seed, args.space)
        proxy = search.confirm(args.confirm) if args.proxy_length else None
    except KeyboardInterrupt:  # exit 130, as shells do, saying how to go on
        print(
            f"\ninterrupted: finished trials are in {output / TRIALS}, the best so far in "
            f"{output / BEST}; rerun the same command to continue",
            file=sys.stderr,
        )
        return 130
    seconds = round(time.perf_counter() - started, 1)
    rows = {"start": (search.start, search.trials[trial_key(search.start)][1])}
    rows["best"] = (search.best_point, search.best)
    rows.update((s, t) for s in SPACES if (t := search.best_in(s, length)) is not None)
    held_out_scores = {}  # by trial key: the start is often a space's best too
    final = {
        "settings": {
            **settings, "dataset": args.dataset, "budget": args.budget, "seed": args.seed,
            "space": args.space,
            "proxy_length": args.proxy_length, "confirm": args.confirm,
            "slow_in_range": args.slow_in_range, "objective": args.objective,
        },
        "trials": len(search.seen),
        "computed_now": search.computed,
        "search_seconds": seconds,  # this invocation's; a resumed search's total is below
        "trial_seconds": round(sum(r["seconds"] for r in store.done.values()), 1),
        "objective": OBJECTIVES[args.objective],
        "minimised": minimised(args),
    }  # fmt: skip
    for name, (point, record) in rows.items():
        spec = to_spec(native, original, point)
        final[name] = {"key": record["key"], "spec": spec.fields(), "calibration": _scores(record)}
        if held_out is not None:
            if record["key"] not in held_out_scores:
                held_out_scores[record["key"]] = held_out_scorer(spec)
            final[name]["held_out"] = held_out_scores[record["key"]]
    if proxy is not None:
        final["proxy"] = proxy
    write_json(output / FINAL, final)
    print(f"trials: {len(search.seen)} ({search.computed} computed now); {output / TRIALS}")
    if proxy is not None:
        print(_proxy_table(proxy, length))
    print(summary_table(final, list(rows), OBJECTIVES[args.objective]))
    print(f"best: {to_spec(native, original, search.best_point).describe()}")
    print(f"spec: {output / BEST}; results: {output / FINAL}")
    print(check_command(args.model, output / BEST, length, original))
    return 0


def check_command(model: str, spec_file: Path, length: int, original: int) -> str:
    """The passkey run to do before shipping a tuned spec, against YaRN's defaults on the same
    prompts: a spec tuned at one length can lose retrieval at shorter ones (docs/tune.md)."""
    lengths = ",".join(str(n) for n in sorted({length // 2, 3 * length // 4, length}))
    return (
        f"check retrieval at the lengths you serve before shipping it (docs/tune.md):\n"
        f"  yarnlib eval passkey --model {model} --methods yarn:{length / original:g} "
        f"--spec {spec_file} --lengths {lengths} --output {spec_file.parent / 'passkey'}"
    )


def summary_table(final: dict, names: list[str], objective: str) -> str:
    """Each row's objective on the calibration (and held-out) text, against YaRN's defaults
    (the start), so the winner and its margin are read off, not worked out."""
    held = all("held_out" in final[name] for name in names)
    columns = ["calibration", "held-out"] if held else ["calibration"]
    head = f"{'':<22}" + "".join(f"{c:>13}{'vs start':>10}" for c in columns)
    lines = [f"objective: {objective}", head + "  trial"]
    for name in names:
        label = "start (yarn defaults)" if name == "start" else name
        line = f"{label:<22}"
        for part in ("calibration", "held_out")[: len(columns)]:
            value, start = final[name][part]["objective"], final["start"][part]["objective"]
            change = "" if name == "start" else f"{value - start:+.6f}"
            line += f"{value:>13.6f}{change:>10}"
        lines.append(f"{line}  {final[name]['key']}")
    return "\n".join(lines)


def _scores(record: dict) -> dict:
    return {k: record[k] for k in ("objective", "nll_within_original")}


def _proxy_table(proxy: dict, length: int) -> str:
    lines = [f"{'at ' + str(proxy['proxy_length']):>10} {'at ' + str(length):>10}  candidate"]
    for row in proxy["candidates"]:
        lines.append(f"{row['objective_proxy']:>10.4f} {row['objective']:>10.4f}  {row['key']}")
    rho = proxy["spearman"]
    lines.append("Spearman rank correlation: " + ("n/a" if rho is None else f"{rho:.3f}"))
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="search the rope scaling for a model and target length (no fine-tuning)",
        description="Coordinate searches minimising the NLL of calibration tokens beyond the "
        "original context: over the YaRN knobs (factor >= N/L, beta_fast, beta_slow, attention "
        "factor) from the YaRN defaults, and over per-frequency divisors plus the attention "
        "factor (LongRoPE-style, exported as longrope) from the best yarn tables. Writes "
        f"{TRIALS} (a rerun continues), {BEST} (the best spec so far, for --spec of config / "
        f"vllm-args / check-rollout / eval) and {FINAL}.",
    )
    add_model_argument(p, "model")
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
    p.add_argument(
        "--space", default="both", help="yarn, per-dim, or both (yarn on half the budget, then "
        "per-dim from its best; the default)",
    )  # fmt: skip
    p.add_argument(
        "--proxy-length", type=int, help="score the search at M < N tokens (e.g. N/2), then "
        "confirm the best candidates at N",
    )  # fmt: skip
    p.add_argument(
        "--confirm", type=int, default=5, help="with --proxy-length: distinct candidates "
        "re-scored at N (besides the start and each space's best)",
    )  # fmt: skip
    p.add_argument(
        "--slow-in-range", action="store_true", help="per-dim: keep the divisor of every "
        "frequency slower than L (wavelength > L) at >= N/L, so its angles up to N stay within "
        "those seen up to L (long-range retrieval needs it: docs/tune.md)",
    )  # fmt: skip
    p.add_argument(
        "--objective", default="nll", help="what the search minimises: nll (mean NLL of the "
        "calibration tokens beyond L; the default), needle (NLL of the answers to keys hidden "
        "across each window) or mix (a weighted sum of both, --mix-weight): docs/tune.md",
    )  # fmt: skip
    p.add_argument(
        "--needles", type=int, default=4, help="needle/mix: keys hidden in each window (1-8)"
    )
    p.add_argument(
        "--mix-weight",
        type=float,
        default=0.1,
        help="mix: the needle NLL's weight w in (0, 1); 0.1 measured best (docs/tune.md)",
    )
    p.add_argument("--output", required=True, help="folder for trials, best.json, final.json")
    p.add_argument("--dtype", default="float32", help=", ".join(DTYPES))
    p.set_defaults(func=run)
