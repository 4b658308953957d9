"""Patchers for transformers models: ``patch``, ``unpatch``, ``declare_length``, ``register_hf``."""

from yarnlib.patches.hf_registry import register_hf
from yarnlib.patches.patch import SUPPORTED, declare_length, patch, patch_state, unpatch

__all__ = ["SUPPORTED", "declare_length", "patch", "patch_state", "register_hf", "unpatch"]
