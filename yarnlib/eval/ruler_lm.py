"""lm-eval's ``hf`` model for RULER, ending each greedy answer once its score is settled.

RULER's scores are case-insensitive substring matches of the expected strings in the answer
(``string_match_all`` / ``_part`` in lm-eval's ``ruler/common_utils.py``; the answer is only
stripped of surrounding whitespace and control characters first). Once a greedy answer holds
every expected string, the tokens after it cannot change its score, only its cost: on a CPU
up to 128 decode steps over a 32k cache, on a GPU more time than the prefill. So each answer
stops there; the score is the one the full answer would get, the recorded answer ends earlier.
"""

from __future__ import annotations

import torch
from lm_eval.models.huggingface import HFLM
from transformers import StoppingCriteria, StoppingCriteriaList


class AnswerFound(StoppingCriteria):
    """True once the tokens after ``prompt_tokens`` decode to text holding every string of
    ``expected`` (case-insensitive, as RULER scores)."""

    def __init__(self, tokenizer, expected: list[str], prompt_tokens: int):
        self.tokenizer = tokenizer
        self.expected = [e.lower() for e in expected]
        self.prompt_tokens = prompt_tokens

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        answers = [self.tokenizer.decode(row[self.prompt_tokens :]).lower() for row in input_ids]
        done = [all(e in answer for e in self.expected) for answer in answers]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class RulerLM(HFLM):
    """``HFLM`` answering one request at a time, each stopped by its own expected strings (the
    document lm-eval hands over with the request)."""

    expected: list[str] | None = None

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm import tqdm

        answers = []
        for request in tqdm(requests, desc="prompts", disable=disable_tqdm):
            self.expected = list(request.doc.get("outputs") or [])
            answers += super().generate_until([request], disable_tqdm=True)
        return answers

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        if not self.expected:
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        found = AnswerFound(self.tokenizer, self.expected, context.shape[1])
        generate = self.model.generate

        def generate_until_found(*args, stopping_criteria, **kwargs):
            criteria = StoppingCriteriaList([*stopping_criteria, found])
            return generate(*args, stopping_criteria=criteria, **kwargs)

        self.model.generate = generate_until_found  # HFLM passes its own stop criteria in
        try:
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        finally:
            del self.model.generate
