"""Which attention implementation to ask transformers for."""

from __future__ import annotations

import importlib.util

import torch

ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2")


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def choose_attn_implementation(requested: str = "auto", device: str | torch.device = "cpu") -> str:
    """flash_attention_2 on CUDA when flash-attn is installed, else SDPA; explicit requests
    are checked (flash-attn needs CUDA and the package) instead of failing deep inside."""
    if requested not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation must be one of {', '.join(ATTN_IMPLEMENTATIONS)}, "
            f"got {requested!r}"
        )
    on_cuda = torch.device(device).type == "cuda"
    if requested == "auto":
        return "flash_attention_2" if on_cuda and flash_attn_installed() else "sdpa"
    if requested == "flash_attention_2" and not (on_cuda and flash_attn_installed()):
        raise ValueError(
            "attn_implementation='flash_attention_2' needs a CUDA device and the flash-attn "
            f"package (device {device}, flash-attn installed: {flash_attn_installed()}); "
            "use 'sdpa' or 'auto'"
        )
    return requested
