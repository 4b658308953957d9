"""The nll objective of ``yarnlib tune`` against plain transformers (issue 52, mutation round 4):
the NLL beyond L and, beside it, within L, where position 0 has no NLL."""

import math

import pytest
import torch
from tiny_models import native_rope_keys, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

from yarnlib.spec import RopeScaling
from yarnlib.tune.search import objective

L, N = 64, 160


def float64_nlls(model, spec, ids: torch.Tensor) -> list[float]:
    """NLL of tokens 1 … len - 1 (index i - 1 for token i) by transformers running ``spec``
    natively, full float64 log-softmax."""
    fields = {k: v for k, v in model.config.to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model("llama", **{**fields, **native_rope_keys(spec)})
    plain = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        logp = plain(ids[None]).logits[0, :-1].double().log_softmax(-1)
    return (-logp.gather(-1, ids[1:, None])[:, 0]).tolist()


def test_nll_beyond_and_within_the_original_context_equal_plain_transformers():
    model = tiny_model("llama", vocab_size=96, max_position_embeddings=L)
    spec = RopeScaling.from_hf(model.config).rescaled("yarn", N / L, L, beta_fast=16.0)
    gen = torch.Generator().manual_seed(0)
    samples = [torch.randint(96, (N,), generator=gen) for _ in range(2)]
    got = objective(model, samples, spec, L)
    beyond, within = [], []
    for ids in samples:
        nll = float64_nlls(model, spec, ids)
        beyond += nll[L - 1 :]  # tokens L … N - 1
        within += nll[: L - 1]  # tokens 1 … L - 1: token 0 follows nothing
    assert math.isfinite(got["nll_within_original"])
    assert got["objective"] == pytest.approx(sum(beyond) / len(beyond), abs=2e-5)
    assert got["nll_within_original"] == pytest.approx(sum(within) / len(within), abs=2e-5)
    assert got["tokens_beyond_original"] == len(beyond)
