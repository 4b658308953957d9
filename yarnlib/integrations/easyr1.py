"""EasyR1 (``verl.trainer.main``): one RoPE for actor and rollout via the checkpoint's config.json.

EasyR1's vLLM rollout takes no config overrides: it reads ``worker.actor.model.model_path``
itself. So the checkpoint's config.json is rewritten (``yarnlib.config``, the
``yarnlib config`` command) and both the actor and the rollout load it; the actor's
``override_config`` must then carry no rope keys of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from yarnlib.integrations.common import (
    load,
    refuse_rope_keys,
    require_destination,
    require_model_folder,
    require_rollout_reads,
    require_static,
    rewrite_model_folder,
    same_checkpoint_paths,
    section,
    sequence_length,
)
from yarnlib.spec import RopeScaling
from yarnlib.vllm import versions


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
    require_destination(output, in_place, "easyr1")
    cfg = load(cfg)
    require_static(spec, "EasyR1")
    require_rollout_reads(spec, vllm_version, versions.FRAMEWORK_VERSIONS["EasyR1"])
    model = section(cfg, "worker.actor.model")
    require_model_folder(model, "model_path", "worker.actor.model.model_path")
    override = model.get("override_config")
    refuse_rope_keys(override, "worker.actor.model.override_config", "the actor")
    total = sequence_length(cfg, spec, "max_prompt_length", "max_response_length")
    max_model_len = total or spec.max_position_embeddings
    critic = ("worker.critic.model.model_path",)
    shared = same_checkpoint_paths(cfg, critic, model["model_path"], max_model_len)
    rewrite_model_folder(model, "model_path", spec, output, in_place)
    for node, key in shared:
        node[key] = model["model_path"]
    rollout = section(cfg, "worker.rollout")
    rollout["max_model_len"] = max_model_len
    # EasyR1 disables chunked prefill by default; vLLM then needs budget >= max_model_len.
    budget = rollout.get("max_num_batched_tokens") or 8192
    rollout["max_num_batched_tokens"] = max(budget, max_model_len)
    return cfg
