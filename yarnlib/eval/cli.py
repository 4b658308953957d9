"""``yarnlib eval perplexity | passkey | ruler | lm-eval``."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from yarnlib import atomic
from yarnlib.documents import DEFAULT_DATASET, load_documents, select_samples
from yarnlib.eval.methods import Method, check_methods, parse_methods
from yarnlib.eval.ruler import DEFAULT_TASKS
from yarnlib.eval.store import CELLS, CellStore, content_id, write_csv
from yarnlib.model_arg import add_model_argument
from yarnlib.models import load_config, load_model, resolve
from yarnlib.spec import METHODS
from yarnlib.spec_file import spec_on_model
from yarnlib.wording import count

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TASKS_DIR = Path(__file__).parent / "tasks"
PASSKEY_YAML = TASKS_DIR / "yarnlib_passkey" / "yarnlib_passkey.yaml"
# lm_eval options `yarnlib eval lm-eval` takes itself; any other goes after `--`
LM_EVAL_OPTIONS = (
    "model_args", "output_path", "limit", "batch_size", "device", "metadata",
    "num_fewshot",
)  # fmt: skip


def int_list(field: str, text: str, minimum: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < minimum:
        raise ValueError(f"{field}: every value must be an integer >= {minimum}, got {text!r}")
    return sorted(set(values))


def float_list(field: str, text: str, low: float, high: float) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not a comma-separated list of numbers") from None
    if not values or not all(low <= v <= high for v in values):
        raise ValueError(f"{field}: every value must be in [{low}, {high}], got {text!r}")
    return sorted(set(values))


def positive(field: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")


def prepare(args, lengths):
    """Validate the model and the methods from the config alone; returns (methods, original)."""
    if args.dtype not in DTYPES:
        raise ValueError(f"dtype: {args.dtype!r}; allowed: {', '.join(DTYPES)}")
    args.resume = args.resume or args.report  # a report reads the cells; never starts afresh
    only_specs = args.spec and not args.methods.strip()  # --methods '' --spec FILE: those rows only
    methods = [] if only_specs else parse_methods(args.methods, args.factor)
    native = check_methods(load_config(args.model), methods)
    for path in spec_paths(args):  # one more row each: exactly the file's spec, spec:NAME
        spec = spec_on_model(path, native)
        methods.append(Method(spec.method, spec.factor, spec, f"spec:{path.stem}"))
    return methods, native.original_max_position_embeddings


def spec_paths(args) -> list[Path]:
    paths = [Path(p) for p in args.spec or []]
    names = [p.stem for p in paths]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(
                f"spec: two files named {name!r} ({', '.join(map(str, paths))}); allowed: files "
                "with distinct names (each is the row spec:NAME)"
            )
    return paths


def settings(args, *fields) -> dict:
    given = {f: getattr(args, f) for f in fields}
    return {"model": args.model, "dtype": args.dtype, **given}


def warn_fewer_samples(requested: int, used: dict[int, int]) -> None:
    """Say where fewer documents than ``--samples`` were long enough (the table shows it too)."""
    short = {n: k for n, k in used.items() if k < requested}
    if short:
        where = ", ".join(f"{k} at {n} tokens" for n, k in short.items())
        print(
            f"warning: samples: {requested} requested, but too few documents are that long: "
            f"{where}; those numbers average fewer samples",
            file=sys.stderr,
        )


def row_settings(methods) -> dict[str, dict]:
    """Each spec row's exact spec: an edited spec file recomputes that row only."""
    return {m.label: m.spec.fields() for m in methods if m.spec is not None}


def run_device() -> str:
    """Where an evaluation runs: the GPU when there is one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def draw(plot, *args) -> None:
    """Draw a picture of the results; matplotlib is optional (the ``eval`` extra)."""
    if importlib.util.find_spec("matplotlib") is None:
        print("plot skipped: matplotlib is not installed (pip install 'yarnlib[eval]')")
        return
    print(f"plot: {plot(*args)}")


def finish(store: CellStore, name: str, computed: list, wanted: int, extra: dict) -> None:
    json_path, csv_path = store.write_final(name, extra)
    print(f"computed {count(len(computed), 'cell')}; results: {json_path}, {csv_path}")
    if len(store.done) < wanted:
        print(f"stopped with {len(store.done)} of {wanted} cells done; rerun with --resume")


def interruptible(run):
    """Ctrl-C ends with where the finished cells are and how to go on (exit 130, as shells do)."""

    @functools.wraps(run)
    def run_until_interrupted(args) -> int:
        try:
            return run(args)
        except KeyboardInterrupt:
            print(
                f"\ninterrupted: finished cells are in {Path(args.output) / CELLS}; rerun the same "
                "command with --resume to compute only the missing ones",
                file=sys.stderr,
            )
            return 130

    return run_until_interrupted


def run_perplexity_cli(args) -> int:
    from yarnlib.eval.perplexity import DOCUMENTS, run_perplexity, table
    from yarnlib.eval.plots import plot_perplexity

    lengths = int_list("lengths", args.lengths, minimum=2)
    for field in ("samples", "window", "stride", "chunk_size", "max_cells"):
        positive(field, getattr(args, field))
    methods, original = prepare(args, lengths)
    tokenizer = AutoTokenizer.from_pretrained(resolve(args.model))
    docs = load_documents(args.dataset, args.text_column, args.split, args.dataset_config)
    tokens = [torch.tensor(tokenizer(text)["input_ids"]) for _, text in docs]
    chosen, skipped = select_samples([len(t) for t in tokens], lengths, args.samples)
    warn_fewer_samples(args.samples, {n: len(c) for n, c in chosen.items()})
    fields = ("text_column", "split", "samples", "window", "stride")
    # Cells are keyed on the tokens, not the files' paths: a file changed at the same path is
    # measured again, the same text under another path (a clone elsewhere) is not. Cells
    # written while the paths were part of the key still count (alias).
    keyed = {**settings(args, *fields), "tokens": content_id(tokens)}
    by_path = ({**keyed, "dataset": args.dataset},)
    rows, labels = row_settings(methods), tuple(m.label for m in methods)
    store = CellStore(
        args.output, ("method", "length"), keyed, args.resume, row_settings=rows,
        aliases=by_path, labels=labels,
    )  # fmt: skip
    computed = []
    if not (args.report or store.complete(methods, lengths)):
        document_store = CellStore(
            args.output, ("method", "document", "forward_length"), keyed, args.resume,
            DOCUMENTS, rows, aliases=by_path, labels=labels,
        )  # fmt: skip
        model, _ = load_model(args.model, DTYPES[args.dtype])
        model.to(run_device())
        computed = run_perplexity(
            model, tokens, methods, lengths, chosen, skipped, store, original,
            args.window, args.stride, args.chunk_size, args.max_cells, document_store,
        )  # fmt: skip
    records = list(store.done.values())
    names = {n: [docs[d][0] for d in chosen[n]] for n in lengths}
    extra = {"dataset": args.dataset, "documents": names}
    finish(store, "perplexity", computed, len(methods) * len(lengths), extra)
    print(table(records, count="samples"))
    if records:
        draw(plot_perplexity, records, original, Path(args.output) / "perplexity.png", args.model)
    return 0


def passkey_layout(args, tokenizer):
    """(cell depths, layout or None for classic, settings fields) of ``eval passkey``."""
    from yarnlib.eval.passkey import LAYOUTS, Independent, load_haystack

    if args.layout not in LAYOUTS:
        raise ValueError(f"layout: {args.layout!r}; allowed: {', '.join(LAYOUTS)}")
    classic = args.layout == "classic"
    depths = float_list("depths", args.depths or ("0.1,0.5,0.9" if classic else "0,1"), 0.0, 1.0)
    fields = ("trials", "seed", "distractors", "max_new_tokens")  # what classic cells were keyed by
    if classic:
        for field in ("haystack", "depth_bins"):
            if getattr(args, field) is not None:
                raise ValueError(
                    f"{field}: given with --layout classic, which always uses the classic filler "
                    "at the exact --depths; allowed: --layout independent"
                )
        return depths, None, fields
    positive("depth_bins", args.depth_bins)
    bins = args.depth_bins or 3
    if depths[0] < depths[-1] and args.trials < bins:
        raise ValueError(
            f"trials: {args.trials} prompts per length for {bins} depth bins; allowed: trials >= "
            "depth_bins (a bin without prompts has no rate)"
        )
    sources = args.haystack or None
    haystack = None if sources == ["classic"] else load_haystack(tokenizer, sources)
    layout = Independent(haystack, depths[0], depths[-1], bins)
    return layout.cell_depths(), layout, (*fields, "layout", "haystack", "depth_bins", "depths")


def run_passkey_cli(args) -> int:
    from yarnlib.eval.passkey import TRIALS, by_length, cell_store, min_length, run_passkey
    from yarnlib.eval.perplexity import table
    from yarnlib.eval.plots import plot_passkey, plot_passkey_lengths
    from yarnlib.eval.stats import percent_interval

    lengths = int_list("lengths", args.lengths)
    if args.trials is None:
        args.trials = 5 if args.layout == "classic" else 30
    for field in ("trials", "max_new_tokens", "max_cells", "max_trials"):
        positive(field, getattr(args, field))
    methods, _ = prepare(args, lengths)
    tokenizer = AutoTokenizer.from_pretrained(resolve(args.model))
    shortest = min_length(tokenizer, args.distractors)
    if lengths[0] < shortest:
        raise ValueError(f"lengths: {lengths[0]} is shorter than the prompt's {shortest} tokens")
    depths, layout, fields = passkey_layout(args, tokenizer)
    keys = ("method", "length", "depth")
    rows, labels = row_settings(methods), tuple(m.label for m in methods)
    store = cell_store(
        args.output, settings(args, *fields), layout, args.resume, args.report,
        row_settings=rows, labels=labels,
    )  # fmt: skip
    computed = []
    if not (args.report or store.complete(methods, lengths, depths)):
        trial_store = CellStore(
            args.output, (*keys, "trial"), store.settings, args.resume, TRIALS, rows, labels=labels
        )
        model, _ = load_model(args.model, DTYPES[args.dtype])
        model.to(run_device())
        computed = run_passkey(
            model, tokenizer, methods, lengths, depths, args.trials, store,
            args.seed, args.distractors, args.max_new_tokens, args.max_cells,
            trial_store=trial_store, layout=layout, max_trials=args.max_trials,
        )  # fmt: skip
    records = list(store.done.values())
    lengths_rows = by_length(records)
    extra = {"by_length": lengths_rows}
    finish(store, "passkey", computed, len(methods) * len(lengths) * len(depths), extra)
    write_csv(Path(args.output) / "passkey_lengths.csv", lengths_rows)
    shown = [{**r, "shown": percent_interval(r)} for r in lengths_rows]
    print(
        "passkey accuracy per length [Wilson 95 % interval], all trials of the length\n"
        + table(shown, "shown", "{}", column=14)
    )
    if records:
        draw(plot_passkey, records, Path(args.output) / "passkey.png", args.model)
        draw(
            plot_passkey_lengths,
            lengths_rows,
            Path(args.output) / "passkey_lengths.png",
            args.model,
        )
    return 0


def ruler_sources(args, tasks: list[str]):
    """(haystack or None, QA folder or None, settings fields, the tasks to run, the note after
    each task's name) of ``eval ruler``; says which tasks are skipped and which run on another
    haystack than RULER's."""
    from yarnlib.eval.ruler import ESSAY, SOURCES, Haystack, ensure_sentence_splitter, qa_skips

    qa_dir = Path(args.qa_dir) if args.qa_dir else None
    for task, line in qa_skips(tasks, qa_dir).items():
        print(line)
        tasks.remove(task)
    if not tasks:
        raise ValueError("tasks: every task named was skipped (see above); allowed: tasks that run")
    extra: dict = {}
    notes: dict[str, str] = {}
    haystack = None
    # lm-eval's needle module downloads punkt_tab when imported, for the synthetic tasks too
    splitter = ensure_sentence_splitter()
    if any(SOURCES[t] == ESSAY for t in tasks):
        haystack = Haystack.load(args.haystack)
        extra = {"haystack": haystack.content, "sentence_splitter": splitter}
        for task in (t for t in tasks if SOURCES[t] == ESSAY):
            notes[task] = "*"
        print(f"essay tasks ({', '.join(notes)}): Paul Graham's essays (network) replaced by "
              f"{haystack.name} [{extra['sentence_splitter']}]")  # fmt: skip
    if qa_dir is not None:
        extra["qa"] = {t: content_id_of_file(qa_dir / f) for t, f in qa_files(tasks).items()}
    return haystack, qa_dir, extra, tasks, notes


def qa_files(tasks: list[str]) -> dict[str, str]:
    from yarnlib.eval.ruler import QA_FILES

    return {t: QA_FILES[t] for t in tasks if t in QA_FILES}


def content_id_of_file(path: Path) -> str:
    import hashlib

    return hashlib.sha1(path.read_bytes()).hexdigest()[:12]


def run_ruler_cli(args) -> int:
    from importlib.metadata import version

    from yarnlib.eval import ruler
    from yarnlib.eval.methods import apply_method, scaling_fields
    from yarnlib.eval.plots import plot_ruler

    lengths = int_list("lengths", args.lengths, minimum=256)
    for field in ("samples", "max_cells"):
        positive(field, getattr(args, field))
    if args.threshold is not None and not 0 <= args.threshold <= 1:
        raise ValueError(f"threshold: {args.threshold!r}; allowed: a score in [0, 1]")
    tasks = ruler.check_tasks([t.strip() for t in args.tasks.split(",") if t.strip()])
    methods, original = prepare(args, lengths)
    haystack, qa_dir, extra, tasks, notes = ruler_sources(args, tasks)
    keyed = {**settings(args, "samples", "seed"), "lm_eval": version("lm_eval"), **extra}
    rows, labels = row_settings(methods), tuple(m.label for m in methods)
    store = CellStore(
        args.output, ("method", "task", "length"), keyed, args.resume, row_settings=rows,
        labels=labels,
    )  # fmt: skip
    wanted = [(m.label, t, n) for m in methods for t in tasks for n in lengths]
    computed = []
    if not (args.report or all(store.has(method=m, task=t, length=n) for m, t, n in wanted)):
        model, tokenizer = load_model(args.model, DTYPES[args.dtype])
        model.to(run_device())
        name = resolve(args.model)

        def build(task, length):
            return ruler.build_task(task, length, args.samples, name, args.seed, haystack, qa_dir)

        def apply(method):
            apply_method(model, method)
            return scaling_fields(model, method)

        lm = ruler.make_lm(model, tokenizer, max(lengths))
        pairs = [(m, apply) for m in methods]
        computed = ruler.run_ruler(
            lm, pairs, tasks, lengths, args.samples, store, build, args.max_cells
        )
    records = [store.done[k] for k in wanted if k in store.done]
    store.done = {store.key(r): r for r in records}  # the results hold the cells asked for
    means = ruler.averages(records, tasks)
    threshold = (
        ruler.default_threshold(means, original) if args.threshold is None else args.threshold
    )
    effective = ruler.effective_lengths(means, threshold)
    summary = {"averages": means, "threshold": threshold, "effective_length": effective,
               "tasks": tasks, "essay_haystack": haystack.name if haystack else None}  # fmt: skip
    finish(store, "ruler", computed, len(wanted), summary)
    table = ruler.markdown(records, means, tasks, lengths, threshold, effective, notes)
    if notes:
        table += f"\n\\* essays replaced by {haystack.name}\n"
    if threshold is None:
        table += (f"\nno threshold: run `none` at the native length {original} or give "
                  "--threshold\n")  # fmt: skip
    atomic.write_text(Path(args.output) / "ruler.md", table)
    print(table)
    if records:
        png = Path(args.output) / "ruler.png"
        draw(plot_ruler, records, means, threshold, effective, png, args.model)
    return 0


def run_lm_eval_cli(args) -> int:
    """Forward to lm-eval's own CLI with the yarnlib model registered and our tasks included."""
    from lm_eval.__main__ import cli_evaluate

    import yarnlib.eval.lm_eval_model  # noqa: F401  (registers --model yarnlib)

    # lm_eval takes one --include_path, so the packaged task goes in as a file path; loading
    # it imports its utils, which is also what makes `lm_eval --model yarnlib` itself work.
    tasks = [str(PASSKEY_YAML) if t == PASSKEY_YAML.stem else t for t in args.tasks.split(",")]
    forwarded = ["--model", "yarnlib", "--tasks", ",".join(tasks)]
    if args.include_path:
        forwarded += ["--include_path", args.include_path]
    for option in LM_EVAL_OPTIONS:
        value = getattr(args, option)
        if option == "device" and value is None:
            value = run_device()
        if value is not None:
            forwarded += [f"--{option}", str(value)]
    rest = list(args.lm_eval_args)
    sys.argv = ["lm_eval", *forwarded, *(rest[1:] if rest[:1] == ["--"] else rest)]
    cli_evaluate()
    return 0


def common(parser, lengths: str, output: str) -> None:
    add_model_argument(parser, "model")
    parser.add_argument(
        "--methods",
        default="none,yarn",
        help=f"comma-separated METHOD[:FACTOR]; methods: {', '.join(METHODS)}; '' with --spec: "
        "the spec rows only",
    )
    parser.add_argument("--factor", type=float, default=2.0, help="factor when none is given")
    parser.add_argument(
        "--spec", metavar="FILE", nargs="+", help="also run these spec files (best.json), a row "
        "spec:NAME each",
    )  # fmt: skip
    parser.add_argument("--lengths", default=lengths, help="comma-separated token lengths")
    parser.add_argument("--output", default=output, help="folder for every result file")
    parser.add_argument("--resume", action="store_true", help="skip cells already in the JSONL")
    parser.add_argument(
        "--report", action="store_true", help="compute nothing: write the result files from "
        "the finished cells in --output for these rows (a long run's state; implies --resume)",
    )  # fmt: skip
    parser.add_argument("--max-cells", type=int, help="stop after this many new cells")
    parser.add_argument("--dtype", default="float32", help=", ".join(DTYPES))


RULER_OPTIONS = (
    ("--tasks", {"default": ",".join(DEFAULT_TASKS), "help": "comma-separated RULER tasks "
                 "(default: every task that runs offline; the essay ones on --haystack)"}),
    ("--samples", {"type": int, "default": 5, "help": "prompts per task and length"}),
    ("--haystack", {"nargs": "+", "metavar": "FILE|DIR", "help": "texts that replace Paul "
                    "Graham's essays (fetched from the network) in the essay tasks (default: the "
                    f"packaged plays, {DEFAULT_DATASET})"}),
    ("--qa-dir", {"help": "folder holding dev-v2.0.json (SQuAD v2) and/or "
                  "hotpot_dev_distractor_v1.json: the QA tasks run only with their file there"}),
    ("--threshold", {"type": float, "help": "score in [0, 1] for the effective length "
                     "(default: the `none` row's average at the model's native length)"}),
    ("--seed", {"type": int, "default": 0}),
)  # fmt: skip


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="perplexity, passkey retrieval, lm-eval")
    evals = parser.add_subparsers(dest="eval_command", required=True)

    p = evals.add_parser("perplexity", help="perplexity vs context length per method")
    common(p, "2048,4096,8192", "results/perplexity")
    p.add_argument(
        "--dataset",
        nargs="+",
        help=f".txt/.jsonl/.parquet files or folders, or a datasets id (default {DEFAULT_DATASET})",
    )
    p.add_argument("--text-column", default="text", help="column of .jsonl/.parquet/datasets")
    p.add_argument("--split", default="test", help="split of a datasets id")
    p.add_argument("--dataset-config", help="config name of a datasets id")
    p.add_argument("--samples", type=int, default=4, help="documents per length")
    p.add_argument("--window", type=int, help="sliding window size (default: whole sample)")
    p.add_argument("--stride", type=int, help="sliding window stride (default: the window)")
    p.add_argument("--chunk-size", type=int, default=1024, help="positions per head chunk")
    p.set_defaults(func=interruptible(run_perplexity_cli))

    p = evals.add_parser("passkey", help="passkey retrieval accuracy, lengths × depths")
    common(p, "4096,8192", "results/passkey")
    p.add_argument(
        "--layout", default="independent", help="independent (every prompt its own filler "
        "offset, depth and key; the default) or classic (one filler and depth per cell)",
    )  # fmt: skip
    p.add_argument(
        "--haystack", nargs="+", metavar="FILE|DIR", help="independent: texts the filler is cut "
        f"from (default: the packaged plays, {DEFAULT_DATASET}), or 'classic' for the classic "
        "sentences",
    )  # fmt: skip
    p.add_argument(
        "--depths", help="classic: key depths in [0, 1] (default 0.1,0.5,0.9); independent: "
        "the range from the smallest to the largest (default 0,1)",
    )  # fmt: skip
    p.add_argument(
        "--depth-bins", type=int, help="independent: cells per length, equal bins of the depth "
        "range (default 3)",
    )  # fmt: skip
    p.add_argument(
        "--trials", type=int, help="independent: prompts per length (default 30); classic: "
        "prompts per cell (default 5)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--distractors", type=int, default=0, help="decoy keys (harder variant)")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument(
        "--max-trials", type=int, help="stop after this many new prompts, the cells with the "
        "fewest finished prompts first (a long run in pieces: --resume goes on)",
    )  # fmt: skip
    p.set_defaults(func=interruptible(run_passkey_cli))

    p = evals.add_parser(
        "ruler", help="RULER's tasks through lm-eval, offline: score per task and length, "
        "effective context length",
    )  # fmt: skip
    common(p, "4096,8192", "results/ruler")
    for flag, options in RULER_OPTIONS:
        p.add_argument(flag, **options)
    p.set_defaults(func=interruptible(run_ruler_cli))

    p = evals.add_parser(
        "lm-eval",
        help="lm-eval with --model yarnlib registered and the yarnlib_passkey task",
        description="lm_eval --model yarnlib, e.g. yarnlib eval lm-eval --model_args "
        "pretrained=smollm2,method=yarn,factor=2 --tasks yarnlib_passkey --metadata "
        "'{\"max_seq_lengths\": [12288]}'. Other lm_eval options go after `--`.",
    )
    p.add_argument("--model_args", help="pretrained=PATH|smollm2,method=M,factor=F,...")
    p.add_argument("--tasks", required=True, help="lm-eval task names; yarnlib_passkey included")
    p.add_argument("--include_path", help="a folder of your own task YAMLs")
    for option in LM_EVAL_OPTIONS[1:]:
        p.add_argument(f"--{option}")
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="-- then other lm_eval options")
    p.set_defaults(func=run_lm_eval_cli)
