"""The rotary embedding module a patched model runs: cos/sin from a ``RopeScaling`` spec.

It replaces the model's own rotary module (one module shared by all layers, as in
transformers) and returns ``(cos, sin)`` in the same layout and with the same float32
numerics, so the attention code of transformers is untouched.

Dynamic methods and the KV cache: the scale of a sequence is fixed when the sequence
starts (a forward whose positions start at 0, i.e. prefill) at
``max(declared_length, prefill length)``, and kept for every later forward of that
sequence (decoding with a cache). Cached keys and new queries therefore always share one
set of frequencies. ``generate`` on a patched model declares ``prompt + max_new_tokens``
itself, so greedy decoding gives the same tokens with and without a cache; manual
decoding loops declare their length with ``yarnlib.declare_length(model, n)``.
"""

from __future__ import annotations

import torch
from torch import nn

from yarnlib.kernels.tables import cos_sin
from yarnlib.patches.rotation import choose_route, tag
from yarnlib.spec import RopeScaling


class YarnlibRotaryEmbedding(nn.Module):
    def __init__(
        self,
        spec: RopeScaling,
        head_dim: int,
        use_kernel: bool | str = "auto",
        device: torch.device | None = None,
    ):
        super().__init__()
        self.spec = spec
        self.head_dim = head_dim
        self.use_kernel = use_kernel
        self.declared_length: int | None = None
        self.frozen_length: int | None = None  # the dynamic scale's length for this sequence
        inv_freq, self.attention_scaling = spec.frequencies()
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        self._dynamic_cache: dict[tuple[int, torch.device], tuple[torch.Tensor, float]] = {}

    def _apply(self, fn, recurse=True):
        # .to(bfloat16) would round the frequencies: keep them float32 on the new device.
        super()._apply(fn, recurse)
        self.inv_freq = self.spec.inv_freq().to(self.inv_freq.device)
        self._dynamic_cache.clear()
        return self

    def dynamic_length(self, position_ids: torch.Tensor) -> int:
        seq_len = int(position_ids.max()) + 1
        if self.frozen_length is None or int(position_ids.min()) == 0:
            self.frozen_length = max(self.declared_length or 0, seq_len)
        return self.frozen_length

    def frequencies(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, float]:
        if not self.spec.is_dynamic:
            return self.inv_freq, self.attention_scaling
        length = self.dynamic_length(position_ids)
        key = (length, self.inv_freq.device)
        if key not in self._dynamic_cache:
            inv_freq, factor = self.spec.frequencies(length)
            self._dynamic_cache = {key: (inv_freq.to(self.inv_freq.device), factor)}
        return self._dynamic_cache[key]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        inv_freq, attention_factor = self.frequencies(position_ids)
        cos, sin = cos_sin(inv_freq, attention_factor, position_ids.to(x.device), x.dtype)
        route = choose_route(self.use_kernel, self.spec.rotary_dim, self.head_dim, x.device)
        return tag(cos, route), sin

    def extra_repr(self) -> str:
        return self.spec.describe()
