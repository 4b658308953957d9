"""The lm-eval model ``yarnlib``: Hugging Face's ``hf`` model, patched with a scaling method.

    lm_eval --model yarnlib --model_args pretrained=PATH,method=yarn,factor=4 --tasks ...

lm-eval finds models only in modules that were imported; ``yarnlib eval lm-eval`` imports
this one first, and so does the packaged passkey task (see docs/eval.md).
"""

from __future__ import annotations

import lm_eval.models  # noqa: F401  (registers lm-eval's own models before ours)
from lm_eval.api.registry import model_registry, register_model
from lm_eval.models.huggingface import HFLM

import yarnlib
from yarnlib.eval.methods import Method, apply_method, check_methods
from yarnlib.models import SMOLLM2, load_config, resolve

NAME = "yarnlib"


class YarnlibLM(HFLM):
    """``pretrained`` may be a folder, a hub id or ``smollm2``; ``method``/``factor`` (and
    ``original_max_position_embeddings`` plus YaRN knobs) go to ``yarnlib.patch``."""

    def __init__(
        self,
        pretrained: str = SMOLLM2,
        method: str = "none",
        factor: float = 2.0,
        original_max_position_embeddings: int | None = None,
        beta_fast: float | None = None,
        beta_slow: float | None = None,
        **kwargs,
    ):
        scaling = Method(yarnlib.spec.canonical_method(method), float(factor))
        if isinstance(pretrained, str):
            check_methods(load_config(pretrained), [scaling])  # before the weights load
            pretrained = resolve(pretrained)
        super().__init__(pretrained=pretrained, **kwargs)
        knobs = {"beta_fast": beta_fast, "beta_slow": beta_slow}
        knobs = {k: float(v) for k, v in knobs.items() if v is not None}
        if knobs or original_max_position_embeddings:
            original = original_max_position_embeddings
            yarnlib.patch(self.model, scaling.method, scaling.factor, original, **knobs)
        else:
            apply_method(self.model, scaling)
        self.scaling = scaling

    def get_model_info(self) -> dict:
        return {**super().get_model_info(), "yarnlib_method": self.scaling.label}


if NAME not in model_registry:
    register_model(NAME)(YarnlibLM)
