"""``yarnlib config``: show or rewrite the RoPE settings of a model folder on disk."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from yarnlib import atomic
from yarnlib.config import files
from yarnlib.model_arg import add_model_argument
from yarnlib.models import smollm2_cache
from yarnlib.spec import METHODS, YARN_KNOB_DEFAULTS
from yarnlib.spec_file import spec_on_model
from yarnlib.vllm import versions

KNOBS = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor")


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def format_report(report: dict[str, Any]) -> str:
    spec = report["spec"]
    hf, vllm = report["transformers"], report["vllm"]
    form = "rope_parameters" if report["format"] == "v5" else "rope_theta + rope_scaling"
    lines = [f"{report['model_dir']}: {report['model_type']}, {report['format']} form ({form})"]
    rows = [("transformers reads", _params(hf["rope_parameters"]))]
    rows.append(("", f"max_position_embeddings={hf['max_position_embeddings']}"))
    if spec is not None:
        rows[-1] = ("", rows[-1][1] + f", attention factor {hf['attention_factor']:.6g}")
    rows.append(("vLLM reads", f"{_params(vllm['rope_parameters'])}"))
    rows.append(("", f"max_model_len={vllm['max_model_len']}"))
    if spec is not None:
        knobs = [f"{k}={v}" for k, v in spec.items() if YARN_KNOB_DEFAULTS.get(k, v) != v]
        method = f"{spec['method']} factor={spec['factor']:g}"
        rows.append(("method", " ".join([method, *knobs])))
        rows.append(
            (
                "context",
                f"native {report['native_context']}, extended {report['extended_context']}",
            )
        )
    for label, key, value in (
        ("tokenizer", "model_max_length", report["tokenizer_model_max_length"]),
        ("generation", "max_length", report["generation_max_length"]),
    ):
        rows.append((label, f"{key} not set" if value is None else f"{key}={value}"))
    if report["scaled_by_yarnlib"]:
        exact = "exactly" if report["restorable_exactly"] else "(settings only)"
        rows.append(("written by yarnlib", f"yes; --reset restores the native files {exact}"))
    problems = report["inconsistencies"]
    rows.append(("consistent", "no" if problems else "yes"))
    lines += [f"  {label:<19} {value}" for label, value in rows]
    lines += [f"  - {p}" for p in problems]
    return "\n".join(lines)


def _requested(args: argparse.Namespace) -> dict[str, Any]:
    """The rope options given on the command line."""
    given = {
        "method": args.method,
        "factor": args.factor,
        "original_max_position_embeddings": args.original_max_position_embeddings,
        **{k: getattr(args, k) for k in KNOBS},
    }
    if args.no_truncate:
        given["truncate"] = False
    return {k: v for k, v in given.items() if v is not None}


def locked(args: argparse.Namespace) -> int:
    """``run``, holding the folder's lock for the whole command when it rewrites in place: a
    second rewrite meanwhile is refused as busy (exit 2), not raced."""
    if not args.in_place:
        return run(args)
    if Path(args.model_dir).resolve() == smollm2_cache().resolve():
        raise ValueError(
            f"in_place: {args.model_dir} is yarnlib's copy of the packaged SmolLM2 that every "
            "`--model smollm2` loads; allowed: --output DIR (a new folder) or --dry-run"
        )
    with atomic.lock_folder(args.model_dir):
        return run(args)


def run(args: argparse.Namespace) -> int:
    requested = _requested(args)
    if args.spec and requested:
        options = ", ".join("--" + k.replace("_", "-") for k in requested)
        raise ValueError(f"spec: {args.spec} is the whole spec; drop {options}")
    changing = bool(requested or args.spec) or args.reset or args.format != "auto"
    if args.show or args.check or not changing:
        if changing:
            raise ValueError("--show/--check only report; drop them to change the files")
        report = files.show(args.model_dir, args.vllm_version)
        print(json.dumps(report, indent=2) if args.json else format_report(report))
        return 1 if args.check and report["inconsistencies"] else 0
    if args.reset and (requested or args.spec):
        raise ValueError("--reset restores the native settings: give it without --method/--factor")
    if args.json:
        raise ValueError("--json applies to --show only")
    if not (args.dry_run or args.in_place or args.output):
        raise ValueError(
            "nothing written: pass --in-place (keeps a .bak of each file), --output DIR "
            "(a new folder) or --dry-run (print the diff only)"
        )
    if args.in_place and args.output:
        raise ValueError("give either --in-place or --output DIR, not both")
    if args.in_place:
        for path in files.complete_interrupted(args.model_dir):
            print(f"wrote {path} (completing an interrupted rewrite)")
    spec = None
    if args.spec:
        spec = spec_on_model(args.spec, files.current_spec(args.model_dir))
    elif requested:
        spec = files.target_spec(args.model_dir, **requested)
    elif not args.reset:  # --format alone: the settings the folder runs now, in that format
        spec = files.current_spec(args.model_dir)
    if spec is not None:  # what the rollout's vLLM reads from the file must be what runs
        versions.check_config_file(spec, versions.target(args.vllm_version))
    changes = files.plan(args.model_dir, spec, reset=args.reset, format=args.format)
    if args.dry_run:
        sys.stdout.write(files.diff(changes) or "no changes\n")
        return 0
    written = files.apply(
        args.model_dir,
        changes,
        in_place=args.in_place,
        output=args.output,
        weights=args.weights,
    )
    if args.output:
        print(f"wrote {args.output} (weights: {args.weights})")
    print("\n".join(f"wrote {p}" for p in written) or "no changes: the files already say this")
    print(format_report(files.show(args.output or args.model_dir, args.vllm_version)))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "config",
        help="show or rewrite a model folder's RoPE settings (config.json, tokenizer_config.json)",
        description="Without options: show the RoPE settings transformers and vLLM read from "
        "MODEL_DIR and what disagrees. With --method/--factor: rewrite config.json (and "
        "model_max_length / max_length) to run that scaling; --reset restores the native files. "
        "A change needs --in-place, --output DIR or --dry-run.",
    )
    add_model_argument(parser, "model_dir", folder=True)
    report = parser.add_argument_group("report")
    report.add_argument("--show", action="store_true", help="report only (the default)")
    report.add_argument("--check", action="store_true", help="exit 1 on any inconsistency")
    report.add_argument("--json", action="store_true", help="the report as JSON")
    rope = parser.add_argument_group("rope settings to write")
    rope.add_argument("--method", help=f"one of {', '.join(METHODS)} (or an alias); default yarn")
    rope.add_argument("--factor", type=float, help="context multiplier s (>= 1)")
    rope.add_argument(
        "--original-max-position-embeddings",
        type=int,
        help="the pre-training context L (default: the one in the config)",
    )
    for knob in KNOBS:
        rope.add_argument("--" + knob.replace("_", "-"), type=float, help="YaRN knob")
    rope.add_argument("--no-truncate", action="store_true", help="YaRN: truncate=False")
    rope.add_argument("--spec", metavar="FILE", help="a spec file (best.json of yarnlib tune)")
    rope.add_argument(
        "--format",
        choices=files.FORMATS,
        default="auto",
        help="v4: rope_theta + rope_scaling; v5: rope_parameters; auto: as the file is "
        "(v4 for a file without rope settings)",
    )
    rope.add_argument("--reset", action="store_true", help="restore the native settings")
    parser.add_argument(
        "--vllm-version",
        help="the vLLM that will read the folder (default: the installed one, else the newest "
        "version read): what the report says vLLM runs; a method it would run otherwise "
        "than transformers is refused",
    )
    write = parser.add_argument_group("writing")
    write.add_argument("--dry-run", action="store_true", help="print a unified diff only")
    write.add_argument("--in-place", action="store_true", help="rewrite MODEL_DIR (keeps .bak)")
    write.add_argument("--output", metavar="DIR", help="write a new folder, source untouched")
    write.add_argument(
        "--weights",
        choices=files.WEIGHTS,
        default="symlink",
        help="with --output: symlink (default) or copy the weight files",
    )
    parser.set_defaults(func=locked)
