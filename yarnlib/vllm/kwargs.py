"""``vllm.LLM`` keyword arguments and ``vllm serve`` flags that run a ``RopeScaling``.

What vLLM reads lives here (and in ``versions``); ``RopeScaling.to_vllm`` calls ``to_vllm``.
Static methods are written as config.json has them (``convert.native_rope_parameters``); the
dynamic ones under a yarnlib rope type that only the yarnlib vLLM plugin understands
(see ``plugin.py``).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from yarnlib import convert
from yarnlib.spec import STATIC_METHODS, RopeScaling
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


def to_vllm(
    spec: RopeScaling, head_dim: int | None = None, vllm_version: str | None = None
) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments that run ``spec`` with vLLM's own rotary embeddings
    (``llm_kwargs``: ``head_dim`` and ``vllm_version`` are explained there)."""
    if spec.is_dynamic:
        raise ValueError(
            f"method {spec.method!r} has no native vLLM equivalent (vLLM's 'dynamic' rope is "
            "no substitute: up to 0.21 it fixes the NTK scale at max_position_embeddings × factor, "
            "from 0.22 it runs plain RoPE over max_position_embeddings rows); natively vLLM runs: "
            f"{', '.join(STATIC_METHODS)}; for this one use yarnlib.vllm.llm_kwargs (yarnlib's "
            "plugin)"
        )
    return llm_kwargs(spec, head_dim=head_dim, vllm_version=vllm_version)


def engine_kwargs(spec: RopeScaling, rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """``hf_overrides`` and ``max_model_len`` running ``rope_parameters`` for ``spec``."""
    # A dict-valued override replaces vLLM's whole rope_parameters: without rope_theta
    # inside it, theta silently falls back to 10000.
    overrides: dict[str, Any] = {
        "rope_parameters": rope_parameters,
        "rope_theta": rope_parameters["rope_theta"],
    }
    kwargs: dict[str, Any] = {"hf_overrides": overrides}
    if spec.max_position_embeddings is not None:
        # The key as config.json has it (vLLM multiplies it by factor for linear and for
        # types it does not know, and does not for yarn), and the extended length outright.
        overrides["max_position_embeddings"] = convert.config_max_position_embeddings(spec)
        kwargs["max_model_len"] = spec.max_position_embeddings
    return kwargs


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
    kwargs = engine_kwargs(spec, params)
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
