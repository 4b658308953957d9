"""The number GRPO users need: how far the rollout engine's log-probs are from the actor's.

For each sampled sequence (prompt + completion), every token's log-prob under the vLLM
rollout and under the transformers actor, |Δ| split at the original context L (tokens at
positions 1..L-1 and ≥ L). TRL's importance-sampling ratio is exp(actor − rollout) on the
completion tokens; with ``use_vllm=False`` TRL does not compute it, so it is computed here.
Besides yarnlib's setup, the two mistakes users make are scored on the same sequences:
the actor patched in memory while vLLM reads the original config.json, and a rope override
without ``rope_theta`` (vLLM then runs theta 10000).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from yarnlib.integrations.trl_rollout import build_engine, close_engine, prompt_token_logprobs
from yarnlib.spec import RopeScaling
from yarnlib.vllm import llm_kwargs
from yarnlib.vllm.check_rollout import stats


def gap(
    rollout: list[list[float]], actor: list[torch.Tensor], original: int
) -> dict[str, dict[str, Any]]:
    """max/mean |Δ log p| within (positions 1..L-1) and beyond L, over all sequences."""
    deltas = [(torch.tensor(r) - a).abs() for r, a in zip(rollout, actor, strict=True)]
    within = torch.cat([d[: original - 1] for d in deltas])  # d[i] is the token at position i+1
    beyond = torch.cat([d[original - 1 :] for d in deltas])
    return {"within": stats(within), "beyond": stats(beyond)}


def mistaken_kwargs(spec: RopeScaling, max_model_len: int) -> dict[str, dict[str, Any]]:
    """vLLM engine kwargs for the original model folder, as users set them up by mistake."""
    right = llm_kwargs(spec, max_model_len)
    without_theta = copy.deepcopy(right)
    without_theta["hf_overrides"].pop("rope_theta")
    without_theta["hf_overrides"]["rope_parameters"].pop("rope_theta")
    length_only = {"hf_overrides": {"max_position_embeddings": spec.max_position_embeddings}}
    return {
        # only the length raised, so vLLM accepts max_model_len; RoPE from config.json
        "original config.json in vLLM, actor patched": {
            **length_only,
            "max_model_len": max_model_len,
        },
        "override without rope_theta": without_theta,
    }


def engine_logprobs(llm, sequences: list[list[int]]) -> list[list[float]]:
    """The engine's log-prob of every token after the first of each sequence."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
    return [prompt_token_logprobs(o, s) for o, s in zip(outputs, sequences, strict=True)]


def mistakes(
    original_model: str,
    spec: RopeScaling,
    max_model_len: int,
    record: dict[str, Any],
    dtype: str = "float32",
) -> dict[str, dict[str, Any]]:
    """The gap of each mistaken setup on one rollout ``record`` whose actor ran the weights in
    ``original_model`` (the first rollout of a run). One engine at a time."""
    table = {}
    for name, kwargs in mistaken_kwargs(spec, max_model_len).items():
        llm = build_engine(original_model, kwargs, dtype)
        try:
            scores = engine_logprobs(llm, record["sequences"])
        finally:
            close_engine(llm)
        table[name] = gap(scores, record["actor_logprobs"], spec.original_max_position_embeddings)
    return table
