"""Scaled rotary embeddings applied to q and k in one pass (Triton on CUDA, torch elsewhere)."""

from yarnlib.kernels.rotary import apply_rotary, apply_scaled_rotary
from yarnlib.kernels.tables import rotary_cos_sin

__all__ = ["apply_rotary", "apply_scaled_rotary", "rotary_cos_sin"]
