"""The installed transformers: which config keys it reads, and whether yarnlib is tested on it.

transformers 4.x reads ``rope_theta`` + ``rope_scaling`` and ignores ``rope_parameters``;
5.x reads ``rope_parameters`` (and still accepts the 4.x keys). The tested versions are the
lanes of ``make test`` and ``make test-compat`` (docs/compatibility.md).
"""

from __future__ import annotations

import copy
import functools
import importlib
import warnings
from collections.abc import Mapping
from typing import Any

import transformers
from packaging.specifiers import SpecifierSet
from packaging.version import Version

# Every range here has a test lane; pyproject's transformers range spans them.
TESTED_TRANSFORMERS = SpecifierSet(">=4.57,<4.58"), SpecifierSet(">=5.5.3,<5.20")
TESTED_TEXT = "4.57.x and 5.5.3 to 5.19"


def transformers_version() -> Version:
    return Version(transformers.__version__)


def hf_format() -> str:
    """The config key format the installed transformers reads: 'v4' or 'v5'."""
    return "v4" if transformers_version().major < 5 else "v5"


def is_tested(version: Version) -> bool:
    return any(version in tested for tested in TESTED_TRANSFORMERS)


@functools.cache
def warn_if_untested() -> None:
    """Warn once per process when the installed transformers has no test lane."""
    version = transformers_version()
    if not is_tested(version):
        warnings.warn(
            f"transformers {version} is outside the versions yarnlib is tested on "
            f"({TESTED_TEXT}); patch checks the config it writes against this version's rope "
            "functions, but loading, saving and training are untested on it",
            stacklevel=3,
        )


def rotated_dims(config: Mapping[str, Any]) -> int | None:
    """How many dims of each head the installed transformers rotates for a config.json dict:
    the model's own rotary embedding built from it (None where transformers has no single
    rotary class for the model type, or cannot build it). Llama-family default RoPE rotates
    the whole head whatever ``partial_rotary_factor`` says; their scaled types honour it."""
    model_type = config.get("model_type")
    try:
        module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        (name,) = [n for n in dir(module) if n.endswith("RotaryEmbedding")]
        # a deep copy: transformers standardises the rope dict in place (a top-level
        # original_max_position_embeddings goes into it), which must not change the caller's
        fields = copy.deepcopy({k: v for k, v in config.items() if k != "model_type"})
        rotary = getattr(module, name)(transformers.AutoConfig.for_model(model_type, **fields))
    except (ImportError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return 2 * rotary.inv_freq.numel()
