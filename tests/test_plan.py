"""`yarnlib plan`: each formula against a hand calculation or against what torch itself does
(parameter counts of the real architectures on the meta device, the bytes autograd saves in
real transformers layers), the valid parallel degrees, and the command's answers."""

import json
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from tiny_models import tiny_config
from transformers import AutoConfig, AutoModelForCausalLM

import yarnlib
from yarnlib.cli import main
from yarnlib.plan import memory, parallel, planner, rollout
from yarnlib.plan.shapes import shape_from_config

GIB = 1024**3
# config.json of the real checkpoints (the fields the plan reads), as published on the hub
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "max_window_layers": 28,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rms_norm_eps": 1e-05,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
REAL = {
    "Qwen2.5-7B-Instruct": QWEN25_7B,
    "Qwen3-8B": QWEN3_8B,
    "Llama-3.1-8B": LLAMA31_8B,
    "Qwen3-30B-A3B": QWEN3_30B_A3B,
}
# transformers 4.x builds the MoE's 48 x 128 experts as separate modules (30 s on meta here);
# 5.x fuses them, and the count is the same architecture's: checked once, in the main lane.
MOE_ON_4 = pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) < 5, reason="4.x: 6144 expert modules, slow"
)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=MOE_ON_4) if "A3B" in n else n for n in REAL]
)
def test_parameter_count_equals_the_architecture_built_by_transformers(name):
    config = dict(REAL[name])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    assert shape_from_config(config).params == sum(p.numel() for p in model.parameters())


def test_parameter_count_by_hand():
    # Qwen2.5-7B: 28 × (q,o 3584² + k,v 3584·512 each + qkv bias 4608 + mlp 3·3584·18944
    # + norms 2·3584) + embed and head 2·152064·3584 + final norm 3584; its safetensors index
    # says total_size 15231233024 bytes in bf16
    layer = 2 * 3584**2 + 2 * 3584 * 512 + 4608 + 3 * 3584 * 18944 + 2 * 3584
    assert shape_from_config(QWEN25_7B).params == 28 * layer + 2 * 152064 * 3584 + 3584
    assert 2 * shape_from_config(QWEN25_7B).params == 15231233024


def _saved_bytes(model, tokens: int, bf16: bool) -> int:
    """Bytes of the distinct storages autograd keeps from one forward, weights excluded."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model.model(input_ids=ids)
    return sum(seen.values())


@pytest.mark.parametrize(
    "arch, attn, precision, checkpointing",
    [
        ("llama", "sdpa", "fp32", False),
        ("llama", "sdpa", "bf16", False),
        ("llama", "eager", "fp32", False),
        ("llama", "eager", "bf16", False),
        ("llama", "sdpa", "fp32", True),
        ("llama", "sdpa", "bf16", True),
        ("qwen2", "sdpa", "bf16", False),
        ("qwen3", "sdpa", "fp32", False),
        ("qwen3", "sdpa", "bf16", False),
        # FSDP's mixed precision: the layers run on bf16 weights, without autocast
        ("llama", "sdpa", "bf16-fsdp", False),
        ("qwen2", "eager", "bf16-fsdp", False),
        ("qwen3", "sdpa", "bf16-fsdp", False),
        ("qwen3", "sdpa", "bf16-fsdp", True),
    ],
)
def test_activation_bytes_equal_what_autograd_saves(arch, attn, precision, checkpointing):
    torch.manual_seed(0)
    dims = dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, head_dim=32)
    config = tiny_config(arch, num_hidden_layers=3, vocab_size=96, **dims)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    yarnlib.patch(model, factor=4.0, use_kernel=False)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if precision == "bf16-fsdp":
        model.to(torch.bfloat16)
    model.train()
    tokens = 256
    measured = _saved_bytes(model, tokens, precision == "bf16")
    shape = shape_from_config(config.to_dict())
    p = memory.PRECISIONS[precision]
    acts = memory.activations(shape, tokens, p, checkpointing=checkpointing, attn=attn)
    # with checkpointing, cos and sin stay alive as arguments of the recompute, not as saved
    # tensors: the plan counts them either way
    width = 2 if precision == "bf16-fsdp" else 4  # cos and sin in the dtype of the layers' input
    kept = 2 * width * shape.head_dim * tokens if checkpointing else 0
    assert acts.saved + acts.final_norm == measured + kept


def test_activation_formulas_by_hand():
    shape = shape_from_config(QWEN25_7B)
    p = memory.PRECISIONS["bf16-fsdp"]
    h, nd, kd, i = 3584, 28 * 128, 4 * 128, 18944
    # bf16 layers: per norm fp32 input + bf16 normalised + bf16 output; q,k,v,out in bf16 plus
    # the float32 logsumexp of 28 heads; 4 bf16 MLP tensors; two float32 rsqrt
    per_token = 2 * (4 + 2 + 2) * h + 2 * (2 * nd + 2 * kd) + 4 * 28 + 4 * 2 * i + 8
    assert memory.layer_bytes_per_token(shape, "flash", p) == per_token
    tokens = 32768
    acts = memory.activations(shape, tokens, p, checkpointing=True, chunk=1024)
    # bf16 cos and sin of head_dim 128, the input ids; the final norm's float32 input, bf16
    # output and float32 rstd, kept for the head only
    assert acts.saved == 28 * h * 2 * tokens + (2 * 128 * 2 + 8) * tokens
    assert acts.final_norm == ((4 + 2) * h + 4) * tokens
    assert acts.recompute == per_token * tokens
    assert acts.head == 12 * 1024 * 152064  # float32 log-softmax, its grad, the logits' grad
    full = memory.activations(shape, tokens, p, checkpointing=False)
    assert full.head == 12 * tokens * 152064 and full.recompute == 0
    # float32 residual stream: the recomputed layer's float32 input is the checkpoint's input
    fp32 = memory.PRECISIONS["fp32"]
    layer32 = memory.layer_bytes_per_token(shape, "flash", fp32)
    acts32 = memory.activations(shape, tokens, fp32, checkpointing=True)
    assert acts32.recompute == (layer32 - 4 * h) * tokens
    # eager keeps [heads × T] float32 softmax per token (and no bf16 cast of it in fp32)
    # a log-prob forward: gate, up and their product in bf16 beside two float32 residual grads
    # worth of hidden states, or the bf16 logits and float32 log-softmax of the chunk
    assert memory.forward_peak(shape, 1000, p, 1024) == 10 * 1024 * 152064
    assert memory.forward_peak(shape, 10**5, p, 1024) == (3 * i * 2 + 8 * h) * 10**5
    fp32 = memory.PRECISIONS["fp32"]
    eager = memory.attention_bytes(shape, 1000, "eager", fp32)
    assert eager == 4 * 4 * nd + 4 * 28 * 1000


def test_kv_cache_by_hand():
    qwen25, qwen3 = shape_from_config(QWEN25_7B), shape_from_config(QWEN3_8B)
    assert rollout.kv_bytes_per_token(qwen25, 1) == 2 * 28 * 4 * 128 * 2 == 57344
    assert rollout.kv_bytes_per_token(qwen25, 4) == 2 * 28 * 1 * 128 * 2
    assert rollout.kv_bytes_per_token(qwen25, 8) == 2 * 28 * 1 * 128 * 2  # replicated heads
    assert rollout.kv_bytes_per_token(qwen3, 2) == 2 * 36 * 4 * 128 * 2
    kv = rollout.kv_cache(GIB, qwen25, 1, block_size=16)
    assert kv.blocks == GIB // (16 * 57344) == 1170
    assert kv.sequences(16384) == 1170 // 1024 == 1
    assert kv.sequences(16385) == 1170 // 1025 == 1
    assert rollout.weight_bytes(qwen25, 4) == 2 * qwen25.params // 4


def test_fsdp_states_by_hand():
    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(shape, "verl", 8192, gpus=8, nodes=2, gpu_bytes=80 * GIB)
    params = 7615616512
    full = planner._states(setup, "none")
    assert full["actor weights (fp32, sharded)"] == 4 * params // 16
    assert full["AdamW states (sharded)"] == 8 * params // 16
    hybrid = planner._states(planner.replace(setup, shard="hybrid"), "optimizer")
    assert hybrid["actor weights (fp32, sharded)"] == 4 * params // 8
    assert hybrid["AdamW states (sharded)"] == 0
    offloaded = planner._states(setup, "all")
    assert offloaded["actor weights (fp32, sharded)"] == offloaded["actor grads (fp32, sharded)"]
    assert offloaded["actor grads (fp32, sharded)"] == 0


@pytest.mark.parametrize(
    "name, gpus, sp, tp",
    [
        ("Qwen2.5-7B-Instruct", 8, [1, 2, 4], [1, 2, 4]),  # 28 heads: no sp 8 (the case)
        ("Qwen2.5-7B-Instruct", 16, [1, 2, 4], [1, 2, 4]),
        ("Qwen3-8B", 8, [1, 2, 4, 8], [1, 2, 4, 8]),
        ("Llama-3.1-8B", 8, [1, 2, 4, 8], [1, 2, 4, 8]),
        ("Qwen3-30B-A3B", 8, [1, 2, 4, 8], [1, 2, 4, 8]),  # 4 kv heads repeat for sp 8
    ],
)
def test_valid_degrees(name, gpus, sp, tp):
    shape = shape_from_config(REAL[name])
    assert parallel.ulysses_degrees(shape, gpus) == sp
    assert parallel.tensor_parallel_degrees(shape, min(gpus, 8)) == tp


@pytest.mark.parametrize(
    "recipe, config",
    [
        ("verl_grpo_qwen2_5_7b_instruct_128k.yaml", QWEN25_7B),
        ("verl_grpo_qwen3_8b_128k.yaml", QWEN3_8B),
        ("easyr1_grpo_qwen2_5_7b_instruct_128k.yaml", QWEN25_7B),
        ("easyr1_grpo_qwen3_8b_128k.yaml", QWEN3_8B),
    ],
)
def test_example_recipes_use_a_valid_ulysses_degree(recipe, config):
    cfg = yaml.safe_load((Path(__file__).parent.parent / "examples" / recipe).read_text())
    if recipe.startswith("verl"):
        sp = cfg["actor_rollout_ref"]["actor"]["ulysses_sequence_parallel_size"]
        tp = cfg["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"]
    else:
        sp = cfg["worker"]["actor"]["ulysses_size"]
        tp = cfg["worker"]["rollout"]["tensor_parallel_size"]
    shape = shape_from_config(config)
    assert sp in parallel.ulysses_degrees(shape, cfg["trainer"]["n_gpus_per_node"])
    assert tp in parallel.tensor_parallel_degrees(shape, cfg["trainer"]["n_gpus_per_node"])


def _plan(tmp_path, capsys, config, *argv):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    code = main(["plan", str(folder), *argv])
    return code, capsys.readouterr()


def test_plan_qwen25_grpo_8xh200(tmp_path, capsys):
    argv = ["--prompt", "16384", "--response", "114688", "--gpus", "8", "--gpu-memory", "140GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--sp", "4", "--json")
    report = json.loads(out.out)
    assert code == 0 and report["fits"]
    assert report["valid"]["ulysses_sp"] == [1, 2, 4]
    assert report["chosen"]["tokens_per_gpu"] == 131072 // 4
    actor = report["fragment"]["actor_rollout_ref"]["actor"]
    assert actor["ulysses_sequence_parallel_size"] == 4
    assert actor["ppo_max_token_len_per_gpu"] * 4 >= 131072
    rollout_cfg = report["fragment"]["actor_rollout_ref"]["rollout"]
    assert rollout_cfg["max_model_len"] == 131072
    assert report["rollout"]["kv_bytes_per_token"] == 2 * 28 * 128 * 2 * max(
        1, 4 // rollout_cfg["tensor_model_parallel_size"]
    )
    assert report["rollout"]["sequences_at_once"] >= 1
    phases = report["phases"]
    assert max(phases.values()) <= 140 * GIB


def test_plan_that_does_not_fit_names_the_smallest_changes(tmp_path, capsys):
    # TRL has no sequence parallel: a 128k sequence's full-vocabulary logits on one GPU (TRL
    # before 1.13 took its log-probs off them; 1.15 and later through a fused head)
    argv = ["--engine", "trl", "--prompt", "16384", "--response", "114688", "--gpus", "8"]
    argv += ["--trl-version", "1.12"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--gpu-memory", "80GiB", "--json")
    report = json.loads(out.out)
    assert code == 1 and not report["fits"] and report["problems"]
    assert any("shorter response" in s for s in report["suggestions"])
    assert "fragment" not in report


@pytest.mark.parametrize(
    "config, argv, field",
    [
        ({**QWEN25_7B, "model_type": "gpt2"}, ["--context", "4096"], "model_type"),
        (QWEN25_7B, ["--context", "0"], "context"),
        (QWEN25_7B, ["--context", "-5"], "context"),
        (QWEN25_7B, ["--context", "4096", "--gpu-memory", "141"], "gpu_memory"),
        (QWEN25_7B, ["--context", "4096", "--sp", "8"], "sp"),
        (QWEN25_7B, ["--context", "4096", "--tp", "8"], "tp"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(tmp_path, capsys, config, argv, field):
    if "--gpu-memory" not in argv:
        argv = [*argv, "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, config, *argv, "--gpus", "8")
    assert code == 2 and out.out == ""
    message = out.err.strip()
    assert "\n" not in message and f"error: {field}" in message or f": {field}" in message
    assert "allowed" in message or "must" in message
