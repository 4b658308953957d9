"""Config plumbing shared by the integrations: loading, dotted sections, length checks."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from yarnlib import atomic, config
from yarnlib.spec import STATIC_METHODS, RopeScaling
from yarnlib.vllm import versions

# Config keys that set the RoPE; in the checkpoint recipes only the rewritten config.json has them.
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")


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


def require_destination(output: str | Path | None, in_place: bool, framework: str) -> None:
    if in_place == (output is not None):
        raise ValueError(f"{framework}.apply: give exactly one of output=DIR or in_place=True")


def refuse_rope_keys(overrides: Mapping[str, Any] | None, field: str, reaches: str) -> None:
    """Rope keys in ``overrides`` would reach ``reaches`` only, beside the rewritten file."""
    clashing = sorted(set(overrides or {}) & set(ROPE_KEYS))
    if clashing:
        raise ValueError(
            f"{field}: remove {clashing}; they would reach {reaches} only, while the rewritten "
            "config.json serves actor and rollout alike"
        )


def require_model_folder(model: dict[str, Any], path_key: str, field: str) -> None:
    path = model.get(path_key)
    if not path or not (Path(path) / "config.json").is_file():
        raise ValueError(
            f"{field}: {path!r} is not a local model folder with config.json; the rollout reads "
            "that file, so download the model first"
        )


def rewrite_model_folder(
    model: dict[str, Any],
    path_key: str,
    spec: RopeScaling,
    output: str | Path | None,
    in_place: bool,
) -> None:
    """Rewrite the folder at ``model[path_key]`` to run ``spec`` (``yarnlib config``): into
    ``output`` (weights symlinked; ``model[path_key]`` then points there) or ``in_place``,
    holding the folder's lock as ``yarnlib config --in-place`` does (a busy folder is refused)."""
    path = model[path_key]
    if not in_place:
        config.apply(path, config.plan(path, spec), output=output)
        model[path_key] = str(output)
        return
    # completing an interrupted rewrite removes the folder's temporary files, which are another
    # rewrite's while one runs: only under the lock
    with atomic.lock_folder(path, path_key):
        config.complete_interrupted(path)
        config.apply(path, config.plan(path, spec), in_place=True)


def _at(cfg: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str] | None:
    """The (section, key) holding ``dotted`` where the config sets it, else None."""
    *parents, key = dotted.split(".")
    node: Any = cfg
    for name in parents:
        node = node.get(name) if isinstance(node, dict) else None
    return (node, key) if isinstance(node, dict) and node.get(key) else None


def same_checkpoint_paths(
    cfg: dict[str, Any], dotted_keys: tuple[str, ...], source: str | Path, length: int
) -> list[tuple[dict[str, Any], str]]:
    """The model paths (critic, reward model) naming the checkpoint ``source`` too: they must
    load the scaled folder as well, or they run unscaled RoPE beyond L. A local folder of another
    checkpoint whose context is below ``length`` tokens is refused."""
    shared = []
    for dotted in dotted_keys:
        found = _at(cfg, dotted)
        if found is None:
            continue
        path = Path(str(found[0][found[1]])).expanduser()
        if path.resolve() == Path(source).expanduser().resolve():
            shared.append(found)
        elif (path / "config.json").is_file():
            context = config.show(path)["extended_context"]
            if context is not None and context < length:
                raise ValueError(
                    f"{dotted}: {str(path)!r} is another checkpoint, with a context of {context} "
                    f"tokens, below the {length} tokens of a sequence here; scale it too (yarnlib "
                    "config) or point it at the scaled actor checkpoint"
                )
    return shared


def require_rollout_reads(spec: RopeScaling, vllm_version: str | None, fallback: str) -> str:
    """The rollout's vLLM version (``vllm_version``, else the installed one, else ``fallback``),
    refusing what that version would read from the rewritten config.json otherwise than the
    transformers actor does."""
    version = versions.target(vllm_version, fallback)
    versions.check_supported(spec, version)
    if versions.yarn_attention_keys(spec, version) and (
        versions.parse(version) < versions.ATTENTION_FACTOR_SINCE
    ):
        raise ValueError(
            f"{spec.describe()}: the rollout's vLLM {version} reads the YaRN attention factor "
            "from config.json only as 0.1·ln(s)+1 (attention_factor and mscale are read from "
            "vLLM 0.32 on), so actor and rollout would differ; use method yarn without attention "
            "knobs, or vllm_version >= 0.32"
        )
    return version
