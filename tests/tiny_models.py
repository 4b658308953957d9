"""Tiny random transformers models for tests: real classes, seconds to build and run."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ARCHS = ("llama", "qwen2", "qwen3")


def tiny_config(arch: str = "llama", **overrides):
    """hidden 64, 2 layers, 4 query heads / 2 kv heads (GQA), head_dim 16, theta 50000, L=256."""
    kwargs = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
        max_position_embeddings=256,
        rope_theta=50000.0,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    return AutoConfig.for_model(arch, **kwargs)


def tiny_model(arch: str = "llama", seed: int = 0, attn_implementation: str = "eager", **overrides):
    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()
