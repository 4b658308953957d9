"""``vllm.LLM`` keyword arguments and ``vllm serve`` flags that run a ``RopeScaling``.

Native methods go through ``convert.to_vllm``; the dynamic ones are written under a
yarnlib rope type that only the yarnlib vLLM plugin understands (see ``plugin.py``).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from yarnlib import convert
from yarnlib.spec import RopeScaling
from yarnlib.vllm import versions

# rope_type of each method vLLM runs through the plugin. dynamic_yarn keeps the type it has
# in config.json (one name per method everywhere); dynamic_ntk gets its own type because
# vLLM's native "dynamic" (which config.json uses for transformers) must stay vLLM's.
PLUGIN_TYPES = {"dynamic_yarn": convert.HF_DYNAMIC_YARN, "dynamic_ntk": "yarnlib_dynamic_ntk"}
# vLLM cannot rescale per request, so a plugin type must name the one sequence length whose
# scale it runs (see plugin.py); the plugin refuses a config without it.
FIXED_SCALE_LENGTH = "fixed_scale_length"


def plugin_rope_parameters(spec: RopeScaling, fixed_scale_length: int) -> dict[str, Any]:
    params = {
        "rope_type": PLUGIN_TYPES[spec.method],
        "rope_theta": spec.rope_theta,
        "factor": spec.factor,
        "original_max_position_embeddings": spec.original_max_position_embeddings,
        FIXED_SCALE_LENGTH: fixed_scale_length,
    }
    params.update(spec.knobs())
    return params


def llm_kwargs(
    spec: RopeScaling,
    max_model_len: int | None = None,
    *,
    head_dim: int | None = None,
    vllm_version: str | None = None,
) -> dict[str, Any]:
    """``hf_overrides`` (always with ``rope_theta`` and the raised ``max_position_embeddings``)
    and ``max_model_len`` (default L × s) for ``vllm.LLM`` of ``vllm_version`` (default: the
    installed one, else the newest read; see ``versions``).

    ``head_dim`` (the model's) says how much of a head rotates; without it the rope dict names
    ``rope_dim``, which vLLM reads from 0.24 on. For dynamic methods the overrides fix the
    scale at ``max_model_len`` (``fixed_scale_length``): vLLM then runs ``spec`` as
    transformers does on a sequence of that length.
    """
    version = versions.target(vllm_version)
    versions.check_supported(spec, version)
    if max_model_len is not None:
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int):
            raise ValueError(f"max_model_len must be a positive integer, got {max_model_len!r}")
        limit = spec.max_position_embeddings
        if max_model_len <= 0 or (limit is not None and max_model_len > limit):
            raise ValueError(
                f"max_model_len must be in 1..{limit} (original × factor), got {max_model_len!r}"
            )
    if not spec.is_dynamic:
        params = convert.native_rope_parameters(spec)
    else:
        params = plugin_rope_parameters(spec, max_model_len or spec.max_position_embeddings)
    params.update(versions.yarn_attention_keys(spec, version))
    params.update(versions.longrope_keys(spec))
    rotary = versions.rotary_keys(spec.rotary_dim, head_dim, version)
    params.update(rotary)
    kwargs = convert.vllm_kwargs(spec, params)
    overrides = kwargs["hf_overrides"]
    if versions.parse(version) < versions.TRANSFORMERS_5_SINCE:
        overrides["rope_scaling"] = dict(params)  # see versions: read under transformers 4
    if "partial_rotary_factor" in rotary:  # read at the top level up to 0.12
        overrides["partial_rotary_factor"] = rotary["partial_rotary_factor"]
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    return kwargs


def serve_args(model: str, kwargs: dict[str, Any]) -> list[str]:
    """The ``vllm serve`` argument list equal to ``vllm.LLM(model, **kwargs)``."""
    if model.startswith("-"):  # else vllm serve would take the folder for an option
        model = f"./{model}"
    args = [model, "--hf-overrides", json.dumps(kwargs["hf_overrides"], separators=(",", ":"))]
    if kwargs.get("max_model_len") is not None:
        args += ["--max-model-len", str(kwargs["max_model_len"])]
    return args


def serve_command(model: str, kwargs: dict[str, Any]) -> str:
    return "vllm serve " + " ".join(shlex.quote(a) for a in serve_args(model, kwargs))
