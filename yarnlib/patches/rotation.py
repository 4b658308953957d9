"""Routing q/k rotation of patched models through yarnlib's kernel.

transformers' attention calls the module-level ``apply_rotary_pos_emb`` of its modeling
file, which rotates the whole head with ``rotate_half``. A patched model needs its own
rotation in two cases: partial rotary (``rotary_dim < head_dim``: the tail passes through,
as vLLM does it) and the fused kernel on CUDA. For those, the patched rotary module tags
the cos table it returns, and the modeling file's ``apply_rotary_pos_emb`` is replaced by
a dispatcher that sends tagged calls to ``yarnlib.kernels.apply_rotary`` and every other
call, unchanged, to the original function. The dispatcher is removed when the last
routed model is unpatched, so unpatched processes run transformers' code untouched.
"""

from __future__ import annotations

import functools
import sys
from typing import NamedTuple

import torch

from yarnlib.kernels import apply_rotary

ROUTE_ATTRIBUTE = "_yarnlib_route"


class Route(NamedTuple):
    rotary_dim: int
    backend: str  # "torch" or "triton" (the kernel's backends)


_installed: dict[str, tuple[object, int]] = {}  # module name -> (original function, users)


def _dispatcher(original):
    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        route = getattr(cos, ROUTE_ATTRIBUTE, None)
        if route is None:
            return original(q, k, cos, sin, *args, **kwargs)
        unsqueeze_dim = args[0] if args else kwargs.get("unsqueeze_dim", 1)
        layout = "bhsd" if unsqueeze_dim == 1 else "bshd"
        return apply_rotary(
            q, k, cos, sin, layout=layout, rotary_dim=route.rotary_dim, backend=route.backend
        )

    return apply_rotary_pos_emb


def install(module_name: str) -> None:
    module = sys.modules[module_name]
    if module_name in _installed:
        original, users = _installed[module_name]
        _installed[module_name] = (original, users + 1)
        return
    original = module.apply_rotary_pos_emb
    module.apply_rotary_pos_emb = _dispatcher(original)
    _installed[module_name] = (original, 1)


def uninstall(module_name: str) -> None:
    original, users = _installed[module_name]
    if users > 1:
        _installed[module_name] = (original, users - 1)
        return
    sys.modules[module_name].apply_rotary_pos_emb = original
    del _installed[module_name]


def tag(cos: torch.Tensor, route: Route | None) -> torch.Tensor:
    if route is not None:
        setattr(cos, ROUTE_ATTRIBUTE, route)
    return cos


def needs_dispatcher(use_kernel: bool | str, rotary_dim: int, head_dim: int) -> bool:
    if use_kernel not in ("auto", True, False):
        raise ValueError(f"use_kernel must be 'auto', True or False, got {use_kernel!r}")
    return use_kernel is not False or rotary_dim < head_dim


def choose_route(
    use_kernel: bool | str, rotary_dim: int, head_dim: int, device: torch.device
) -> Route | None:
    """How a forward on ``device`` rotates q/k; None keeps transformers' own rotation.

    ``use_kernel="auto"`` means the Triton kernel on CUDA; ``True`` also routes CPU tensors
    through the kernel's torch path. Partial rotary always goes through the kernel.
    """
    triton_usable = device.type == "cuda" and _triton_available()
    if use_kernel == "auto":
        use_kernel = triton_usable
    if not use_kernel and rotary_dim == head_dim:
        return None
    return Route(rotary_dim, "triton" if use_kernel and triton_usable else "torch")


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
