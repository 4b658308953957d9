"""The yarnlib vLLM plugin (entry point group ``vllm.general_plugins``).

vLLM has no registry of rotary embeddings: every model calls the function ``get_rope`` of
``vllm.model_executor.layers.rotary_embedding``, which dispatches on
``rope_parameters["rope_type"]`` and raises for a type it does not know. ``register``
wraps that function: a yarnlib rope type (``PLUGIN_TYPES``) builds yarnlib's rotary
embedding, every other call goes to vLLM's own function unchanged, with the same arguments,
so a model that names no yarnlib type gets exactly the object it got before.

Dynamic scaling: vLLM's rotary layer sees token positions only, never the request they
belong to, and reads one cos/sin table per layer; the prefix cache also shares KV blocks
between requests by token ids alone. A per-request scale therefore cannot be expressed
without changing vLLM's model runner. So the plugin refuses a yarnlib type unless its
``rope_parameters`` name the one sequence length whose scale every request runs
(``fixed_scale_length``; ``llm_kwargs`` writes max_model_len there): dynamic_yarn fixed at
M runs as static yarn with factor M / L, as transformers does on a sequence of M tokens.
"""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

from yarnlib.spec import YARN_KNOB_DEFAULTS, RopeScaling
from yarnlib.vllm.kwargs import FIXED_SCALE_LENGTH, PLUGIN_TYPES

logger = logging.getLogger(__name__)
METHOD_OF_TYPE = {rope_type: method for method, rope_type in PLUGIN_TYPES.items()}
_ROTARY_CACHE: dict[tuple, Any] = {}


def spec_from_rope_parameters(params: dict[str, Any], rotary_dim: int) -> RopeScaling:
    """The spec a yarnlib ``rope_parameters`` dict (as ``llm_kwargs`` writes it) names."""
    rope_type = params["rope_type"]
    if params.get("rope_theta") is None:
        # vLLM would silently use 10000; refuse instead.
        raise ValueError(
            f"rope_parameters.rope_theta: missing for rope_type {rope_type!r}; a dict "
            "hf_overrides replaces vLLM's whole rope_parameters, so it must carry rope_theta"
        )
    knobs = {k: params[k] for k in YARN_KNOB_DEFAULTS if params.get(k) is not None}
    return RopeScaling(
        method=METHOD_OF_TYPE[rope_type],
        factor=params.get("factor", 1.0),
        original_max_position_embeddings=params.get("original_max_position_embeddings"),
        rope_theta=params["rope_theta"],
        rotary_dim=rotary_dim,
        **knobs,
    )


def fixed_scale_length(params: dict[str, Any]) -> int:
    length = params.get(FIXED_SCALE_LENGTH)
    if length is None:
        raise ValueError(
            f"rope_parameters.{FIXED_SCALE_LENGTH}: missing for rope_type "
            f"{params['rope_type']!r}. vLLM cannot rescale per request (its rotary layer sees "
            "positions, not requests), so yarnlib runs a dynamic method at the scale of one "
            f'sequence length that you name: add "{FIXED_SCALE_LENGTH}": N (normally '
            "max_model_len) to rope_parameters, as the hf_overrides printed by `yarnlib "
            "vllm-args MODEL_DIR --method METHOD --factor F` do"
        )
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(
            f"rope_parameters.{FIXED_SCALE_LENGTH}: must be a positive integer, got {length!r}"
        )
    return length


def engine_max_model_len() -> int | None:
    from vllm.config import get_current_vllm_config

    model_config = get_current_vllm_config().model_config
    return None if model_config is None else model_config.max_model_len


def yarnlib_rope(head_size, max_position, is_neox_style, rope_parameters, dtype):
    import torch

    from yarnlib.vllm.rotary import YarnlibRotaryEmbedding

    partial = rope_parameters.get("partial_rotary_factor", 1.0)
    rotary_dim = rope_parameters.get("rope_dim") or int(head_size * partial)
    spec = spec_from_rope_parameters(rope_parameters, rotary_dim)
    scale_len = fixed_scale_length(rope_parameters)
    # The model passes config.max_position_embeddings (L for these types); positions reach
    # max_model_len.
    cache_len = max(max_position, scale_len, engine_max_model_len() or 0)
    dtype = dtype or torch.get_default_dtype()
    key = (spec, head_size, cache_len, scale_len, is_neox_style, dtype)
    if key not in _ROTARY_CACHE:  # one table shared by all layers, as vLLM does
        logger.info(
            "yarnlib: %s runs with its scale fixed at %d tokens", spec.describe(), scale_len
        )
        _ROTARY_CACHE[key] = YarnlibRotaryEmbedding(
            spec, scale_len, head_size, cache_len, is_neox_style, dtype
        )
    return _ROTARY_CACHE[key]


def register() -> None:
    """Wrap vLLM's ``get_rope``; safe to call many times (vLLM loads plugins per process)."""
    from vllm.model_executor.layers import rotary_embedding

    original = rotary_embedding.get_rope
    if getattr(original, "yarnlib_wrapped", False):
        return
    signature = inspect.signature(original)

    def get_rope(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        params = bound.arguments.get("rope_parameters") or {}
        if params.get("rope_type") not in METHOD_OF_TYPE:
            return original(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        return yarnlib_rope(
            a["head_size"], a["max_position"], a["is_neox_style"], params, a["dtype"]
        )

    get_rope.yarnlib_wrapped = True
    get_rope.__wrapped__ = original
    get_rope.__doc__ = original.__doc__
    rotary_embedding.get_rope = get_rope
    # Model modules bind the name at import; rebind it in the ones already imported.
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm.") and getattr(module, "get_rope", None) is original:
            module.get_rope = get_rope
