"""The vLLM rollout per tensor-parallel rank: weights, KV cache, sequences that fit.

vLLM (V1) sizes its KV cache at start-up: of ``gpu_memory_utilization × GPU memory`` it
subtracts the weights, the activation peak of a profiling forward over
``max_num_batched_tokens`` tokens and its non-torch overhead; what is left is cut into blocks
of ``block_size`` tokens, each holding K and V of every layer for the rank's kv heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from yarnlib.plan.shapes import ModelShape

GIB = 1024**3
OVERHEAD = 1 * GIB  # CUDA graphs, NCCL and allocator slack vLLM counts outside the weights
SAMPLED_ROWS = 256  # rows whose logits a forward computes at once (max_num_seqs)


def kv_heads_per_rank(shape: ModelShape, tp: int) -> int:
    return max(1, shape.num_key_value_heads // tp)  # replicated when tp exceeds them


def kv_bytes_per_token(shape: ModelShape, tp: int = 1, dtype_bytes: int = 2) -> int:
    """K and V of every layer for one token on one tensor-parallel rank."""
    return 2 * shape.num_hidden_layers * kv_heads_per_rank(shape, tp) * shape.head_dim * dtype_bytes


def weight_bytes(shape: ModelShape, tp: int, dtype_bytes: int = 2) -> int:
    """Weights per rank: every matmul and the vocabulary split by tp (norms are negligible)."""
    return math.ceil(shape.params * dtype_bytes / tp)


def activation_peak(shape: ModelShape, batched_tokens: int, tp: int, dtype_bytes: int = 2) -> int:
    """The profiling forward's peak: residual and normed hidden states, q/k/v and attention
    output, gate/up and the activated product, plus float32 logits of the sampled rows."""
    split = (2 * shape.q_width + 2 * kv_heads_per_rank(shape, tp) * shape.head_dim) // tp
    mlp = 3 * shape.intermediate_size * max(1, shape.num_experts_per_tok) // tp
    per_token = (4 * shape.hidden_size + split + mlp) * dtype_bytes
    return batched_tokens * per_token + 2 * 4 * SAMPLED_ROWS * shape.vocab_size


@dataclass(frozen=True)
class KVCache:
    budget: int  # bytes for the KV cache on one rank
    bytes_per_token: int
    blocks: int
    block_size: int

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size

    def sequences(self, length: int) -> int:
        """Sequences of ``length`` tokens that fit at once (each takes whole blocks)."""
        return self.blocks // math.ceil(length / self.block_size)


def kv_cache(budget: int, shape: ModelShape, tp: int, block_size: int = 16, dtype_bytes: int = 2):
    per_token = kv_bytes_per_token(shape, tp, dtype_bytes)
    blocks = max(0, budget) // (block_size * per_token)
    return KVCache(max(0, budget), per_token, blocks, block_size)


def gpu_kv_budget(
    shape: ModelShape, gpu_bytes: int, utilization: float, tp: int, batched_tokens: int
) -> int:
    requested = int(utilization * gpu_bytes)
    used = weight_bytes(shape, tp) + activation_peak(shape, batched_tokens, tp) + OVERHEAD
    return requested - used
