"""Parallel degrees a model allows, by the rules the engines themselves enforce.

- Ulysses sequence parallel (verl, EasyR1): heads % sp == 0, and kv_heads % sp == 0 or
  sp % kv_heads == 0 (the kv heads are then repeated) — verl's ``apply_monkey_patch``;
  sp divides the number of GPUs.
- vLLM tensor parallel: heads % tp == 0 (``ModelConfig.verify_with_parallel_config``);
  kv_heads % tp == 0 or tp % kv_heads == 0 (``QKVParallelLinear`` replicates kv heads when
  tp exceeds them); the MLP's intermediate size divides by tp (``MergedColumnParallelLinear``);
  tp divides the GPUs of one node.
- Context parallel (torch, through accelerate): cp divides the number of GPUs and the
  sequence splits into 2·cp load-balanced chunks (``yarnlib.finetune.checks``).
"""

from __future__ import annotations

from yarnlib.finetune.checks import sequence_multiple
from yarnlib.plan.shapes import ModelShape


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _heads_split(heads: int, kv_heads: int, degree: int) -> bool:
    return heads % degree == 0 and (kv_heads % degree == 0 or degree % kv_heads == 0)


def ulysses_ok(shape: ModelShape, sp: int) -> bool:
    return _heads_split(shape.num_attention_heads, shape.num_key_value_heads, sp)


def tensor_parallel_ok(shape: ModelShape, tp: int) -> bool:
    heads = _heads_split(shape.num_attention_heads, shape.num_key_value_heads, tp)
    return heads and shape.intermediate_size % tp == 0


def ulysses_degrees(shape: ModelShape, gpus: int) -> list[int]:
    return [sp for sp in divisors(gpus) if ulysses_ok(shape, sp)]


def tensor_parallel_degrees(shape: ModelShape, gpus_per_node: int) -> list[int]:
    return [tp for tp in divisors(gpus_per_node) if tensor_parallel_ok(shape, tp)]


def context_parallel_degrees(gpus: int, tokens: int) -> list[int]:
    return [cp for cp in divisors(gpus) if tokens % sequence_multiple(cp, 1) == 0]


def _allowed(values: list[int]) -> str:
    return ", ".join(map(str, values)) or "none"


def check_ulysses(shape: ModelShape, sp: int, gpus: int) -> None:
    if gpus % sp or not ulysses_ok(shape, sp):
        raise ValueError(
            f"sp: {sp} does not split {shape.num_attention_heads} attention heads / "
            f"{shape.num_key_value_heads} kv heads over {gpus} GPUs (verl's Ulysses needs heads "
            "% sp == 0 and kv_heads % sp == 0 or sp % kv_heads == 0, sp dividing the GPUs); "
            f"allowed: {_allowed(ulysses_degrees(shape, gpus))}"
        )


def check_tensor_parallel(shape: ModelShape, tp: int, gpus_per_node: int) -> None:
    if gpus_per_node % tp or not tensor_parallel_ok(shape, tp):
        raise ValueError(
            f"tp: {tp} does not split {shape.num_attention_heads} attention heads / "
            f"{shape.num_key_value_heads} kv heads / intermediate {shape.intermediate_size} over "
            f"{gpus_per_node} GPUs of a node (vLLM needs heads % tp == 0, kv_heads % tp == 0 or "
            f"tp % kv_heads == 0, intermediate % tp == 0); allowed: "
            f"{_allowed(tensor_parallel_degrees(shape, gpus_per_node))}"
        )


def check_context_parallel(cp: int, gpus: int, tokens: int) -> None:
    if gpus % cp or tokens % sequence_multiple(cp, 1):
        raise ValueError(
            f"cp: {cp} with {gpus} GPUs and {tokens} tokens; context parallelism needs cp to "
            f"divide the GPUs and the tokens to split into 2·cp chunks; allowed: "
            f"{_allowed(context_parallel_degrees(gpus, tokens))}"
        )
