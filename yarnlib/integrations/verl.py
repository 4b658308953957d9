"""verl (``verl.trainer.main_ppo``, FSDP actor + vLLM rollout): one RoPE for actor and rollout.

verl applies ``actor_rollout_ref.model.override_config`` with ``update_model_config``, which
walks nested dicts and sets one attribute at a time: a rope dict lands on the config's
existing rope dict and fails (``'dict' object has no attribute 'rope_type'``, verl 0.9.1 on
transformers 5), and its vLLM server reads config.json anyway. So, as for EasyR1, the
checkpoint's config.json is rewritten (``yarnlib.config``, the ``yarnlib config``
command) and ``actor_rollout_ref.model.path`` points at it: actor, reference model and
rollout load the same file, and verl's rollout check (``max_model_len`` ≤ the config's
``max_position_embeddings``) sees the scaled length.
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

MODEL = "actor_rollout_ref.model"
# The other model paths of verl 0.9.1's ppo_trainer.yaml (legacy and new reward model sections).
OTHER_MODELS = ("critic.model.path", "reward_model.model.path", "reward.reward_model.model_path")
HF_OVERRIDES = "actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides"


def actor_length(spec: RopeScaling) -> dict[str, int]:
    """``override_config`` for verl's rollout check, which refuses a ``max_model_len`` above
    the actor config's ``max_position_embeddings``: a linear config.json keeps L there (vLLM
    multiplies it by the factor itself), so the actor config is told L × s (transformers'
    linear RoPE does not read it)."""
    if spec.method != "linear":
        return {}
    return {"max_position_embeddings": spec.max_position_embeddings}


def apply(
    cfg: Mapping[str, Any] | str | Path,
    spec: RopeScaling,
    *,
    output: str | Path | None = None,
    in_place: bool = False,
    vllm_version: str | None = None,
) -> dict[str, Any]:
    """A copy of the verl PPO/GRPO config ``cfg`` whose actor and rollout run ``spec``; the
    folder at ``actor_rollout_ref.model.path`` is rewritten into ``output`` (weights symlinked,
    the path then points there) or ``in_place`` (keeping a ``.bak``), as in ``easyr1.apply``.
    ``vllm_version``: the rollout's vLLM (default: the installed one, else 0.24.0, verl 0.9.1's
    pin)."""
    require_destination(output, in_place, "verl")
    cfg = load(cfg)
    require_static(spec, "verl")
    require_rollout_reads(spec, vllm_version, versions.FRAMEWORK_VERSIONS["verl"])
    model = section(cfg, MODEL)
    require_model_folder(model, "path", f"{MODEL}.path")
    if model.get("hf_config_path"):
        raise ValueError(
            f"{MODEL}.hf_config_path: remove it ({model['hf_config_path']!r}); the actor would "
            "read that config while the rollout reads the rewritten config.json"
        )
    override = model.get("override_config") or {}
    length = actor_length(spec)
    user_keys = {k: v for k, v in override.items() if (k, v) not in length.items()}
    refuse_rope_keys(user_keys, f"{MODEL}.override_config", "the actor")
    nested = override.get("model_config")  # verl applies this one instead when present
    refuse_rope_keys(nested, f"{MODEL}.override_config.model_config", "the actor")
    rollout = section(cfg, "actor_rollout_ref.rollout")
    vllm_kwargs = (rollout.get("engine_kwargs") or {}).get("vllm") or {}
    refuse_rope_keys(vllm_kwargs.get("hf_overrides"), HF_OVERRIDES, "the rollout")
    total = sequence_length(cfg, spec, "max_prompt_length", "max_response_length")
    max_model_len = total or spec.max_position_embeddings
    shared = same_checkpoint_paths(cfg, OTHER_MODELS, model["path"], max_model_len)
    rewrite_model_folder(model, "path", spec, output, in_place)
    for node, key in shared:
        node[key] = model["path"]
    if length:
        model["override_config"] = {**override, **length}
    rollout["max_model_len"] = max_model_len
    # Without chunked prefill vLLM refuses a token budget below max_model_len.
    if rollout.get("enable_chunked_prefill") is False:
        budget = rollout.get("max_num_batched_tokens") or 0
        rollout["max_num_batched_tokens"] = max(budget, max_model_len)
    actor = section(cfg, "actor_rollout_ref.actor")
    if actor.get("use_dynamic_bsz"):  # a packed micro-batch must hold one whole sequence
        budget = actor.get("ppo_max_token_len_per_gpu") or 0
        needed = whole_sequence_budget(actor, max_model_len)
        actor["ppo_max_token_len_per_gpu"] = max(budget, needed)
    return cfg


def whole_sequence_budget(actor: Mapping[str, Any], max_model_len: int) -> int:
    """The least ``ppo_max_token_len_per_gpu`` that packs one ``max_model_len`` sequence: verl
    packs up to that budget × the Ulysses degree per micro-batch (``prepare_micro_batches``)
    and splits it over the sp ranks, so a larger budget would put more tokens on each GPU
    than a plan made for one sequence per micro-batch."""
    sp = actor.get("ulysses_sequence_parallel_size") or 1
    return -(-max_model_len // sp)
