"""TRL's ``GRPOTrainer``: one RoPE for the actor and every rollout mode.

TRL's rollouts never see a RoPE patched in memory: ``model.generate`` runs the actor, but
colocated vLLM builds ``vllm.LLM(model=model.name_or_path, max_model_len=...)`` without
``hf_overrides`` and only pushes weights afterwards, and ``trl vllm-serve`` loads the folder
too. So ``apply`` writes a scaled model folder (config.json rewritten as by
``yarnlib config --output``, weights symlinked) that the actor and all rollouts load, and a
``GRPOConfig`` whose lengths fit the spec.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from yarnlib import config
from yarnlib.integrations.common import require_static
from yarnlib.spec import RopeScaling


def _config(args: Any):
    from trl import GRPOConfig

    if args is None:
        return GRPOConfig(output_dir="grpo")
    if isinstance(args, GRPOConfig):
        return copy.deepcopy(args)  # not dataclasses.replace: __post_init__ must not run twice
    if isinstance(args, Mapping):
        return GRPOConfig(**args)
    raise ValueError(
        f"args must be a trl.GRPOConfig or a dict of its fields, got {type(args).__name__}"
    )


def _positive(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")
    return value


def model_folder(model: str | Path) -> Path:
    """A local folder with config.json: ``model`` itself, or the hub snapshot of that id."""
    path = Path(model)
    if not path.exists() and not str(model).startswith((".", "/")) and str(model).count("/") == 1:
        from huggingface_hub import snapshot_download

        try:
            path = Path(snapshot_download(str(model)))
        except Exception as error:  # offline, unknown id, no access: all mean "no folder"
            raise ValueError(
                f"model: {str(model)!r} is neither a local folder nor a downloadable hub id "
                f"({type(error).__name__}: {error})"
            ) from None
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model: {str(model)!r} is not a model folder with config.json; the actor and the "
            "vLLM rollout both load the scaled folder yarnlib writes from it"
        )
    return path


def lengths(spec: RopeScaling, args, max_prompt_length: int | None) -> int:
    """vLLM's max_model_len: prompt + completion when the prompt length is known, else L × s;
    refused when it exceeds what the spec covers (L × s)."""
    limit = spec.max_position_embeddings
    completion = _positive("args.max_completion_length", args.max_completion_length)
    if max_prompt_length is not None:
        total = _positive("max_prompt_length", max_prompt_length) + completion
        if total > limit:
            raise ValueError(
                f"max_prompt_length + args.max_completion_length = {max_prompt_length} + "
                f"{completion} = {total} exceeds what {spec.describe()} covers ({limit} = "
                "original × factor); raise factor or shorten them"
            )
    else:
        total = limit
    chosen = args.vllm_max_model_length
    if chosen is None:
        return total
    _positive("args.vllm_max_model_length", chosen)
    low = total if max_prompt_length is not None else 1
    if not low <= chosen <= limit:
        raise ValueError(
            f"args.vllm_max_model_length must be in {low}..{limit} (prompt + completion .. "
            f"original × factor), got {chosen}; or leave it None"
        )
    return chosen


def apply(
    model: str | Path,
    spec: RopeScaling,
    args: Any = None,
    *,
    output: str | Path,
    max_prompt_length: int | None = None,
) -> tuple[str, Any]:
    """``(model_path, args)``: the scaled model folder ``output`` to give
    ``GRPOTrainer(model=model_path)``, and a new ``GRPOConfig`` with ``vllm_max_model_length``
    set (prompt + completion, or L × s). Everything is checked before anything is written.

    ``args`` is a ``trl.GRPOConfig`` or its keyword arguments; GRPOConfig has no prompt
    length, so give ``max_prompt_length`` to have prompt + completion checked against L × s.
    Dynamic methods are refused with vLLM rollouts (vLLM fixes the scale once per engine).
    """
    args = _config(args)
    if args.use_vllm:
        require_static(spec, "TRL (use_vllm=True)")
    max_model_len = lengths(spec, args, max_prompt_length)
    source = model_folder(model)
    config.apply(source, config.plan(source, spec), output=output)
    args.vllm_max_model_length = max_model_len
    return str(output), args


def server_command(model_path: str, args) -> str:
    """``trl vllm-serve`` for ``vllm_mode="server"``: the scaled folder carries the RoPE, so no
    ``--hf-overrides`` are needed; the length is TRL's ``vllm_max_model_length``."""
    argv = ["trl", "vllm-serve", "--model", str(model_path)]
    if args.vllm_max_model_length is not None:
        argv += ["--max-model-len", str(args.vllm_max_model_length)]
    return " ".join(shlex.quote(a) for a in argv)
