"""EasyR1 (``verl.trainer.main``): one RoPE for actor and rollout via the checkpoint's config.json.

EasyR1's vLLM rollout takes no config overrides: it reads ``worker.actor.model.model_path``
itself. So the checkpoint's config.json is rewritten (``yarnlib.config_files``, the
``yarnlib config`` command) and both the actor and the rollout load it; the actor's
``override_config`` must then carry no rope keys of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from yarnlib import config_files
from yarnlib.integrations.common import (
    load,
    local_head_dim,
    require_static,
    section,
    sequence_length,
)
from yarnlib.spec import RopeScaling
from yarnlib.vllm import llm_kwargs, versions

ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")


def apply(
    cfg: Mapping[str, Any] | str | Path,
    spec: RopeScaling,
    *,
    output: str | Path | None = None,
    in_place: bool = False,
    vllm_version: str | None = None,
) -> dict[str, Any]:
    """A copy of the EasyR1 config ``cfg`` whose actor and rollout run ``spec``.

    The model folder is rewritten into ``output`` (a new folder, weights symlinked; the
    config then points at it) or ``in_place`` (a ``.bak`` of each changed file is kept).
    ``vllm_version``: the rollout's vLLM (default: the installed one, else 0.11.0, EasyR1's
    image).
    """
    if in_place == (output is not None):
        raise ValueError("easyr1.apply: give exactly one of output=DIR or in_place=True")
    cfg = load(cfg)
    require_static(spec, "EasyR1")
    model = section(cfg, "worker.actor.model")
    path = model.get("model_path")
    if not path or not (Path(path) / "config.json").is_file():
        raise ValueError(
            f"worker.actor.model.model_path: {path!r} is not a local model folder with "
            "config.json; EasyR1's rollout reads that file, so download the model first"
        )
    clashing = sorted(set(model.get("override_config") or {}) & set(ROPE_KEYS))
    if clashing:
        raise ValueError(
            f"worker.actor.model.override_config: remove {clashing}; they would reach the actor "
            "only, while the rewritten config.json serves actor and rollout alike"
        )
    total = sequence_length(cfg, spec, "max_prompt_length", "max_response_length")
    version = versions.target(vllm_version, versions.FRAMEWORK_VERSIONS["EasyR1"])
    if versions.yarn_attention_keys(spec, version):
        if versions.parse(version) < versions.ATTENTION_FACTOR_SINCE:
            raise ValueError(
                f"{spec.describe()}: the rollout's vLLM {version} reads the YaRN attention "
                "factor from config.json only as 0.1·ln(s)+1 (attention_factor and mscale are "
                "read from vLLM 0.32 on), so actor and rollout would differ; use method yarn "
                "without attention knobs, or vLLM >= 0.32"
            )
    kwargs = llm_kwargs(
        spec, max_model_len=total, vllm_version=version, head_dim=local_head_dim(path)
    )
    changes = config_files.plan(path, spec)
    config_files.apply(path, changes, in_place=in_place, output=output)
    if output is not None:
        model["model_path"] = str(output)
    rollout = section(cfg, "worker.rollout")
    rollout["max_model_len"] = kwargs["max_model_len"]
    # EasyR1 disables chunked prefill by default; vLLM then needs budget >= max_model_len.
    budget = rollout.get("max_num_batched_tokens") or 8192
    rollout["max_num_batched_tokens"] = max(budget, kwargs["max_model_len"])
    return cfg
