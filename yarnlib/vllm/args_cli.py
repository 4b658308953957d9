"""``yarnlib vllm-args``: the ``vllm.LLM`` kwargs and ``vllm serve`` flags for a model folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from yarnlib.config.files import CONFIG, check_one_original, current_spec, read_files
from yarnlib.convert import head_dim_of
from yarnlib.model_arg import add_model_argument
from yarnlib.spec import METHODS, RopeScaling
from yarnlib.spec_file import spec_on_model
from yarnlib.vllm import versions
from yarnlib.vllm.kwargs import FIXED_SCALE_LENGTH, llm_kwargs, serve_command


def spec_for_model(
    model_dir: str | Path, method: str, factor: float, original: int | None = None
) -> RopeScaling:
    """``method`` at ``factor`` on the *unscaled* model in ``model_dir`` (never compounded)."""
    native = current_spec(model_dir)
    if original is None and not native.is_checkpoint_scaling:
        check_one_original(json.loads(read_files(model_dir)[CONFIG]))
    return native.rescaled(method, factor, original)


# Up to 0.12 only vLLM's Llama code passes config.partial_rotary_factor to get_rope.
LLAMA_READERS = frozenset({"llama"})


def model_kwargs(
    model_dir: str | Path,
    spec: RopeScaling,
    max_model_len: int | None = None,
    vllm_version: str | None = None,
) -> dict:
    """``llm_kwargs`` for the model in ``model_dir`` (its head_dim: see ``versions``)."""
    config = json.loads(read_files(model_dir)[CONFIG])
    version = versions.target(vllm_version)
    if spec.rotary_dim != head_dim_of(config) and config.get("model_type") not in LLAMA_READERS:
        if versions.parse(version) < versions.PARTIAL_IN_DICT_SINCE:
            raise ValueError(
                f"partial_rotary_factor: vLLM {version} reads it for Llama-type models only "
                f"(model_type {config.get('model_type')!r} would rotate the whole head); use "
                "vLLM >= 0.14"
            )
    if max_model_len is None and spec.max_position_embeddings is None:
        max_model_len = config.get("max_position_embeddings")  # llama3: what the config states
    return llm_kwargs(spec, max_model_len, head_dim=head_dim_of(config), vllm_version=version)


def spec_from_args(args: argparse.Namespace) -> RopeScaling:
    """``--spec FILE`` (exactly that spec), ``--method``/``--factor`` on the unscaled model, or
    with neither, the scaling the folder's config.json records."""
    options = ("method", "factor", "original_max_position_embeddings")
    if args.spec:
        given = ["--" + o.replace("_", "-") for o in options if getattr(args, o) is not None]
        if given:
            raise ValueError(f"spec: {args.spec} is the whole spec; drop {', '.join(given)}")
        return spec_on_model(args.spec, current_spec(args.model_dir))
    if args.factor is None:
        recorded = current_spec(args.model_dir)
        if recorded.method != "none" and args.method is None:
            return recorded  # the folder's own scaling (`yarnlib config` wrote it, or it ships)
        raise ValueError(
            "factor: required (e.g. --factor 4) for a folder whose config.json does not scale the "
            "RoPE, or a spec file with --spec FILE"
        )
    return spec_for_model(
        args.model_dir,
        "yarn" if args.method is None else args.method,
        args.factor,
        args.original_max_position_embeddings,
    )


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser, "model_dir", folder=True)
    parser.add_argument("--method", help=f"one of {', '.join(METHODS)}; default yarn")
    parser.add_argument(
        "--factor",
        type=float,
        help="context multiplier s (>= 1); default: the scaling config.json records",
    )
    parser.add_argument("--spec", metavar="FILE", help="a spec file (best.json of yarnlib tune)")
    parser.add_argument(
        "--original-max-position-embeddings",
        type=int,
        help="pre-training context L (default: read from config.json)",
    )
    parser.add_argument("--max-model-len", type=int, help="default: L × factor")


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    version = versions.target(args.vllm_version)
    kwargs = model_kwargs(args.model_dir, spec, args.max_model_len, version)
    if args.json:
        print(json.dumps({"model": args.model_dir, **kwargs}, indent=2))
        return 0
    print(f"# {spec.describe()}")
    if not versions.is_read(version):
        print(
            f"# vLLM {version}: its source was not read (read: "
            f"{', '.join(versions.READ_VERSIONS)}); the overrides follow the nearest read "
            "versions: check them with `yarnlib check-rollout`"
        )
    if spec.is_dynamic:
        print(
            "# needs the yarnlib vLLM plugin (installed with yarnlib); vLLM cannot rescale per "
            "request, so the scale is fixed at fixed_scale_length="
            f"{kwargs['hf_overrides']['rope_parameters'][FIXED_SCALE_LENGTH]} tokens"
        )
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    print(f"LLM(model={args.model_dir!r}, {shown})")
    print(serve_command(args.model_dir, kwargs))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "vllm-args",
        help="vllm.LLM kwargs and `vllm serve` flags that run a scaling method",
        description="Print the vllm.LLM keyword arguments and the equivalent `vllm serve` "
        "flags (hf_overrides with rope_theta and max_position_embeddings, max_model_len).",
    )
    add_spec_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the LLM kwargs as JSON")
    parser.add_argument(
        "--vllm-version",
        help="the vLLM that will read the overrides (default: the installed one, else "
        f"{versions.NEWEST_READ}); sources read: {', '.join(versions.READ_VERSIONS)}",
    )
    parser.set_defaults(func=run)
