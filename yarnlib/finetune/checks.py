"""Checks that fail a run before its first step instead of hours into it."""

from __future__ import annotations

import warnings

from yarnlib.spec import RopeScaling


def sequence_multiple(cp_size: int, sp_size: int) -> int:
    """What the attention needs seq_len to divide by: context parallelism splits every row into
    2·cp_size load-balanced chunks; DeepSpeed Ulysses splits it across sp_size ranks."""
    return max(2 * cp_size if cp_size > 1 else 1, sp_size)


def check_seq_len(seq_len: int, cp_size: int = 1, sp_size: int = 1) -> None:
    if seq_len < 2:
        raise ValueError(f"seq_len must be an integer >= 2, got {seq_len!r}")
    multiple = sequence_multiple(cp_size, sp_size)
    if seq_len % multiple:
        raise ValueError(
            f"seq_len: {seq_len} is not a multiple of {multiple}, which the attention needs "
            f"(context-parallel size {cp_size}, sequence-parallel size {sp_size}); allowed: "
            f"multiples of {multiple}, e.g. {seq_len - seq_len % multiple + multiple}"
        )


def check_length(seq_len: int, spec: RopeScaling | None) -> None:
    """Warn when training beyond the context the scaling is meant for."""
    original = spec.original_max_position_embeddings if spec else None
    if spec is None or original is None:
        return
    target = int(original * spec.factor)
    if seq_len > target:
        warnings.warn(
            f"seq_len {seq_len} exceeds original_max_position_embeddings × factor = {original} × "
            f"{spec.factor:g} = {target}: positions past {target} are extrapolated; "
            f"use --factor {seq_len / original:g} or more",
            stacklevel=2,
        )


def check_dataset(rows: int, tokens: int, seq_len: int, global_batch: int) -> None:
    if rows < global_batch:
        raise ValueError(
            f"dataset: {tokens} tokens pack into {rows} rows of seq_len {seq_len}, fewer than one "
            f"global batch of {global_batch} rows (batch_size × grad_accum × data-parallel "
            "processes); allowed: more data, or a smaller --seq-len, --batch-size or --grad-accum"
        )


def pose_factor(config, target_length: int, original: int | None) -> float:
    """PoSE's default factor: the target over the original context (``--factor`` left out)."""
    original = original or RopeScaling.from_hf(config).original_max_position_embeddings
    if original is None:
        raise ValueError(
            "original_max_position_embeddings: the config does not record the original context; "
            "pass it (or --factor) explicitly"
        )
    if target_length < original:  # the default factor would be < 1: name what the user gave
        raise ValueError(
            f"target_length: --target-length {target_length} is below the model's original "
            f"context of {original} tokens (original_max_position_embeddings); allowed: "
            f"--target-length >= {original}, or an explicit --factor"
        )
    return target_length / original


def check_target(target_length: int, spec: RopeScaling | None) -> None:
    """PoSE: the scaling must reach the target (``--method none`` trains the native RoPE at
    positions up to the target, extrapolating by choice)."""
    if spec is None or spec.original_max_position_embeddings is None:
        return
    reach = spec.original_max_position_embeddings * spec.factor
    if reach < target_length:
        raise ValueError(
            f"factor: {spec.factor:g} × original_max_position_embeddings "
            f"{spec.original_max_position_embeddings} = {reach:g} < target_length {target_length}; "
            f"allowed: --factor >= {target_length / spec.original_max_position_embeddings:g}, or "
            "leave --factor out (then target_length / original)"
        )
