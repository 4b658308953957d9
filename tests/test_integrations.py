"""verl / EasyR1 recipes against configs in their documented formats (neither is installed)."""

import json
from pathlib import Path

import pytest
import yaml
from transformers import AutoConfig

from yarnlib import RopeScaling
from yarnlib.integrations import easyr1, verl
from yarnlib.vllm import llm_kwargs

EXAMPLES = Path(__file__).parent.parent / "examples"
# The keys verl's reference config (verl/trainer/config/_generated_ppo_trainer.yaml) documents.
VERL_YAML = """
data:
  max_prompt_length: 8192
  max_response_length: 24576
actor_rollout_ref:
  model:
    path: ~/models/tiny
    override_config: {attn_implementation: sdpa}
  actor:
    use_dynamic_bsz: true
    ppo_max_token_len_per_gpu: 16384
  rollout:
    name: vllm
    prompt_length: ${oc.select:data.max_prompt_length,512}
    response_length: ${oc.select:data.max_response_length,512}
    max_model_len: null
    max_num_batched_tokens: 8192
    enable_chunked_prefill: true
    engine_kwargs:
      vllm: {}
      sglang: {}
"""
# EasyR1's examples/config.yaml keys.
EASYR1_YAML = """
data:
  max_prompt_length: 256
  max_response_length: 512
worker:
  actor:
    model:
      model_path: MODEL
      enable_gradient_checkpointing: true
  rollout:
    n: 5
    enable_chunked_prefill: false
    tensor_parallel_size: 2
"""


def spec(method="yarn", factor=4.0):
    return RopeScaling(method, factor, 8192, 1e6, 128)


def test_verl_sets_actor_and_rollout_alike(tmp_path):
    path = tmp_path / "verl.yaml"
    path.write_text(VERL_YAML)
    cfg = verl.apply(path, spec())
    model, rollout = cfg["actor_rollout_ref"]["model"], cfg["actor_rollout_ref"]["rollout"]
    expected = llm_kwargs(spec(), max_model_len=8192 + 24576)
    assert rollout["engine_kwargs"]["vllm"]["hf_overrides"] == expected["hf_overrides"]
    assert rollout["max_model_len"] == 32768
    assert rollout["engine_kwargs"]["sglang"] == {}
    override = model["override_config"]
    assert override["attn_implementation"] == "sdpa"  # the user's keys stay
    assert override["rope_scaling"]["rope_theta"] == override["rope_theta"] == 1e6
    # the rollout's dict also says how much of a head rotates (~/models/tiny is not there)
    assert {**override["rope_scaling"], "rope_dim": 128} == expected["hf_overrides"][
        "rope_parameters"
    ]
    assert cfg["actor_rollout_ref"]["actor"]["ppo_max_token_len_per_gpu"] == 32768
    assert verl.apply(cfg, spec()) == cfg  # applying twice changes nothing


@pytest.mark.parametrize("method", ["linear", "ntk", "ntk_by_parts", "yarn"])
def test_verl_actor_config_runs_the_spec(tmp_path, method):
    from tiny_models import tiny_config

    tiny_config("qwen2", head_dim=32).save_pretrained(tmp_path)
    target = RopeScaling(method, 4.0, 256, 50000.0, 32)
    override = verl.apply({}, target)["actor_rollout_ref"]["model"]["override_config"]
    # transformers applies the override as config keywords
    config = AutoConfig.from_pretrained(tmp_path, **override)
    assert RopeScaling.from_hf(config).inv_freq().equal(target.inv_freq())
    assert RopeScaling.from_hf(config).attention_factor() == target.attention_factor()


def test_verl_refuses_lengths_beyond_the_spec():
    cfg = yaml.safe_load(VERL_YAML)
    cfg["data"]["max_response_length"] = 40000
    with pytest.raises(ValueError, match="data.max_prompt_length"):
        verl.apply(cfg, spec())


@pytest.mark.parametrize("method", ["dynamic_yarn", "dynamic_ntk"])
def test_dynamic_methods_refused(method):
    with pytest.raises(ValueError, match="static method"):
        verl.apply({}, spec(method))


@pytest.fixture
def easyr1_cfg(tmp_path):
    from tiny_models import tiny_model

    folder = tmp_path / "tiny"
    tiny_model("llama", head_dim=32).save_pretrained(folder)
    return yaml.safe_load(EASYR1_YAML.replace("MODEL", str(folder))), folder


def test_easyr1_rewrites_the_checkpoint(easyr1_cfg, tmp_path):
    cfg, folder = easyr1_cfg
    target = RopeScaling("yarn", 4.0, 256, 50000.0, 32)
    out = easyr1.apply(cfg, target, output=tmp_path / "tiny-yarn4")
    assert out["worker"]["actor"]["model"]["model_path"] == str(tmp_path / "tiny-yarn4")
    written = json.loads((tmp_path / "tiny-yarn4" / "config.json").read_text())
    assert RopeScaling.from_hf(written) == target  # what actor and rollout both load
    assert RopeScaling.from_hf(json.loads((folder / "config.json").read_text())).method == "none"
    assert out["worker"]["rollout"]["max_model_len"] == 768
    assert out["worker"]["rollout"]["max_num_batched_tokens"] == 8192
    assert cfg["worker"]["actor"]["model"]["model_path"] == str(folder)  # input untouched


def test_easyr1_refuses_actor_only_rope_keys(easyr1_cfg, tmp_path):
    cfg, _ = easyr1_cfg
    cfg["worker"]["actor"]["model"]["override_config"] = {"rope_scaling": {"factor": 2}}
    with pytest.raises(ValueError, match="override_config"):
        easyr1.apply(cfg, RopeScaling("yarn", 4.0, 256, 50000.0, 32), output=tmp_path / "o")


def test_easyr1_needs_a_local_folder():
    cfg = yaml.safe_load(EASYR1_YAML.replace("MODEL", "Qwen/Qwen2.5-7B-Instruct"))
    with pytest.raises(ValueError, match="model_path"):
        easyr1.apply(cfg, spec(), in_place=True)


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*grpo*128k*.yaml")))
def test_examples_are_consistent(name):
    cfg = yaml.safe_load((EXAMPLES / name).read_text())
    target = RopeScaling("yarn", 4.0, 32768, 1e6, 128)  # both Qwen models' recommended YaRN
    if name.startswith("verl"):
        assert verl.apply(cfg, target) == cfg
    else:
        rollout = cfg["worker"]["rollout"]
        data = cfg["data"]
        assert rollout["max_model_len"] == data["max_prompt_length"] + data["max_response_length"]
        assert rollout["max_model_len"] <= target.max_position_embeddings
