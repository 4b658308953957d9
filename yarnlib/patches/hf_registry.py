"""Teach transformers the methods it lacks, so configs yarnlib wrote load with from_pretrained."""

from __future__ import annotations

from yarnlib import convert
from yarnlib.hf_compat import hf_format
from yarnlib.spec import RopeScaling


def _dynamic_yarn_parameters(config, device=None, seq_len=None, layer_type=None):
    """transformers' rope-init signature: ``(inv_freq, attention_scaling)`` at ``seq_len``."""
    spec = RopeScaling.from_hf(config)
    inv_freq, attention_factor = spec.frequencies(None if seq_len is None else int(seq_len))
    return inv_freq.to(device), attention_factor


def _validate_dynamic_yarn(self, rope_parameters: dict, ignore_keys=None) -> None:
    # Validation errors, not log lines: the spec's constructor raises on bad values.
    RopeScaling.from_hf({**self.to_dict(), "rope_parameters": rope_parameters})


def _validate_dynamic_yarn_v4(config, ignore_keys=None) -> None:
    RopeScaling.from_hf(config)


def register_hf() -> None:
    """Register ``yarnlib_dynamic_yarn`` with transformers (idempotent; done on import)."""
    from transformers import modeling_rope_utils as rope_utils

    rope_utils.ROPE_INIT_FUNCTIONS[convert.HF_DYNAMIC_YARN] = _dynamic_yarn_parameters
    if hf_format() == "v4":  # 4.x validates configs through a dict of functions
        rope_utils.ROPE_VALIDATION_FUNCTIONS[convert.HF_DYNAMIC_YARN] = _validate_dynamic_yarn_v4
        return
    setattr(
        rope_utils.RotaryEmbeddingConfigMixin,
        f"_validate_{convert.HF_DYNAMIC_YARN}_rope_parameters",
        _validate_dynamic_yarn,
    )
