"""Patchers for transformers models: ``patch``, ``unpatch``, ``declare_length``, ``register_hf``."""

from yarnlib.patches.attention import choose_attn_implementation
from yarnlib.patches.hf_registry import register_hf
from yarnlib.patches.patch import SUPPORTED, declare_length, patch, patch_state, unpatch

__all__ = [
    "SUPPORTED",
    "choose_attn_implementation",
    "declare_length",
    "patch",
    "patch_state",
    "register_hf",
    "unpatch",
]
