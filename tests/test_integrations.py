"""verl / EasyR1 recipes: what ``apply`` writes (verl's own code reads it in
test_verl_config.py; EasyR1's config keys are checked against its source, recorded below)."""

import json
from pathlib import Path

import pytest
import yaml

from yarnlib import RopeScaling
from yarnlib.integrations import easyr1, verl

EXAMPLES = Path(__file__).parent.parent / "examples"
# Keys of verl's reference config (verl/trainer/config/_generated_ppo_trainer.yaml).
VERL_YAML = """
data:
  max_prompt_length: 256
  max_response_length: 512
actor_rollout_ref:
  model:
    path: MODEL
    override_config: {attn_implementation: sdpa}
  actor:
    use_dynamic_bsz: true
    ppo_max_token_len_per_gpu: 512
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
# The init fields of EasyR1's config dataclasses (verl/trainer/config.py, verl/workers/config.py,
# verl/workers/{actor,rollout,reward}/config.py) at hiyouga/EasyR1 commit EASYR1_COMMIT, for the
# sections yarnlib writes; its main merges the YAML into OmegaConf.structured(PPOConfig), which
# rejects any other key. Dict-valued fields (override_config, ...) take any key.
EASYR1_COMMIT = "b44b311b669bf1fd1aa2fc36f2251482ba33cb16"
EASYR1_KEYS = {
    "": "data worker algorithm trainer",
    "data": "train_files val_files prompt_key answer_key image_key video_key image_dir video_fps "
    "max_prompt_length max_response_length rollout_batch_size mini_rollout_batch_size "
    "val_batch_size format_prompt override_chat_template shuffle seed min_pixels max_pixels "
    "filter_overlong_prompts filter_overlong_prompts_workers",
    "algorithm": "gamma lam adv_estimator disable_kl use_kl_loss kl_penalty kl_coef kl_type "
    "kl_horizon kl_target online_filtering filter_key filter_low filter_high",
    "trainer": "total_epochs max_steps project_name experiment_name logger nnodes n_gpus_per_node "
    "max_try_make_batch critic_warmup val_freq val_before_train val_only val_generations_to_log "
    "save_freq save_limit save_model_only save_checkpoint_path load_checkpoint_path ray_timeline "
    "find_last_checkpoint",
    "worker": "hybrid_engine actor critic ref reward rollout",
    "worker.actor": "strategy global_batch_size micro_batch_size_per_device_for_update "
    "micro_batch_size_per_device_for_experience max_grad_norm clip_ratio_low clip_ratio_high "
    "clip_ratio_dual loss_avg_mode loss_type ppo_epochs padding_free dynamic_batching "
    "ulysses_size use_torch_compile tau_positive tau_negative model optim fsdp offload",
    "worker.actor.model": "model_path tokenizer_path override_config enable_gradient_checkpointing "
    "trust_remote_code freeze_vision_tower lora",
    "worker.actor.fsdp": "enable_full_shard enable_cpu_offload enable_rank0_init use_orig_params "
    "torch_dtype fsdp_size mp_param_dtype mp_reduce_dtype mp_buffer_dtype",
    "worker.actor.offload": "offload_params offload_optimizer",
    "worker.rollout": "name n temperature top_p top_k seed limit_images dtype "
    "gpu_memory_utilization ignore_eos enforce_eager enable_chunked_prefill tensor_parallel_size "
    "max_model_len max_num_batched_tokens disable_log_stats disable_tqdm val_override_config",
    "worker.reward": "reward_function reward_function_kwargs skip_special_tokens num_cpus",
}
EASYR1_DICT_FIELDS = {"worker.actor.model.override_config", "worker.rollout.val_override_config"}


def unknown_easyr1_keys(cfg: dict, prefix: str = "") -> list[str]:
    """Dotted keys of ``cfg`` that EasyR1's config dataclasses (as recorded) do not have."""
    if prefix not in EASYR1_KEYS:
        return [f"{prefix} (a section not checked against EasyR1)"]
    unknown = []
    for key, value in cfg.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in EASYR1_KEYS[prefix].split():
            unknown.append(dotted)
        elif isinstance(value, dict) and dotted not in EASYR1_DICT_FIELDS:
            unknown += unknown_easyr1_keys(value, dotted)
    return unknown


def spec(method="yarn", factor=4.0):
    return RopeScaling(method, factor, 256, 50000.0, 32)


@pytest.fixture
def model_dir(tmp_path):
    from tiny_models import tiny_model

    folder = tmp_path / "tiny"
    tiny_model("llama", head_dim=32).save_pretrained(folder)
    return folder


@pytest.fixture
def verl_cfg(model_dir):
    return yaml.safe_load(VERL_YAML.replace("MODEL", str(model_dir)))


def test_verl_rewrites_the_checkpoint(verl_cfg, model_dir, tmp_path):
    out = verl.apply(verl_cfg, spec(), output=tmp_path / "tiny-yarn4")
    model, rollout = out["actor_rollout_ref"]["model"], out["actor_rollout_ref"]["rollout"]
    assert model["path"] == str(tmp_path / "tiny-yarn4")
    written = json.loads((tmp_path / "tiny-yarn4" / "config.json").read_text())
    assert RopeScaling.from_hf(written) == spec()  # what actor, reference and rollout load
    assert written["max_position_embeddings"] == 1024  # verl's rollout checks max_model_len
    assert RopeScaling.from_hf(json.loads((model_dir / "config.json").read_text())).method == "none"
    assert model["override_config"] == {"attn_implementation": "sdpa"}  # the user's keys stay
    assert rollout["engine_kwargs"] == {"vllm": {}, "sglang": {}}  # vLLM reads the file
    assert rollout["max_model_len"] == 768
    assert rollout["max_num_batched_tokens"] == 8192
    assert out["actor_rollout_ref"]["actor"]["ppo_max_token_len_per_gpu"] == 768
    assert verl_cfg["actor_rollout_ref"]["model"]["path"] == str(model_dir)  # input untouched
    before = (tmp_path / "tiny-yarn4" / "config.json").read_bytes()
    assert verl.apply(out, spec(), in_place=True) == out  # applying twice changes nothing
    assert (tmp_path / "tiny-yarn4" / "config.json").read_bytes() == before


def test_verl_tells_the_actor_the_linear_length(verl_cfg, tmp_path):
    out = verl.apply(verl_cfg, spec("linear"), output=tmp_path / "tiny-pi4")
    written = json.loads((tmp_path / "tiny-pi4" / "config.json").read_text())
    assert written["max_position_embeddings"] == 256  # vLLM multiplies it by factor for linear
    override = out["actor_rollout_ref"]["model"]["override_config"]
    assert override == {"attn_implementation": "sdpa", "max_position_embeddings": 1024}
    assert verl.apply(out, spec("linear"), in_place=True) == out


@pytest.mark.parametrize(
    "dotted, value",
    [
        ("actor_rollout_ref.model.override_config", {"rope_scaling": {"factor": 2}}),
        ("actor_rollout_ref.model.override_config.model_config", {"rope_theta": 1e6}),
        ("actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides", {"rope_parameters": {}}),
        ("actor_rollout_ref.model.hf_config_path", "/elsewhere"),
    ],
)
def test_verl_refuses_rope_settings_beside_the_file(verl_cfg, model_dir, tmp_path, dotted, value):
    *parents, last = dotted.split(".")
    node = verl_cfg
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    before = (model_dir / "config.json").read_bytes()
    with pytest.raises(ValueError, match=dotted.replace(".", r"\.")):
        verl.apply(verl_cfg, spec(), in_place=True)
    assert (model_dir / "config.json").read_bytes() == before


def test_verl_refuses_lengths_beyond_the_spec(verl_cfg, tmp_path):
    verl_cfg["data"]["max_response_length"] = 900
    with pytest.raises(ValueError, match="data.max_prompt_length"):
        verl.apply(verl_cfg, spec(), output=tmp_path / "o")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("framework", ["verl", "easyr1"])
def test_prompt_plus_response_may_reach_the_scaled_context(framework, model_dir, tmp_path):
    """256 + 768 = L × s = 1024 is accepted (and becomes max_model_len); one more is refused."""
    module, text = (verl, VERL_YAML) if framework == "verl" else (easyr1, EASYR1_YAML)
    cfg = yaml.safe_load(text.replace("MODEL", str(model_dir)))
    cfg["data"]["max_response_length"] = 769
    with pytest.raises(ValueError, match=r"= 1025 exceeds what .* covers \(1024 = "):
        module.apply(cfg, spec(), output=tmp_path / "o")
    assert not (tmp_path / "o").exists()
    cfg["data"]["max_response_length"] = 768
    out = module.apply(cfg, spec(), output=tmp_path / "o")
    rollout = (
        out["actor_rollout_ref"]["rollout"] if framework == "verl" else out["worker"]["rollout"]
    )
    assert rollout["max_model_len"] == 1024


@pytest.mark.parametrize("method", ["dynamic_yarn", "dynamic_ntk"])
@pytest.mark.parametrize("vllm_version", ["0.11.0", "0.32.0"])
def test_dynamic_methods_refused(method, vllm_version, verl_cfg, easyr1_cfg, model_dir):
    """Refused for GRPO itself, whatever the rollout's vLLM: the refusal of a vLLM too old for
    the plugin (0.11) also says "static method", so the message of this check is matched."""
    before = (model_dir / "config.json").read_bytes()
    for apply, cfg, framework in ((verl.apply, verl_cfg, "verl"),
                                  (easyr1.apply, easyr1_cfg, "EasyR1")):  # fmt: skip
        with pytest.raises(ValueError, match=rf"^method '{method}': in {framework} GRPO the "
                           "transformers actor would scale each batch"):  # fmt: skip
            apply(cfg, spec(method), in_place=True, vllm_version=vllm_version)
    assert (model_dir / "config.json").read_bytes() == before


def test_a_destination_is_required(verl_cfg):
    with pytest.raises(ValueError, match="output=DIR or in_place=True"):
        verl.apply(verl_cfg, spec())


@pytest.fixture
def easyr1_cfg(model_dir):
    return yaml.safe_load(EASYR1_YAML.replace("MODEL", str(model_dir)))


def test_easyr1_rewrites_the_checkpoint(easyr1_cfg, model_dir, tmp_path):
    out = easyr1.apply(easyr1_cfg, spec(), output=tmp_path / "tiny-yarn4")
    assert out["worker"]["actor"]["model"]["model_path"] == str(tmp_path / "tiny-yarn4")
    written = json.loads((tmp_path / "tiny-yarn4" / "config.json").read_text())
    assert RopeScaling.from_hf(written) == spec()  # what actor and rollout both load
    assert RopeScaling.from_hf(json.loads((model_dir / "config.json").read_text())).method == "none"
    assert out["worker"]["rollout"]["max_model_len"] == 768
    assert out["worker"]["rollout"]["max_num_batched_tokens"] == 8192
    assert easyr1_cfg["worker"]["actor"]["model"]["model_path"] == str(model_dir)  # untouched
    assert unknown_easyr1_keys(out) == []


@pytest.mark.parametrize("framework", ["verl", "easyr1"])
def test_the_rollouts_vllm_must_read_the_attention_factor_as_written(
    framework, verl_cfg, easyr1_cfg, tmp_path
):
    apply, cfg = {"verl": (verl.apply, verl_cfg), "easyr1": (easyr1.apply, easyr1_cfg)}[framework]
    knob = RopeScaling("yarn", 4.0, 256, 50000.0, 32, attention_factor=1.0)
    for old in ("0.11.0", "0.24.0"):  # read 0.1·ln(s)+1 whatever config.json says
        with pytest.raises(ValueError, match=f"vLLM {old} reads the YaRN attention factor"):
            apply(cfg, knob, output=tmp_path / old, vllm_version=old)
        assert not (tmp_path / old).exists()  # refused before any file is written
    apply(cfg, knob, output=tmp_path / "new", vllm_version="0.32.0")
    apply(cfg, spec(), output=tmp_path / "plain", vllm_version="0.11.0")  # default factor: read


def test_easyr1_refuses_actor_only_rope_keys(easyr1_cfg, tmp_path):
    easyr1_cfg["worker"]["actor"]["model"]["override_config"] = {"rope_scaling": {"factor": 2}}
    with pytest.raises(ValueError, match="override_config"):
        easyr1.apply(easyr1_cfg, spec(), output=tmp_path / "o")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("framework, yaml_text", [(verl, VERL_YAML), (easyr1, EASYR1_YAML)])
def test_a_local_folder_is_required(framework, yaml_text):
    cfg = yaml.safe_load(yaml_text.replace("MODEL", "Qwen/Qwen2.5-7B-Instruct"))
    with pytest.raises(ValueError, match="path: 'Qwen/Qwen2.5-7B-Instruct' is not a local model"):
        framework.apply(cfg, spec(), in_place=True)


def test_unknown_easyr1_keys_are_found():
    cfg = yaml.safe_load(EASYR1_YAML)
    cfg["worker"]["reward"] = {"score_function": "math.py:compute_score"}  # not an EasyR1 key
    cfg["worker"]["actor"]["model"]["override_config"] = {"attn_implementation": "sdpa"}
    assert unknown_easyr1_keys(cfg) == ["worker.reward.score_function"]


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*grpo*128k*.yaml")))
def test_examples_are_consistent(name):
    cfg = yaml.safe_load((EXAMPLES / name).read_text())
    target = RopeScaling("yarn", 4.0, 32768, 1e6, 128)  # both Qwen models' recommended YaRN
    if name.startswith("verl"):  # verl's own code reads these in test_verl_config.py
        model = cfg["actor_rollout_ref"]["model"]
        rollout = cfg["actor_rollout_ref"]["rollout"]
        assert "engine_kwargs" not in rollout  # the rollout reads the rewritten config.json
    else:
        assert unknown_easyr1_keys(cfg) == []
        model, rollout = cfg["worker"]["actor"]["model"], cfg["worker"]["rollout"]
        assert rollout["max_num_batched_tokens"] >= rollout["max_model_len"]  # EasyR1 requires it
    assert "override_config" not in model
    data = cfg["data"]
    assert rollout["max_model_len"] == data["max_prompt_length"] + data["max_response_length"]
    assert rollout["max_model_len"] <= target.max_position_embeddings


# -- issue 26: every model path of the checkpoint, every spec field checked ----------------


def test_verl_points_critic_and_reward_model_at_the_scaled_folder(verl_cfg, model_dir, tmp_path):
    verl_cfg["critic"] = {"model": {"path": str(model_dir)}}
    verl_cfg["reward_model"] = {"model": {"path": str(model_dir) + "/"}}
    verl_cfg["reward"] = {"reward_model": {"model_path": str(model_dir)}}
    out = verl.apply(verl_cfg, spec(), output=tmp_path / "scaled")
    scaled = str(tmp_path / "scaled")
    assert out["critic"]["model"]["path"] == scaled
    assert out["reward_model"]["model"]["path"] == scaled
    assert out["reward"]["reward_model"]["model_path"] == scaled


def test_easyr1_points_the_critic_at_the_scaled_folder(easyr1_cfg, model_dir, tmp_path):
    easyr1_cfg["worker"]["critic"] = {"model": {"model_path": str(model_dir)}}
    out = easyr1.apply(easyr1_cfg, spec(), output=tmp_path / "scaled")
    assert out["worker"]["critic"]["model"]["model_path"] == str(tmp_path / "scaled")


@pytest.mark.parametrize("framework", ["verl", "easyr1"])
def test_another_short_checkpoint_as_critic_is_refused(framework, verl_cfg, easyr1_cfg, tmp_path):
    from tiny_models import tiny_model

    other = tmp_path / "other"
    tiny_model("llama", head_dim=32).save_pretrained(other)  # context 256 < 768 tokens
    if framework == "verl":
        cfg, dotted, apply = verl_cfg, "critic.model.path", verl.apply
        verl_cfg["critic"] = {"model": {"path": str(other)}}
    else:
        cfg, dotted, apply = easyr1_cfg, "worker.critic.model.model_path", easyr1.apply
        easyr1_cfg["worker"]["critic"] = {"model": {"model_path": str(other)}}
    with pytest.raises(ValueError, match=rf"{dotted}: .* context of 256 tokens, below the 768"):
        apply(cfg, spec(), output=tmp_path / "scaled")
    assert not (tmp_path / "scaled").exists()


@pytest.mark.parametrize("framework", ["verl", "easyr1", "trl"])
def test_a_spec_with_another_rope_theta_is_refused(
    framework, verl_cfg, easyr1_cfg, model_dir, tmp_path
):
    other = RopeScaling("yarn", 4.0, 256, 5e5, 32)  # the model has rope_theta 50000
    before = (model_dir / "config.json").read_bytes()
    with pytest.raises(ValueError, match="rope_theta: the spec has 500000, the model has 50000"):
        if framework == "verl":
            verl.apply(verl_cfg, other, in_place=True)
        elif framework == "easyr1":
            easyr1.apply(easyr1_cfg, other, in_place=True)
        else:
            pytest.importorskip("trl")
            from yarnlib.integrations import trl

            kwargs = dict(output_dir=str(tmp_path / "t"), use_cpu=True, max_completion_length=64)
            trl.apply(model_dir, other, kwargs, output=tmp_path / "scaled")
    assert (model_dir / "config.json").read_bytes() == before
    assert not (tmp_path / "scaled").exists()


# -- issue 52: the same checkpoint under another name; checks that need no verl ------------------


@pytest.mark.parametrize("framework", ["verl", "easyr1"])
@pytest.mark.parametrize("naming", ["relative", "symlink"])
def test_the_actors_checkpoint_by_another_name_is_the_same_checkpoint(
    framework, naming, verl_cfg, easyr1_cfg, model_dir, tmp_path, monkeypatch
):
    """A critic path naming the actor's folder relatively or through a link is that
    checkpoint: pointed at the scaled folder, not refused as another, too short one."""
    if naming == "relative":
        monkeypatch.chdir(model_dir.parent)
        other_name = model_dir.name
    else:
        other_name = str(tmp_path / "link")
        (tmp_path / "link").symlink_to(model_dir, target_is_directory=True)
    if framework == "verl":
        verl_cfg["critic"] = {"model": {"path": other_name}}
        out = verl.apply(verl_cfg, spec(), output=tmp_path / "scaled")
        critic = out["critic"]["model"]["path"]
    else:
        easyr1_cfg["worker"]["critic"] = {"model": {"model_path": other_name}}
        out = easyr1.apply(easyr1_cfg, spec(), output=tmp_path / "scaled")
        critic = out["worker"]["critic"]["model"]["model_path"]
    assert critic == str(tmp_path / "scaled")


@pytest.mark.parametrize(
    "chunked, budget, expected",
    [(False, 256, 768), (False, None, 768), (False, 4096, 4096), (True, 256, 256)],
)
def test_verl_raises_the_token_budget_only_without_chunked_prefill(
    verl_cfg, tmp_path, chunked, budget, expected
):
    """vLLM refuses max_num_batched_tokens below max_model_len without chunked prefill (verl's
    rollout check, run on verl itself in test_verl_config.py; this needs no verl)."""
    rollout = verl_cfg["actor_rollout_ref"]["rollout"]
    rollout["enable_chunked_prefill"], rollout["max_num_batched_tokens"] = chunked, budget
    out = verl.apply(verl_cfg, spec(), output=tmp_path / "scaled")["actor_rollout_ref"]["rollout"]
    assert (out["max_model_len"], out["max_num_batched_tokens"]) == (768, expected)


@pytest.mark.parametrize("framework", ["verl", "easyr1"])
def test_an_in_place_recipe_completes_an_interrupted_rewrite_first(
    framework, verl_cfg, easyr1_cfg, model_dir
):
    """A `config --in-place` killed between its renames leaves the folder half old, half new
    (and a journal); the recipe's in-place rewrite completes it, under the lock, then scales."""
    from test_config_files import killed_at

    from yarnlib.config import current_spec

    original = (model_dir / "config.json").read_bytes()
    # renamed: the journal, config.json.bak; killed before config.json
    assert killed_at(model_dir, ["--factor", "2", "--in-place"], 3)
    assert (model_dir / ".yarnlib_journal.json").exists()
    apply, cfg = (verl.apply, verl_cfg) if framework == "verl" else (easyr1.apply, easyr1_cfg)
    apply(cfg, spec(), in_place=True)
    assert current_spec(model_dir) == spec()
    assert (model_dir / "config.json.bak").read_bytes() == original
    left = [p.name for p in model_dir.iterdir() if p.name.endswith((".tmp", "journal.json"))]
    assert left == []
