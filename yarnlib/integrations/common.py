"""Config plumbing shared by the integrations: loading, dotted sections, length checks."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from yarnlib.convert import head_dim_of
from yarnlib.spec import STATIC_METHODS, RopeScaling


def load(cfg: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A deep copy of ``cfg``, or the mapping in the YAML file ``cfg``."""
    if isinstance(cfg, Mapping):
        return copy.deepcopy(dict(cfg))
    if not isinstance(cfg, (str, Path)):
        raise ValueError(f"cfg must be a dict or a YAML path, got {type(cfg).__name__}")
    import yaml

    data = yaml.safe_load(Path(cfg).read_text())
    if not isinstance(data, Mapping):
        raise ValueError(f"cfg: {str(cfg)!r} does not hold a YAML mapping")
    return dict(data)


def local_head_dim(path: Any) -> int | None:
    """The head_dim of a local model folder; None for a hub id (the rollout's overrides then
    name ``rope_dim``, read by vLLM >= 0.24)."""
    config = Path(str(path or "")).expanduser() / "config.json"
    if not path or not config.is_file():
        return None
    return head_dim_of(json.loads(config.read_text()))


def section(cfg: dict[str, Any], dotted: str) -> dict[str, Any]:
    """The dict at ``dotted`` (``a.b.c``), created where missing."""
    node = cfg
    for key in dotted.split("."):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ValueError(f"{dotted}: expected a mapping at {key!r}, got {child!r}")
        node = child
    return node


def require_static(spec: RopeScaling, framework: str) -> None:
    # The actor rescales per batch, vLLM once per engine: the importance ratios would be off.
    if spec.is_dynamic:
        raise ValueError(
            f"method {spec.method!r}: in {framework} GRPO the transformers actor would scale each "
            "batch by its own length while vLLM fixes the scale at one length; use a static "
            "method (e.g. yarn with factor = max_model_len / original): "
            f"{', '.join(STATIC_METHODS)}"
        )


def sequence_length(cfg: dict[str, Any], spec: RopeScaling, prompt_key: str, response_key: str):
    """prompt + response length (None when the config sets neither), checked against L × s."""
    data = cfg.get("data") or {}
    prompt, response = data.get(prompt_key), data.get(response_key)
    if prompt is None and response is None:
        return None
    for key, value in ((prompt_key, prompt), (response_key, response)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"data.{key} must be a positive integer, got {value!r}")
    limit = spec.max_position_embeddings
    if prompt + response > limit:
        raise ValueError(
            f"data.{prompt_key} + data.{response_key} = {prompt + response} exceeds what "
            f"{spec.describe()} covers ({limit} = original × factor); raise factor or shorten them"
        )
    return prompt + response
