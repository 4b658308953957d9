"""Checkpoints that ship ``rope_type: llama3`` (Llama 3.1/3.2/3.3): read, kept exact, not composed.

The reference is transformers' own ``ROPE_INIT_FUNCTIONS["llama3"]`` and its unpatched model.
"""

import json

import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import yarnlib
from yarnlib import RopeScaling, cli, config_files
from yarnlib.vllm.args_cli import model_kwargs, spec_for_model

LLAMA31 = {  # Llama-3.1-8B's rope settings, scaled down: original 64, context 1024 (16 × 64)
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def llama3_config(**rope):
    from tiny_models import tiny_config

    return tiny_config(
        "llama", head_dim=32, max_position_embeddings=1024, rope_parameters={**LLAMA31, **rope}
    )


@pytest.mark.parametrize(
    "rope",
    [{}, {"factor": 32.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0}, {"rope_theta": 1e4}],
)
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_from_hf_is_transformers_llama3(rope, partial):
    config = llama3_config(**rope, partial_rotary_factor=partial)
    inv_freq, attention = ROPE_INIT_FUNCTIONS["llama3"](config)
    spec = RopeScaling.from_hf(config)
    assert spec.method == "llama3" and spec.rotary_dim == int(32 * partial)
    assert torch.equal(spec.inv_freq(), inv_freq) and spec.attention_factor() == attention
    # and back: the dict yarnlib writes is the one it read (partial rotary: issue 13.2)
    written = {**config.to_dict(), **spec.to_hf("v5")}
    assert RopeScaling.from_hf(written, rotary_dim=spec.rotary_dim) == spec


@pytest.fixture
def model_dir(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = llama3_config()
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    return tmp_path


def test_patch_with_its_own_method_is_exact(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        yarnlib.patch(model, method="llama3", factor=8)
        after = model(ids).logits
    assert RopeScaling.from_hf(model.config) == RopeScaling.from_hf(
        json.loads((model_dir / "config.json").read_text())
    )
    assert model.config.max_position_embeddings == 1024  # the checkpoint's, not 64 × 8
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)


def test_config_with_its_own_method_keeps_what_transformers_runs(model_dir):
    from transformers import AutoConfig

    out = model_dir.parent / f"{model_dir.name}-out"
    assert (
        cli.main(
            ["config", str(model_dir), "--method", "llama3", "--factor", "8", "--output", str(out)]
        )
        == 0
    )
    native, written = AutoConfig.from_pretrained(model_dir), AutoConfig.from_pretrained(out)
    assert torch.equal(
        ROPE_INIT_FUNCTIONS["llama3"](written)[0], ROPE_INIT_FUNCTIONS["llama3"](native)[0]
    )
    assert written.max_position_embeddings == 1024


@pytest.mark.parametrize(
    "method, factor", [("yarn", 4.0), ("llama3", 16.0), ("none", 1.0), ("linear", 8.0)]
)
def test_other_scaling_on_top_is_refused_with_what_to_do(model_dir, method, factor):
    with pytest.raises(ValueError, match="already runs rope 'llama3'") as error:
        config_files.target_spec(model_dir, method, factor)
    assert "Use method 'llama3' with factor 8" in str(error.value)
    with pytest.raises(ValueError, match="already runs rope 'llama3'"):
        spec_for_model(model_dir, method, factor)


def test_llama3_is_not_applied_to_a_model_that_does_not_ship_it():
    from tiny_models import tiny_model

    with pytest.raises(ValueError, match="method 'llama3' is kept where a checkpoint ships it"):
        yarnlib.patch(tiny_model(), "llama3", 8.0)


def test_vllm_args_write_the_native_llama3(model_dir, capsys):
    spec = spec_for_model(model_dir, "llama3", 8.0)
    kwargs = model_kwargs(model_dir, spec, vllm_version="0.32.0")
    params = kwargs["hf_overrides"]["rope_parameters"]
    assert params == LLAMA31
    # vLLM derives llama3's length from max_position_embeddings unmultiplied: leave it
    assert "max_position_embeddings" not in kwargs["hf_overrides"]
    assert kwargs["max_model_len"] == 1024
    assert cli.main(["inspect", str(model_dir)]) == 0
    assert "llama3 factor=8 original=64" in capsys.readouterr().out
    report = config_files.show(model_dir)  # `yarnlib config DIR --show`
    assert report["spec"]["method"] == "llama3" and report["inconsistencies"] == []
    assert (report["native_context"], report["extended_context"]) == (64, 1024)
    assert report["vllm"] == {"rope_parameters": LLAMA31, "max_model_len": 1024}


def test_installed_vllm_runs_the_same_llama3(model_dir):
    """vLLM's config loading, derived max_model_len and get_rope on the vllm-args output."""
    pytest.importorskip("vllm")
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    spec = spec_for_model(model_dir, "llama3", 8.0)
    kwargs = model_kwargs(model_dir, spec)
    config = ModelConfig(
        model=str(model_dir),
        hf_overrides=kwargs["hf_overrides"],
        skip_tokenizer_init=True,
        dtype="float32",
    )
    assert config.max_model_len == kwargs["max_model_len"] == 1024  # derived, not asked for
    hf = config.hf_config
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        rope = get_rope(32, hf.max_position_embeddings, True, hf.rope_parameters, torch.float32)
    angles = torch.arange(1024, dtype=torch.float32)[:, None] * spec.inv_freq()
    expected = torch.cat((angles.cos(), angles.sin()), dim=-1)
    torch.testing.assert_close(rope.cos_sin_cache, expected, rtol=0, atol=2e-6)
