"""Tiny random transformers models for tests: real classes, seconds to build and run."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from yarnlib.convert import to_hf
from yarnlib.hf_compat import hf_format

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


def native_rope_keys(spec, partial_rotary_factor: float | None = None) -> dict:
    """Config keyword arguments that run ``spec`` natively, in the keys the installed
    transformers reads (4.x: rope_theta + rope_scaling; 5.x: rope_parameters)."""
    keys = to_hf(spec, hf_format())
    keys = {k: v for k, v in keys.items() if k in ROPE_KEYS}
    if partial_rotary_factor is not None:
        target = keys["rope_parameters"] if "rope_parameters" in keys else keys
        target["partial_rotary_factor"] = partial_rotary_factor
    return keys


ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "max_position_embeddings")


def config_rope(config) -> dict:
    """The rope settings (rope_type, rope_theta, ...) as the installed transformers reads them."""
    if hf_format() == "v5":
        return dict(config.rope_parameters)
    return {"rope_type": "default", **(config.rope_scaling or {}), "rope_theta": config.rope_theta}


def hand_written_rope(params: dict) -> dict:
    """Config keyword arguments for hand-written rope settings (``rope_type``, ``rope_theta``,
    ...), in the keys the installed transformers reads: the test's independent reference must
    reach the model on 4.x too (which ignores ``rope_parameters``)."""
    if hf_format() == "v5":
        return {"rope_parameters": dict(params)}
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    plain = scaling.get("rope_type", "default") == "default" and len(scaling) <= 1
    return {"rope_theta": params["rope_theta"], "rope_scaling": None if plain else scaling}
