"""The shape of a decoder-only model, read from its config.json: what the memory formulas need."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# model_type → the decoder layer class FSDP wraps (accelerate's TRANSFORMER_BASED_WRAP)
LAYER_CLASSES = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer",
}
ARCHITECTURES = tuple(LAYER_CLASSES)


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # per expert for MoE models (moe_intermediate_size)
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool  # q, k, v biases (Qwen2)
    qk_norm: bool  # per-head RMSNorm of q and k (Qwen3)
    num_experts: int = 0  # 0: a dense MLP
    num_experts_per_tok: int = 0
    max_position_embeddings: int = 0

    @property
    def layer_class(self) -> str:
        return LAYER_CLASSES[self.model_type]

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        h = self.hidden_size
        params = h * self.q_width * 2 + h * self.kv_width * 2  # q, o; k, v
        if self.attention_bias:
            params += self.q_width + 2 * self.kv_width
        if self.qk_norm:
            params += 2 * self.head_dim
        return params

    @property
    def mlp_params(self) -> int:
        gated = 3 * self.hidden_size * self.intermediate_size  # gate, up, down
        if not self.num_experts:
            return gated
        return self.num_experts * gated + self.hidden_size * self.num_experts  # + router

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.hidden_size  # two RMSNorms

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.embedding_params

    @property
    def params(self) -> int:
        """All parameters, as ``sum(p.numel() for p in model.parameters())`` counts them."""
        outside = self.embedding_params + self.head_params + self.hidden_size  # + final norm
        return self.num_hidden_layers * self.layer_params + outside


def _field(config: dict[str, Any], key: str, minimum: int = 1) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"config.json: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    model_type = config.get("model_type")
    if model_type not in LAYER_CLASSES:
        raise ValueError(
            f"config.json: model_type {model_type!r} is not planned; allowed: "
            f"{', '.join(ARCHITECTURES)}"
        )
    heads = _field(config, "num_attention_heads")
    hidden = _field(config, "hidden_size")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    moe = model_type == "qwen3_moe"
    if moe and (config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1):
        raise ValueError(
            "config.json: mlp_only_layers / decoder_sparse_step: dense layers inside a MoE "
            "model are not planned; allowed: every layer MoE (decoder_sparse_step 1)"
        )
    return ModelShape(
        model_type=model_type,
        num_hidden_layers=_field(config, "num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_field(config, "moe_intermediate_size" if moe else "intermediate_size"),
        vocab_size=_field(config, "vocab_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        num_experts=_field(config, "num_experts") if moe else 0,
        num_experts_per_tok=_field(config, "num_experts_per_tok") if moe else 0,
        max_position_embeddings=config.get("max_position_embeddings") or 0,
    )


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of a model folder, or that file itself."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"model: {str(path)!r} is neither a model folder nor a config.json file")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"model: {str(file)!r} is not JSON ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"model: {str(file)!r} does not hold a JSON object")
    return config
