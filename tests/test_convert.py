"""to_hf / from_hf / to_vllm: round trips, and transformers running what the dict says."""

import json

import pytest
import torch
from transformers import AutoConfig, GPT2Config, LlamaConfig, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from yarnlib import RopeScaling
from yarnlib.convert import MARKER, to_hf
from yarnlib.hf_compat import hf_format

SPECS = [
    RopeScaling("none", 1, 4096, 5e5, 64),
    RopeScaling("linear", 4, 4096, 5e5, 64),
    RopeScaling("ntk", 4, 4096, 5e5, 64),
    RopeScaling("dynamic_ntk", 4, 4096, 5e5, 64),
    RopeScaling("ntk_by_parts", 4, 4096, 5e5, 64),
    RopeScaling("yarn", 4, 4096, 5e5, 64),
    RopeScaling("yarn", 8, 2048, 1e6, 64, mscale=0.707, mscale_all_dim=0.707),
    RopeScaling("yarn", 3, 4096, 1e4, 64, attention_factor=1.1, truncate=False, beta_fast=16.0),
    RopeScaling("dynamic_yarn", 4, 4096, 5e5, 64),
]
IDS = [s.describe().replace(" ", "_") for s in SPECS]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("fmt", ["v4", "v5"])
def test_round_trip_through_dict_and_json(spec, fmt):
    keys = to_hf(spec, fmt)
    config_json = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, **keys}
    assert RopeScaling.from_hf(json.loads(json.dumps(config_json))) == spec
    if fmt == "v4":
        assert "rope_theta" in keys and "rope_scaling" in keys
    else:
        assert keys["rope_parameters"]["rope_theta"] > 1


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("fmt", ["v4", "v5"] if hf_format() == "v5" else ["v4"])  # 4.x: no v5
def test_transformers_config_runs_the_spec(spec, fmt, tmp_path):
    """A transformers config made from to_hf(...) — also after save/load — gives our numbers."""
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, **to_hf(spec, fmt))
    config.save_pretrained(tmp_path)
    reloaded = AutoConfig.from_pretrained(tmp_path)
    assert RopeScaling.from_hf(reloaded) == spec
    rotary = LlamaRotaryEmbedding(reloaded)
    # The dynamic methods start at the original length (their frequencies then equal none's).
    assert torch.equal(rotary.inv_freq, spec.inv_freq())
    assert rotary.attention_scaling == spec.attention_factor()
    if spec.is_dynamic:  # transformers recomputes when a longer sequence comes
        x = torch.zeros(1, dtype=torch.float32)
        rotary(x, torch.arange(3 * 4096)[None])
        torch.testing.assert_close(rotary.inv_freq, spec.inv_freq(3 * 4096), rtol=1e-6, atol=0)
        assert rotary.attention_scaling == pytest.approx(spec.attention_factor(3 * 4096))


@pytest.mark.skipif(hf_format() == "v5", reason="transformers 5.x reads rope_parameters")
def test_from_hf_on_4x_says_what_runs_when_only_v5_keys_are_set():
    spec = RopeScaling("yarn", 4, 4096, 5e5, 64)
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, **to_hf(spec, "v5"))
    rotary = LlamaRotaryEmbedding(config)  # 4.x ignores rope_parameters: default rope, theta 1e4
    assert RopeScaling.from_hf(config).method == "none"
    assert torch.equal(rotary.inv_freq, RopeScaling.from_hf(config).inv_freq())


def test_max_position_embeddings_written():
    assert to_hf(RopeScaling("yarn", 4, 32768, 1e6, 128))["max_position_embeddings"] == 131072
    # transformers' dynamic rope reads max_position_embeddings as the original length
    for method in ("dynamic_ntk", "dynamic_yarn"):
        assert to_hf(RopeScaling(method, 4, 4096, 1e4, 64))["max_position_embeddings"] == 4096
    assert "max_position_embeddings" not in to_hf(RopeScaling("linear", 2, None, 1e4, 64))


def test_ntk_lowers_to_plain_rope_with_raised_theta():
    spec = RopeScaling("ntk", 4, 4096, 1e4, 64)
    keys = to_hf(spec, "v4")
    assert keys["rope_scaling"] is None and keys["rope_theta"] == 1e4 * 4 ** (64 / 62)
    assert keys[MARKER]["rope_theta"] == 1e4  # the unscaled base, so a rewrite never compounds


def test_native_configs_without_marker():
    """Configs written by hand or by other tools, in every spelling transformers accepts."""
    base = {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28}
    legacy = {
        **base,
        "rope_theta": 1e6,
        "max_position_embeddings": 32768,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    }
    assert RopeScaling.from_hf(legacy) == RopeScaling("yarn", 4, 32768, 1e6, 128)
    v5 = {**base, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}
    assert RopeScaling.from_hf(v5) == RopeScaling("linear", 2, None, 1e6, 128)
    dynamic = {
        **base,
        "max_position_embeddings": 4096,
        "rope_scaling": {"type": "dynamic", "factor": 2},
    }
    assert RopeScaling.from_hf(dynamic) == RopeScaling("dynamic_ntk", 2, 4096, 1e4, 128)
    plain = {**base, "max_position_embeddings": 4096}  # no rope_theta: transformers uses 10000
    assert RopeScaling.from_hf(plain) == RopeScaling("none", 1, 4096, 1e4, 128)


def test_rotary_dim_from_config():
    qwen3 = Qwen3Config(hidden_size=1024, num_attention_heads=16, head_dim=128)
    assert RopeScaling.from_hf(qwen3).rotary_dim == 128
    partial = {
        "model_type": "llama",
        "hidden_size": 512,
        "num_attention_heads": 4,
        "partial_rotary_factor": 0.5,
    }
    assert RopeScaling.from_hf(partial).rotary_dim == 64
    assert RopeScaling.from_hf(partial, rotary_dim=32).rotary_dim == 32


def test_edited_native_keys_win_over_a_stale_marker():
    spec = RopeScaling("ntk", 4, 4096, 1e4, 64)
    edited = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, **to_hf(spec)}
    edited["rope_theta"] = 123456.0
    assert RopeScaling.from_hf(edited) == RopeScaling("none", 1, 16384, 123456.0, 64)


def test_from_hf_errors_name_the_problem():
    with pytest.raises(ValueError, match="gpt2.*no rotary"):
        RopeScaling.from_hf(GPT2Config())
    with pytest.raises(ValueError, match="rope_scaling.low_freq_factor is required"):
        RopeScaling.from_hf(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 1,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
            }
        )
    with pytest.raises(ValueError, match="rotary_dim"):
        RopeScaling.from_hf({"model_type": "llama", "rope_theta": 1e4})
    with pytest.raises(ValueError, match="format"):
        to_hf(SPECS[0], "v6")


@pytest.mark.parametrize("form", ["v4", "v5"])
def test_yarn_without_factor_is_refused_by_name(form):
    """transformers refuses a yarn dict without ``factor`` (a required key); read as s = 1 it
    would be a yarn that scales nothing."""
    from tiny_models import hand_written_rope

    rope = {"rope_type": "yarn", "rope_theta": 1e4, "original_max_position_embeddings": 256}
    with pytest.raises((KeyError, ValueError), match="factor"):  # the reference
        LlamaConfig(hidden_size=64, num_attention_heads=2, **hand_written_rope(rope))
    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2}
    if form == "v4":
        cfg.update(
            rope_theta=1e4, rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"}
        )
    else:
        cfg["rope_parameters"] = rope
    for length in (256, 1024):  # read as 1 or as the ratio: transformers runs neither
        with pytest.raises(ValueError, match=r"rope_scaling\.factor: missing for rope_type 'yarn'"):
            RopeScaling.from_hf({**cfg, "max_position_embeddings": length})


def test_per_layer_type_and_proportional_rope_are_refused_by_name():
    """Gemma-style rope settings (docs/config.md, "What is refused"): one RoPE per layer type,
    and Gemma 4's proportional type, whose exponents run over the whole head."""
    per_layer = {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    with pytest.raises(ValueError, match=r"per-layer-type rope settings are not supported.*"
                       r"\['full_attention', 'sliding_attention'\]"):  # fmt: skip
        RopeScaling.from_hf({"model_type": "gemma3", "head_dim": 32, "rope_parameters": per_layer})
    proportional = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    with pytest.raises(ValueError, match="rope_type 'proportional' is not supported by yarnlib"):
        RopeScaling.from_hf(
            {"model_type": "gemma4", "head_dim": 32, "rope_parameters": proportional}
        )


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.is_dynamic], ids=str)
def test_to_vllm_always_carries_theta_and_length(spec):
    kwargs = spec.to_vllm()
    overrides = kwargs["hf_overrides"]
    assert overrides["rope_parameters"]["rope_theta"] == overrides["rope_theta"]
    extended = spec.original_max_position_embeddings * spec.factor
    assert kwargs["max_model_len"] == extended
    # as in config.json: vLLM multiplies the linear one by factor itself
    written = extended if spec.method != "linear" else spec.original_max_position_embeddings
    assert overrides["max_position_embeddings"] == written


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_to_vllm_refuses_dynamic_methods(method):
    with pytest.raises(ValueError, match="no native vLLM equivalent"):
        RopeScaling(method, 4, 4096, 1e4, 64).to_vllm()
