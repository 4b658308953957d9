"""Checkpoints that ship a scaling: ``llama3`` (Llama 3.1-3.3) and ``longrope`` (Phi-3,
Phi-4-mini). Read, kept exact, never composed with another method.

The reference is transformers' own ``ROPE_INIT_FUNCTIONS`` and its unpatched model.
"""

import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import yarnlib
from yarnlib import RopeScaling, cli
from yarnlib.config import current_spec, show, target_spec
from yarnlib.hf_compat import hf_format
from yarnlib.vllm.args_cli import model_kwargs, spec_for_model

ORIGINAL, CONTEXT, HEAD_DIM = 64, 1024, 32  # scaled-down checkpoints: context 16 × original
ROPES = {
    "llama3": {  # Llama-3.1-8B's settings (factor 8, context 16 × original)
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
    },
    "longrope": {  # Phi-3 style: no factor (context / original), one divisor per frequency
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.05 * i for i in range(HEAD_DIM // 2)],
        "long_factor": [1.5 + 0.3 * i for i in range(HEAD_DIM // 2)],
        "original_max_position_embeddings": ORIGINAL,
    },
}
FACTOR = {"llama3": 8.0, "longrope": CONTEXT / ORIGINAL}


def checkpoint_config(rope_type, partial=1.0, **rope):
    from tiny_models import hand_written_rope, tiny_config

    params = {**ROPES[rope_type], **rope}
    if partial != 1.0 and rope_type == "longrope":
        params["short_factor"] = params["short_factor"][: int(HEAD_DIM * partial) // 2]
        params["long_factor"] = params["long_factor"][: int(HEAD_DIM * partial) // 2]
    kw = {"partial_rotary_factor": partial} if partial != 1.0 else {}
    if rope_type == "longrope" and hf_format() == "v4":
        # transformers 4 reads it at the top level, where Phi-3's config.json has it
        kw["original_max_position_embeddings"] = ORIGINAL
    return tiny_config(
        "llama",
        head_dim=HEAD_DIM,
        max_position_embeddings=CONTEXT,
        **hand_written_rope(params),
        **kw,
    )


VARIANTS = [
    ("llama3", {}),
    ("llama3", {"factor": 32.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0}),
    ("llama3", {"rope_theta": 1e4}),
    ("longrope", {}),
    ("longrope", {"factor": 4.0, "attention_factor": 1.1}),
]


@pytest.mark.parametrize("rope_type, rope", VARIANTS)
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_from_hf_is_transformers(rope_type, rope, partial):
    config = checkpoint_config(rope_type, partial, **rope)
    spec = RopeScaling.from_hf(config)
    assert spec.method == rope_type and spec.rotary_dim == int(HEAD_DIM * partial)
    for seq_len in (None, ORIGINAL, ORIGINAL + 1, CONTEXT):  # longrope switches past L
        inv_freq, attention = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
        got = spec.frequencies(seq_len)
        assert torch.equal(got.inv_freq, inv_freq) and got.attention_factor == attention
    # and back: the dict yarnlib writes is the one it read (partial rotary: issue 13.2)
    written = {**config.to_dict(), **spec.to_hf(hf_format())}
    assert RopeScaling.from_hf(written, rotary_dim=spec.rotary_dim) == spec


@pytest.mark.parametrize("rope", [{}, {"factor": 4.0}])
def test_longrope_without_an_original_length_takes_max_position_embeddings(rope):
    """A config.json whose longrope names no original_max_position_embeddings (neither in
    the rope dict nor at the top level): transformers takes max_position_embeddings as L."""
    from tiny_models import hand_written_rope, tiny_config

    if not rope and hf_format() == "v4":
        pytest.skip("transformers 4's longrope needs a factor here (it compares None <= 1.0)")

    params = {k: v for k, v in ROPES["longrope"].items() if k != "original_max_position_embeddings"}
    keys = {"max_position_embeddings": CONTEXT, **hand_written_rope({**params, **rope})}
    spec = RopeScaling.from_hf({"model_type": "llama", "head_dim": HEAD_DIM, **keys})
    config = tiny_config("llama", head_dim=HEAD_DIM, **keys)  # the reference (fills L in keys)
    assert spec.original_max_position_embeddings == CONTEXT
    for seq_len in (None, CONTEXT, CONTEXT + 1):
        inv_freq, attention = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=seq_len)
        got = spec.frequencies(seq_len)
        assert torch.equal(got.inv_freq, inv_freq) and got.attention_factor == attention


@pytest.fixture(params=sorted(ROPES))
def model_dir(request, tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = checkpoint_config(request.param)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    return tmp_path


def rope_type_of(model_dir):
    return current_spec(model_dir).method


def test_patch_with_its_own_method_is_exact(model_dir):
    from transformers import AutoModelForCausalLM

    rope_type = rope_type_of(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = [model(ids[:, :n]).logits for n in (ORIGINAL, 300)]
        yarnlib.patch(model, method=rope_type, factor=FACTOR[rope_type])
        after = [model(ids[:, :n]).logits for n in (ORIGINAL, 300)]
    assert RopeScaling.from_hf(model.config) == current_spec(model_dir)
    assert model.config.max_position_embeddings == CONTEXT  # the checkpoint's, not L × s
    for a, b in zip(after, before, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_config_with_its_own_method_keeps_what_transformers_runs(model_dir):
    from transformers import AutoConfig

    rope_type = rope_type_of(model_dir)
    out = model_dir.parent / f"{model_dir.name}-out"
    args = ["config", str(model_dir), "--method", rope_type, "--factor", str(FACTOR[rope_type])]
    assert cli.main([*args, "--output", str(out)]) == 0
    native, written = AutoConfig.from_pretrained(model_dir), AutoConfig.from_pretrained(out)
    for seq_len in (None, CONTEXT):
        assert torch.equal(
            ROPE_INIT_FUNCTIONS[rope_type](written, None, seq_len=seq_len)[0],
            ROPE_INIT_FUNCTIONS[rope_type](native, None, seq_len=seq_len)[0],
        )
    assert written.max_position_embeddings == CONTEXT


@pytest.mark.parametrize("method, factor", [("yarn", 4.0), ("same", 32.0), ("none", 1.0)])
def test_other_scaling_on_top_is_refused_with_what_to_do(model_dir, method, factor):
    rope_type = rope_type_of(model_dir)
    method = rope_type if method == "same" else method
    with pytest.raises(ValueError, match=f"already runs rope '{rope_type}'") as error:
        target_spec(model_dir, method, factor)
    assert f"Use method '{rope_type}' with factor {FACTOR[rope_type]:g}" in str(error.value)
    with pytest.raises(ValueError, match=f"already runs rope '{rope_type}'"):
        spec_for_model(model_dir, method, factor)


NOT_APPLIED = {
    "llama3": "method 'llama3' is kept where a checkpoint",
    # longrope goes onto a model only as yarnlib tune writes it (a spec file)
    "longrope": "method 'longrope' applies to a model only with per-frequency factors",
}


@pytest.mark.parametrize("rope_type", sorted(ROPES))
def test_not_applied_to_a_model_that_does_not_ship_it(rope_type):
    from tiny_models import tiny_model

    with pytest.raises(ValueError, match=NOT_APPLIED[rope_type]):
        yarnlib.patch(tiny_model(), rope_type, 8.0)


def test_vllm_args_inspect_and_show(model_dir, capsys):
    rope_type = rope_type_of(model_dir)
    spec = spec_for_model(model_dir, rope_type, FACTOR[rope_type])
    kwargs = model_kwargs(model_dir, spec, vllm_version="0.32.0")
    expected = {**ROPES[rope_type], "factor": FACTOR[rope_type]}
    if rope_type == "longrope":  # vLLM reads the attention factor only from these two
        attention = spec.attention_factor()
        expected.update(short_mscale=attention, long_mscale=attention)
    assert kwargs["hf_overrides"]["rope_parameters"] == expected
    # vLLM derives both types' length from max_position_embeddings unmultiplied: leave it
    assert "max_position_embeddings" not in kwargs["hf_overrides"]
    assert kwargs["max_model_len"] == CONTEXT
    assert cli.main(["inspect", str(model_dir)]) == 0
    assert f"{rope_type} factor={FACTOR[rope_type]:g} original={ORIGINAL}" in (
        capsys.readouterr().out
    )
    report = show(model_dir)  # `yarnlib config DIR --show`
    assert report["spec"]["method"] == rope_type and report["inconsistencies"] == []
    assert (report["native_context"], report["extended_context"]) == (ORIGINAL, CONTEXT)


def test_installed_vllm_runs_the_same(model_dir):
    """vLLM's config loading, derived max_model_len and get_rope on the vllm-args output."""
    pytest.importorskip("vllm")
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    rope_type = rope_type_of(model_dir)
    spec = spec_for_model(model_dir, rope_type, FACTOR[rope_type])
    kwargs = model_kwargs(model_dir, spec)
    config = ModelConfig(
        model=str(model_dir),
        hf_overrides=kwargs["hf_overrides"],
        max_model_len=kwargs["max_model_len"],
        skip_tokenizer_init=True,
        dtype="float32",
    )
    hf = config.hf_config
    vllm_config = VllmConfig(model_config=config, device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(vllm_config):
        rope = get_rope(
            HEAD_DIM, hf.max_position_embeddings, True, hf.rope_parameters, torch.float32
        )
    # longrope: [short table over L | long table over the context]; vLLM runs the long one
    # once max_model_len exceeds L, as transformers does for a sequence longer than L.
    table = getattr(rope, "long_short_cos_sin_cache", None)
    table = rope.cos_sin_cache if table is None else table[ORIGINAL:]
    inv_freq, attention = spec.frequencies(CONTEXT)
    angles = torch.arange(CONTEXT, dtype=torch.float32)[:, None] * inv_freq
    expected = torch.cat((angles.cos() * attention, angles.sin() * attention), dim=-1)
    torch.testing.assert_close(table[:CONTEXT], expected, rtol=0, atol=2e-6)
