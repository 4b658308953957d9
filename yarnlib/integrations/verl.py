"""verl (``verl.trainer.main_ppo``, FSDP actor + vLLM rollout): one RoPE for actor and rollout.

verl applies ``actor_rollout_ref.model.override_config`` to the actor's (and reference
model's) transformers config only; its vLLM server reads config.json and receives
``actor_rollout_ref.rollout.engine_kwargs.vllm`` as extra engine arguments. ``apply`` writes
the rope settings to both, with ``rope_theta`` inside the rope dict (transformers 5 and
vLLM drop it otherwise), and sets the rollout's ``max_model_len`` to prompt + response.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from yarnlib import convert
from yarnlib.integrations.common import (
    load,
    local_head_dim,
    require_static,
    section,
    sequence_length,
)
from yarnlib.spec import RopeScaling
from yarnlib.vllm import llm_kwargs, versions


def actor_override(spec: RopeScaling) -> dict[str, Any]:
    """``override_config`` keys (verl documents ``rope_scaling``) that run ``spec``."""
    keys = convert.to_hf(spec, "v4")
    params = convert.native_rope_parameters(spec)  # rope_theta inside: see module docstring
    return {
        "rope_theta": params["rope_theta"],
        "rope_scaling": params,
        "max_position_embeddings": keys["max_position_embeddings"],
    }


def apply(
    cfg: Mapping[str, Any] | str | Path, spec: RopeScaling, vllm_version: str | None = None
) -> dict[str, Any]:
    """A copy of the verl PPO/GRPO config ``cfg`` whose actor and rollout run ``spec``
    (the rollout's overrides for ``vllm_version``: default the installed vLLM, else 0.24.0,
    which verl 0.9.1 pins)."""
    cfg = load(cfg)
    require_static(spec, "verl")
    total = sequence_length(cfg, spec, "max_prompt_length", "max_response_length")
    model = section(cfg, "actor_rollout_ref.model")
    head_dim = local_head_dim(model.get("path"))
    version = versions.target(vllm_version, versions.FRAMEWORK_VERSIONS["verl"])
    kwargs = llm_kwargs(spec, max_model_len=total, head_dim=head_dim, vllm_version=version)
    model["override_config"] = {**(model.get("override_config") or {}), **actor_override(spec)}
    rollout = section(cfg, "actor_rollout_ref.rollout")
    rollout["max_model_len"] = kwargs["max_model_len"]
    section(cfg, "actor_rollout_ref.rollout.engine_kwargs.vllm")["hf_overrides"] = kwargs[
        "hf_overrides"
    ]
    # Without chunked prefill vLLM refuses a token budget below max_model_len.
    if rollout.get("enable_chunked_prefill") is False:
        budget = rollout.get("max_num_batched_tokens") or 0
        rollout["max_num_batched_tokens"] = max(budget, kwargs["max_model_len"])
    actor = section(cfg, "actor_rollout_ref.actor")
    if actor.get("use_dynamic_bsz"):  # a packed micro-batch must hold one whole sequence
        budget = actor.get("ppo_max_token_len_per_gpu") or 0
        actor["ppo_max_token_len_per_gpu"] = max(budget, kwargs["max_model_len"])
    return cfg
