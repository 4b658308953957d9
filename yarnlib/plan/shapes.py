"""The shape of a decoder-only model, read from its config.json: what the memory formulas need."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Qwen3's model cards: 32768 tokens of pre-training context; config.json says 40960 to leave
# room for the output, and the YaRN recipe scales 32768
PUBLISHED_ORIGINALS = {("qwen3", 40960): 32768, ("qwen3_moe", 40960): 32768}
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
class RopeContext:
    """The lengths a config's RoPE stands for."""

    method: str  # the scaling config.json runs ("none": the native RoPE)
    factor: float
    original: int  # L: the pre-training context a factor multiplies
    covered: int  # tokens the RoPE as configured is meant for (L × factor when scaled)
    own_scaling: bool  # the checkpoint's own scaling (llama3, longrope): yarnlib keeps it


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
    rope: RopeContext | None = None  # the context the RoPE covers (None: no length in config)

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
    def largest_module_params(self) -> int:
        """Parameters of the largest single module (what ZeRO-3 gathers at once): the
        embedding or head, a projection, or a MoE layer's experts module."""
        mlp = self.hidden_size * self.intermediate_size
        if self.num_experts:  # transformers 5.x keeps every expert's projections in one module
            mlp *= 3 * self.num_experts
        return max(self.embedding_params, mlp, self.hidden_size * self.q_width)

    def lora_params(self, rank: int, mlp: bool = False) -> int:
        """Adapter parameters of rank ``rank`` on q, k, v and o of every layer (yarnlib
        finetune's default ``--lora-targets``), and with ``mlp`` on gate, up and down as well
        (every linear layer of the decoder: peft's and ms-swift's ``all-linear``; on a MoE
        model each expert's, as transformers 4.x keeps them, linear modules): r × (fan-in +
        fan-out) per projection."""
        h, q, kv = self.hidden_size, self.q_width, self.kv_width
        per_layer = rank * ((h + q) + 2 * (h + kv) + (q + h))
        if mlp:
            per_layer += 3 * rank * (h + self.intermediate_size) * max(1, self.num_experts)
        return self.num_hidden_layers * per_layer

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


def _optional(config: dict[str, Any], key: str, default: int) -> int:
    """An integer field transformers derives when it is missing or null."""
    return default if config.get(key) is None else _field(config, key)


def _flag(config: dict[str, Any], key: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"config.json: {key} must be true or false, got {value!r}")
    return value


def _heads(config: dict[str, Any]) -> tuple[int, int, int]:
    """(attention heads, kv heads, head_dim), as transformers derives the missing ones."""
    heads = _field(config, "num_attention_heads")
    hidden = _field(config, "hidden_size")
    kv_heads = _optional(config, "num_key_value_heads", heads)
    if heads % kv_heads:
        allowed = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        raise ValueError(
            f"config.json: num_key_value_heads {kv_heads} does not divide num_attention_heads "
            f"{heads} (each kv head serves a group of query heads); allowed: {allowed}"
        )
    if config.get("head_dim") is None and hidden < heads:
        raise ValueError(
            f"config.json: head_dim is missing and hidden_size {hidden} < num_attention_heads "
            f"{heads} gives 0; allowed: a head_dim >= 1"
        )
    return heads, kv_heads, _optional(config, "head_dim", hidden // heads)


def rope_context(config: dict[str, Any], max_position_embeddings: int) -> RopeContext | None:
    """What the RoPE in ``config`` covers, read as yarnlib reads it everywhere (``from_hf``)."""
    if not max_position_embeddings:
        return None
    from yarnlib.spec import RopeScaling  # the spec layer, only for configs with a length

    try:
        spec = RopeScaling.from_hf(config)
    except ValueError as error:
        raise ValueError(f"config.json: {error}") from None
    original = spec.original_max_position_embeddings or max_position_embeddings
    if spec.is_checkpoint_scaling:
        return RopeContext(spec.method, spec.factor, original, max_position_embeddings, True)
    if spec.method == "none":
        key = (config.get("model_type"), max_position_embeddings)
        original = PUBLISHED_ORIGINALS.get(key, max_position_embeddings)
        return RopeContext("none", 1.0, original, max_position_embeddings, False)
    return RopeContext(spec.method, spec.factor, original, spec.max_position_embeddings, False)


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    model_type = config.get("model_type")
    if model_type not in LAYER_CLASSES:
        raise ValueError(
            f"config.json: model_type {model_type!r} is not planned; allowed: "
            f"{', '.join(ARCHITECTURES)}"
        )
    heads, kv_heads, head_dim = _heads(config)
    moe = model_type == "qwen3_moe"
    if moe and (config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1):
        raise ValueError(
            "config.json: mlp_only_layers / decoder_sparse_step: dense layers inside a MoE "
            "model are not planned; allowed: every layer MoE (decoder_sparse_step 1)"
        )
    length = _optional(config, "max_position_embeddings", 0)
    return ModelShape(
        model_type=model_type,
        num_hidden_layers=_field(config, "num_hidden_layers"),
        hidden_size=_field(config, "hidden_size"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_field(config, "moe_intermediate_size" if moe else "intermediate_size"),
        vocab_size=_field(config, "vocab_size"),
        tie_word_embeddings=_flag(config, "tie_word_embeddings"),
        attention_bias=model_type == "qwen2" or _flag(config, "attention_bias"),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        num_experts=_field(config, "num_experts") if moe else 0,
        num_experts_per_tok=_field(config, "num_experts_per_tok") if moe else 0,
        max_position_embeddings=length,
        rope=rope_context(config, length),
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
