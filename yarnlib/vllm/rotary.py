"""yarnlib's rotary embedding as a vLLM layer: vLLM's own kernels, yarnlib's cos/sin table."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

from yarnlib.kernels.tables import half_cos_sin
from yarnlib.spec import RopeScaling


class YarnlibRotaryEmbedding(RotaryEmbedding):
    """``RotaryEmbedding`` whose table holds ``spec`` at the fixed length ``scale_len``."""

    def __init__(self, spec: RopeScaling, scale_len: int, head_size, cache_len, neox, dtype):
        self.spec = spec
        self.scale_len = scale_len
        super().__init__(head_size, spec.rotary_dim, cache_len, spec.rope_theta, neox, dtype)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        inv_freq, attention_factor = self.spec.frequencies(self.scale_len)
        positions = torch.arange(self.max_position_embeddings)
        # vLLM's cache layout: [positions, cos of each frequency | sin of each frequency]
        return torch.cat(half_cos_sin(inv_freq, attention_factor, positions), dim=-1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, yarnlib={self.spec.describe()}, scale_len={self.scale_len}"
