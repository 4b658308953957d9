"""A spec file: one exact ``RopeScaling`` as JSON (what ``yarnlib tune`` writes as ``best.json``).

It records every field, the model's unscaled ``rope_theta`` and its original context
included, so applying it to a model re-scales from the native settings and never compounds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from yarnlib import atomic
from yarnlib.spec import RopeScaling

FORMAT = "yarnlib-rope-spec/1"


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically: a reader sees the old or the new file, never half of one."""
    return atomic.write_text(path, json.dumps(payload, indent=2) + "\n")


def write_spec_file(path: str | Path, spec: RopeScaling, **extra: Any) -> Path:
    """``spec`` with every field (and ``extra`` facts about it) as a spec file."""
    payload = {"format": FORMAT, "spec": spec.fields(), "transformers": spec.to_hf("v5"), **extra}
    return write_json(path, payload)


def read_spec_file(path: str | Path) -> RopeScaling:
    """The spec in a file written by ``write_spec_file``; anything else is refused by name."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"spec: cannot read {path} ({error.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"spec: {path} is not JSON ({error}); allowed: a best.json") from None
    except RecursionError:
        raise ValueError(
            f"spec: {path} is malformed: nested too deeply; allowed: a best.json"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(
            f"spec: {path} has format {found!r}; allowed: {FORMAT!r} (a best.json of yarnlib tune)"
        )
    fields = payload.get("spec")
    if not isinstance(fields, dict):
        raise ValueError(f"spec: {path} has no 'spec' object")
    try:
        return RopeScaling(**fields)
    except (TypeError, ValueError) as error:  # a field missing, unknown or out of range
        raise ValueError(f"spec: {path}: {error}") from None


def spec_on_model(path: str | Path, native: RopeScaling) -> RopeScaling:
    """The spec in ``path``, checked against the model whose native settings are ``native``:
    the same base theta and rotary dim, else the file was tuned for another model."""
    spec = read_spec_file(path)
    for field in ("rope_theta", "rotary_dim"):
        if getattr(spec, field) != getattr(native, field):
            raise ValueError(
                f"spec: {path} has {field}={getattr(spec, field)!r}, but the model has "
                f"{field}={getattr(native, field)!r}; allowed: a spec tuned for this model"
            )
    return spec


def patch_arguments(spec: RopeScaling) -> dict[str, Any]:
    """Keywords of ``yarnlib.patch`` (and ``RopeScaling.rescaled``) that run exactly ``spec``."""
    return {
        "method": spec.method,
        "factor": spec.factor,
        "original_max_position_embeddings": spec.original_max_position_embeddings,
        **spec.knobs(),
    }
