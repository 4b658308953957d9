"""Conversions between ``RopeScaling`` and the dicts transformers and vLLM read.

transformers 4.x reads a top-level ``rope_theta`` plus ``rope_scaling``; 5.x reads
``rope_parameters`` with ``rope_theta`` inside (and still accepts the 4.x keys, giving
``rope_scaling`` priority). Methods neither system has are *lowered* to an equivalent
native form where one exists, and the exact spec is kept beside it under the key
``yarnlib_rope_scaling``, so a rewrite can always start again from the unscaled model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yarnlib.frequencies import ntk_theta
from yarnlib.hf_compat import hf_format
from yarnlib.spec import (
    FIELDS,
    KNOB_DEFAULTS,
    RAMP_METHODS,
    YARN_KNOB_DEFAULTS,
    YARN_METHODS,
    RopeScaling,
)

MARKER = "yarnlib_rope_scaling"
MARKER_FIX = f"; delete the key {MARKER!r} to take the rope settings as they are"
HF_DYNAMIC_YARN = "yarnlib_dynamic_yarn"
# The rope_type each method is written as in a config file.
NATIVE_TYPE = {
    "none": "default",
    "linear": "linear",
    "ntk": "default",
    "dynamic_ntk": "dynamic",
    "ntk_by_parts": "yarn",
    "yarn": "yarn",
    "dynamic_yarn": HF_DYNAMIC_YARN,
    "llama3": "llama3",
    "longrope": "longrope",
}
FROM_NATIVE_TYPE = {"default": "none", "linear": "linear", "dynamic": "dynamic_ntk", "yarn": "yarn"}
FROM_NATIVE_TYPE.update(llama3="llama3", longrope="longrope")
FROM_NATIVE_TYPE[HF_DYNAMIC_YARN] = "dynamic_yarn"
# Architectures whose configs may omit rope_theta (transformers then uses 10000).
ROPE_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3", "olmo2"}
)
DEFAULT_ROPE_THETA = 10000.0
# The keys of a rope dict yarnlib reads (transformers' validators know the same ones) or writes
# (short_mscale/long_mscale: vLLM's longrope attention factor). Any other key means a RoPE yarnlib
# would not reproduce and a rewrite would drop (M-RoPE's mrope_section in Qwen2.5-VL), so it is
# refused by name.
ROPE_DICT_KEYS = frozenset(
    {
        "rope_type",
        "type",
        "rope_theta",
        "factor",
        "original_max_position_embeddings",
        "partial_rotary_factor",
        *YARN_KNOB_DEFAULTS,
        "low_freq_factor",
        "high_freq_factor",
        "short_factor",
        "long_factor",
        "short_mscale",
        "long_mscale",
    }
)
# Where the two transformers lines read the original context L of yarn: 5.x (and vLLM, which
# loads configs with it) gives a top-level original_max_position_embeddings priority over the
# rope dict's; 4.x reads only the rope dict's. Both fall back to max_position_embeddings.
ORIGINAL_READERS = ("transformers 5 and vLLM", "transformers 4")


def native_rope_parameters(spec: RopeScaling) -> dict[str, Any]:
    """The ``rope_parameters`` dict (v5 form, ``rope_theta`` inside) that runs ``spec``."""
    method = spec.method
    if method in ("none", "ntk"):
        theta = spec.rope_theta
        if method == "ntk":
            theta = ntk_theta(spec.rope_theta, spec.rotary_dim, spec.factor)
        return {"rope_type": "default", "rope_theta": theta}
    params: dict[str, Any] = {
        "rope_type": NATIVE_TYPE[method],
        "rope_theta": spec.rope_theta,
        "factor": spec.factor,
    }
    if method in RAMP_METHODS:
        params["original_max_position_embeddings"] = spec.original_max_position_embeddings
        params.update(spec.knobs())
    if method == "ntk_by_parts":
        params["attention_factor"] = 1.0
    if method == "llama3":  # transformers and vLLM require every key
        params["original_max_position_embeddings"] = spec.original_max_position_embeddings
        params.update(low_freq_factor=spec.low_freq_factor, high_freq_factor=spec.high_freq_factor)
    if method == "longrope":
        params["original_max_position_embeddings"] = spec.original_max_position_embeddings
        params.update(short_factor=list(spec.short_factor), long_factor=list(spec.long_factor))
        if spec.fixed_attention_factor is not None:  # else derived from factor, as it was
            params["attention_factor"] = spec.fixed_attention_factor
        if spec.is_applied_longrope:  # vLLM reads longrope's attention factor only from these
            # (transformers warns that it does not know them, and runs attention_factor)
            attention = spec.fixed_attention_factor
            params.update(short_mscale=attention, long_mscale=attention)
    return params


def config_max_position_embeddings(spec: RopeScaling) -> int | None:
    """``max_position_embeddings`` for a config running ``spec``.

    transformers' dynamic rope updater reads ``max_position_embeddings`` as the *original*
    length (it rescales only beyond it), so the dynamic methods keep L. vLLM derives
    max_model_len as ``max_position_embeddings × factor`` for ``linear`` (as for ``dynamic``),
    so linear keeps L too. Every other method advertises the extended length L × s.
    """
    if spec.is_dynamic or spec.method == "linear":
        return spec.original_max_position_embeddings
    return spec.max_position_embeddings


def marker(spec: RopeScaling) -> dict[str, Any]:
    fields = spec.fields()
    fields.pop("rotary_dim")  # the config's head_dim says it
    return {
        k: list(v) if isinstance(v, tuple) else v  # longrope's factors: as JSON writes them
        for k, v in fields.items()
        if KNOB_DEFAULTS.get(k, object()) != v
    }


def to_hf(spec: RopeScaling, format: str = "v4") -> dict[str, Any]:
    """config.json keys that run ``spec`` (v4: rope_theta + rope_scaling; v5: rope_parameters)."""
    if format not in ("v4", "v5"):
        raise ValueError(f"format must be 'v4' or 'v5', got {format!r}")
    params = native_rope_parameters(spec)
    out: dict[str, Any] = {}
    if format == "v4":
        out["rope_theta"] = params.pop("rope_theta")
        out["rope_scaling"] = None if params["rope_type"] == "default" else params
    else:
        out["rope_parameters"] = params
    max_positions = config_max_position_embeddings(spec)
    if max_positions is not None:
        out["max_position_embeddings"] = max_positions
    if spec.method != "none" and not spec.is_checkpoint_scaling:  # else nothing to undo
        out[MARKER] = marker(spec)
    return out


# -- reading ---------------------------------------------------------------------------------


def config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        cfg = config.to_dict()
        if hf_format() == "v4":  # a config object says what runs: 4.x ignores rope_parameters
            cfg.pop("rope_parameters", None)
        return cfg
    raise ValueError(
        f"config must be a transformers config or a config.json dict, got {type(config).__name__}"
    )


def rope_parameters_of(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The flat rope parameters (with rope_theta and rope_type) as transformers 5.x reads them."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"rope_scaling/rope_parameters must be a dict, got {params!r}")
    if any(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(
            "rope_parameters: per-layer-type rope settings are not supported by yarnlib, "
            f"got keys {sorted(params)}"
        )
    params = dict(params)
    params["rope_type"] = params.get("rope_type", params.pop("type", "default"))
    params.pop("type", None)
    if params.get("rope_theta") is None:
        params["rope_theta"] = cfg.get("rope_theta")
    return params


def head_dim_of(cfg: Mapping[str, Any]) -> int:
    # DeepSeek-V2/V3 rotate qk_rope_head_dim dims of each head (their configs set head_dim to it)
    head_dim = cfg.get("qk_rope_head_dim") or cfg.get("head_dim")
    if head_dim is None:
        hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
        if not hidden or not heads:
            raise ValueError(
                "rotary_dim: the config has neither head_dim nor hidden_size and "
                "num_attention_heads; pass rotary_dim= explicitly"
            )
        head_dim = hidden // heads
    return head_dim


def rotary_dim_of(cfg: Mapping[str, Any], params: Mapping[str, Any]) -> int:
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor")) or 1.0
    return int(head_dim_of(cfg) * partial)


def has_rope(cfg: Mapping[str, Any]) -> bool:
    keys = ("rope_theta", "rope_scaling", "rope_parameters")
    return any(cfg.get(k) is not None for k in keys) or cfg.get("model_type") in ROPE_MODEL_TYPES


def no_rope_message(cfg: Mapping[str, Any]) -> str:
    """Why a config without top-level rope keys is refused: a multimodal config keeps its rope
    under ``text_config`` (Llama-4, Qwen2.5-VL as transformers 5 saves them), others have none."""
    nested = [k for k, v in cfg.items() if isinstance(v, Mapping) and has_rope(v)]
    if nested:
        return (
            f"model_type {cfg.get('model_type')!r}: the rope settings are under {nested[0]!r} "
            "(a multimodal config); yarnlib does not support multimodal configs yet"
        )
    return (
        f"model_type {cfg.get('model_type')!r}: the config has no rotary embedding "
        "(no rope_theta, rope_scaling or rope_parameters)"
    )


def check_rope_keys(params: Mapping[str, Any]) -> None:
    """Refuse a rope dict key yarnlib does not read: a rewrite would drop it."""
    unknown = sorted(set(params) - ROPE_DICT_KEYS)
    if unknown:
        raise ValueError(
            f"rope_scaling/rope_parameters: key {unknown[0]!r} is not supported by yarnlib (it "
            "would be dropped when the RoPE is rewritten; mrope_section is multimodal M-RoPE); "
            f"supported: {', '.join(sorted(ROPE_DICT_KEYS))}"
        )


def original_lengths(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The original context L of yarn as each reader takes it from ``cfg`` (ORIGINAL_READERS)."""
    params = rope_parameters_of(cfg)
    in_dict = params.get("original_max_position_embeddings") or cfg.get("max_position_embeddings")
    top = cfg.get("original_max_position_embeddings")
    return dict(zip(ORIGINAL_READERS, (top or in_dict, in_dict), strict=True))


def installed_original(cfg: Mapping[str, Any]) -> Any:
    """L of yarn as the installed transformers reads it."""
    return original_lengths(cfg)[ORIGINAL_READERS[hf_format() == "v4"]]


def native_spec(cfg: Mapping[str, Any], rotary_dim: int) -> RopeScaling:
    """The spec equal to what transformers runs for this config, read from its native keys."""
    params = rope_parameters_of(cfg)
    rope_type = params["rope_type"]
    check_rope_keys(params)
    if rope_type not in FROM_NATIVE_TYPE:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported by yarnlib; supported: "
            f"{', '.join(sorted(FROM_NATIVE_TYPE))}"
        )
    method = FROM_NATIVE_TYPE[rope_type]
    theta = params["rope_theta"] if params["rope_theta"] is not None else DEFAULT_ROPE_THETA
    max_positions = cfg.get("max_position_embeddings")
    kwargs: dict[str, Any] = {"method": method, "rope_theta": theta, "rotary_dim": rotary_dim}
    if method == "none":
        kwargs["original_max_position_embeddings"] = max_positions
        return RopeScaling(**kwargs)
    factor = params.get("factor")
    if method == "dynamic_ntk":
        kwargs["original_max_position_embeddings"] = max_positions
    elif method == "longrope":  # a top-level original wins, as in transformers (Phi-3);
        # without one, transformers takes max_position_embeddings (as for yarn)
        original = (
            cfg.get("original_max_position_embeddings")
            or params.get("original_max_position_embeddings")
            or max_positions
        )
        kwargs["original_max_position_embeddings"] = original
        if factor is None and max_positions and original:
            factor = max_positions / original
        for knob in ("short_factor", "long_factor", "attention_factor"):
            kwargs[knob] = params.get(knob)
    elif method == "llama3":
        kwargs["original_max_position_embeddings"] = params.get(
            "original_max_position_embeddings", max_positions
        )
        for knob in ("low_freq_factor", "high_freq_factor"):
            if params.get(knob) is None:
                raise ValueError(f"rope_scaling.{knob} is required for rope_type 'llama3'")
            kwargs[knob] = params[knob]
    elif method in ("yarn", "dynamic_yarn"):
        if "factor" not in params:  # transformers refuses it too (a required key), else s = 1
            raise ValueError(
                f"rope_scaling.factor: missing for rope_type {rope_type!r}; transformers requires "
                "it (a yarn without it scales nothing): add the factor s (context / original)"
            )
        original = installed_original(cfg)
        kwargs["original_max_position_embeddings"] = original
        if factor is None and max_positions and original:
            factor = max_positions / original
        # transformers treats a falsy beta as "use the default".
        kwargs["beta_fast"] = params.get("beta_fast") or YARN_KNOB_DEFAULTS["beta_fast"]
        kwargs["beta_slow"] = params.get("beta_slow") or YARN_KNOB_DEFAULTS["beta_slow"]
        kwargs["truncate"] = params.get("truncate", True)
        for knob in ("mscale", "mscale_all_dim", "attention_factor"):
            kwargs[knob] = params.get(knob)
    else:  # linear: transformers ignores L; vLLM reads max_position_embeddings as L
        kwargs["original_max_position_embeddings"] = (
            cfg.get("original_max_position_embeddings") or max_positions
        )
    if factor is None:
        raise ValueError(f"rope_scaling.factor is required for rope_type {rope_type!r}")
    kwargs["factor"] = factor
    return RopeScaling(**kwargs)


def from_hf(config: Any, rotary_dim: int | None = None) -> RopeScaling:
    """The spec a transformers config (object or config.json dict, v4 or v5 keys) runs.

    Each field is read as the installed transformers reads it (rope type, ``rope_theta``,
    ``factor``, the original length, the YaRN knobs), except ``rotary_dim``: head_dim ×
    ``partial_rotary_factor``, as vLLM reads it (and transformers' scaled rope types).
    transformers' default RoPE for Llama-family models rotates the whole head whatever
    ``partial_rotary_factor`` says; ``yarnlib config --show`` reports where the two differ.

    When the config carries yarnlib's marker and its native keys are still what the marker
    lowers to, the marker's exact spec is returned (so ``ntk`` stays ``ntk`` and keeps its
    unscaled theta); if someone edited the native keys since, they win.
    """
    cfg = config_dict(config)
    if not has_rope(cfg):
        raise ValueError(no_rope_message(cfg))
    params = rope_parameters_of(cfg)
    if rotary_dim is None:
        rotary_dim = rotary_dim_of(cfg, params)
    spec = native_spec(cfg, rotary_dim)
    marked = marked_spec(cfg, rotary_dim)
    if marked is not None and native_rope_parameters(marked) == native_rope_parameters(spec):
        return marked
    if marked is None and spec.method in YARN_METHODS and spec.knobs():
        # YaRN with mscale & co. that yarnlib did not write: the checkpoint was trained with it
        # (DeepSeek-V3), so it is kept as it is, never re-scaled with its knobs dropped.
        return spec.as_shipped()
    return spec


def marked_spec(cfg: Mapping[str, Any], rotary_dim: int) -> RopeScaling | None:
    """The spec recorded under ``yarnlib_rope_scaling`` (None without one)."""
    recorded = cfg.get(MARKER)
    if recorded is None:
        return None
    check_marker(recorded)
    try:
        return RopeScaling(**recorded, rotary_dim=rotary_dim)
    except ValueError as error:
        raise ValueError(f"{MARKER}: {error}{MARKER_FIX}") from None


def check_marker(recorded: Any) -> None:
    """Refuse a ``yarnlib_rope_scaling`` record that is not an object of spec fields."""
    if not isinstance(recorded, Mapping):
        raise ValueError(f"{MARKER} must be an object, got {recorded!r}{MARKER_FIX}")
    allowed = [f for f in FIELDS if f != "rotary_dim"]  # the config's head_dim says it
    unknown = sorted(set(recorded) - set(allowed))
    if unknown:
        raise ValueError(
            f"{MARKER}: unknown key {unknown[0]!r} (known: {', '.join(allowed)}){MARKER_FIX}"
        )
