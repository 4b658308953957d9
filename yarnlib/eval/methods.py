"""The ``--methods`` list of an evaluation: parsing, validation against a config, application."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import yarnlib
from yarnlib.patches.patch import SUPPORTED, patch_state
from yarnlib.spec import METHODS, RopeScaling, canonical_method, checked_factor
from yarnlib.spec_file import patch_arguments


@dataclass(frozen=True)
class Method:
    """One row of a comparison: a scaling method at one factor (``none`` runs the model as is)."""

    method: str
    factor: float
    spec: RopeScaling | None = None  # an exact spec (from a spec file): its knobs, its original
    name: str | None = None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return "none" if self.method == "none" else f"{self.method}:{self.factor:g}"

    @property
    def is_dynamic(self) -> bool:
        return self.method in ("dynamic_ntk", "dynamic_yarn")


def parse_methods(text: str, default_factor: float = 2.0) -> list[Method]:
    """``"none,linear:2,yarn:4,dynamic_yarn"`` → methods; a missing factor is ``default_factor``."""
    methods = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, factor_text = item.partition(":")
        method = canonical_method(name)
        try:
            factor = float(factor_text) if factor_text else default_factor
        except ValueError:
            raise ValueError(
                f"methods: factor {factor_text!r} in {item!r} is not a number "
                "(write METHOD or METHOD:FACTOR, e.g. yarn:4)"
            ) from None
        if method == "none" and not factor_text:
            factor = 1.0
        try:
            methods.append(Method(method, checked_factor(method, factor)))
        except ValueError as error:
            raise ValueError(f"methods: {item!r}: {error}") from None
    if not methods:
        raise ValueError(f"methods: no method given in {text!r}; known: {', '.join(METHODS)}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods: {text!r} lists a method twice")
    return methods


def check_methods(config, methods: list[Method]) -> RopeScaling:
    """Raise before any weights load if the model cannot run one of ``methods``."""
    if config.model_type not in SUPPORTED:
        raise ValueError(
            f"model: model_type {config.model_type!r} cannot be patched; "
            f"supported: {', '.join(SUPPORTED)}"
        )
    native = RopeScaling.from_hf(config)
    for m in methods:
        if m.method != "none":
            native.rescaled(m.method, m.factor)
    if native.method != "none" and any(m.method == "none" for m in methods):
        print(
            f"warning: methods: the 'none' row runs the model as saved, and its config.json "
            f"already scales the RoPE ({native.describe()}): that row is not the unscaled model; "
            "to compare with it, evaluate the folder before `yarnlib config` (or a copy after "
            "`yarnlib config --reset`)",
            file=sys.stderr,
        )
    return native


def scaling_fields(model, m: Method) -> dict:
    """What a row ran, for its result records: its own method and factor, or for ``none`` the
    scaling the model's config carries (a model saved scaled, e.g. after fine-tuning, runs
    scaled as is; its ``none`` row must not read as unscaled)."""
    if m.method != "none":
        return {"scaling": m.method, "factor": m.factor}
    shipped = RopeScaling.from_hf(model.config)
    return {"scaling": shipped.method, "factor": shipped.factor}


def apply_method(model, m: Method):
    """Run ``model`` with ``m``: patched for a scaling method, restored exactly for ``none``."""
    if m.method == "none":
        if patch_state(model) is not None:
            yarnlib.unpatch(model)
        return model
    if m.spec is not None:
        return yarnlib.patch(model, **patch_arguments(m.spec))
    return yarnlib.patch(model, method=m.method, factor=m.factor)
