"""The setups `yarnlib plan` models beyond one FSDP sequence per GPU: DeepSpeed ZeRO-3 (± CPU
offload) for fine-tuning, micro-batches above 1, the loss chunk of `yarnlib finetune`; each
against a hand formula or a second code path, and each flag in the fragment the engine reads."""

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from benchmark_scripts import BENCHMARKS, load
from ms_swift import run_with_swift
from test_plan import MOE_ON_4, QWEN3_8B, QWEN3_30B_A3B, QWEN25_7B, _plan
from transformers import AutoConfig, AutoModelForCausalLM

from yarnlib.plan import fragments, planner
from yarnlib.plan.shapes import shape_from_config

GIB = 1024**3
TINY_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
}
ZERO3 = (
    "ZeRO-3 bf16 weights (sharded)",
    "ZeRO-3 fp32 master and AdamW (sharded)",
    "ZeRO-3 grads (bf16, sharded)",
    "ZeRO-3 gathered module (bf16 weights, grads)",
)


@pytest.mark.parametrize(
    "config", [QWEN25_7B, QWEN3_8B, pytest.param(QWEN3_30B_A3B, marks=MOE_ON_4)]
)
def test_largest_module_as_deepspeed_counts_it(config):
    # DeepSpeed's estimator: the most parameters any one module holds itself (recurse=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert shape_from_config(config).largest_module_params == largest


@pytest.mark.parametrize(
    "offload, weights, master, grads",
    [("none", 2, 12, 2), ("optimizer", 2, 0, 0), ("all", 0, 0, 0)],
)
def test_zero3_states_by_hand(offload, weights, master, grads):
    # per parameter over the ranks: bf16 weights 2, fp32 master and AdamW moments 12, bf16 grad
    # partitions 2 (the optimizer offloaded: the weights only; the parameters too: nothing);
    # plus 4 bytes per parameter of the largest module (Qwen2.5-7B: the 152064 × 3584
    # embedding); with the optimizer on the GPU, its step copies the grads of one sub-group of
    # at most 10⁹ parameters (DeepSpeed's sub_group_size) to fp32, after the activations are
    # freed, beside which yarnlib finetune's for-each AdamW makes one more fp32 tensor
    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(shape, "finetune", 16384, 4, 1, 80 * GIB, backend="deepspeed")
    plan = planner.evaluate(setup, sp=1, cp=1, tp=1, offload=offload)
    params = 7615616512
    assert [plan.lines[k] for k in ZERO3] == [
        weights * params // 4,
        master * params // 4,
        grads * params // 4,
        4 * 152064 * 3584,
    ]
    states = (weights + master + grads) * params // 4
    if offload == "none":
        assert plan.phases["optimizer step"] == states + 8 * 10**9 + setup.reserve
    else:
        assert "optimizer step" not in plan.phases
    assert not any(k.startswith(("actor", "AdamW", "FSDP")) for k in plan.lines)
    acts = plan.lines["activations kept (all layers)"] + plan.lines["layer recompute + backward"]
    fsdp = planner.evaluate(planner.replace(setup, backend="fsdp"), 1, 1, 1, offload)
    assert acts == (
        fsdp.lines["activations kept (all layers)"] + fsdp.lines["layer recompute + backward"]
    )


def test_zero3_states_are_what_a_deepspeed_engine_keeps(tmp_path):
    # a real ZeRO-3 engine (DeepSpeed on the CPU, one rank, bf16) given torch's AdamW, for-each
    # and fused, after a step: its bf16 partitions, its grad partitions (in DeepSpeed's
    # grad_accum_dtype, bf16 under ZeRO: not the fp32 its estimator counts), its fp32 master and
    # AdamW moments; and the peak of its next step (the flattened bf16 grads and their fp32
    # copy, then for-each AdamW's square root beside the fp32 grads); make venv installs
    # DeepSpeed (the transformers 4.57 lane does not)
    pytest.importorskip("deepspeed")
    fields = {**TINY_LLAMA, "model_type": "llama"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(__file__).parent / "deepspeed_states.py"
    run = subprocess.run(
        [sys.executable, str(script), str(port), json.dumps(fields)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        # DeepSpeed builds its CPU ops on first use with ninja: the venv's, wherever PATH points
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(Path(__file__).parent),
        },
    )
    assert run.returncode == 0, run.stderr[-2000:]
    engines = json.loads(run.stdout.strip().splitlines()[-1])
    shape = shape_from_config(fields)
    for engine, optim in (("sft", "adamw_torch"), ("sft", "adamw_torch_fused"), ("finetune", None)):
        measured = engines["fused" if optim == "adamw_torch_fused" else "foreach"]
        assert measured["grad_dtype"] == "torch.bfloat16"
        setup = planner.Setup(shape, engine, 16, 1, 1, 80 * GIB, backend="deepspeed")
        setup = planner.replace(setup, optim=optim) if optim else setup
        lines = planner.evaluate(setup, 1, 1, 1, "none").lines
        assert lines[ZERO3[0]] == measured["weights"]
        assert lines[ZERO3[1]] == measured["master"] + measured["moments"]
        assert lines[ZERO3[2]] == measured["grads"]
        # the step's own bookkeeping (norms, step counts) is a few KiB on this tiny model
        assert (
            lines[planner.ZERO3_STEP] <= measured["step_peak"] <= lines[planner.ZERO3_STEP] + 2**14
        )
    # TRL's GRPO reference model: the same config without an optimizer (prepare_deepspeed)
    grpo = planner.Setup(shape, "trl", 16, 1, 1, 80 * GIB, backend="deepspeed", response=8)
    lines = planner.evaluate(grpo, 1, 1, 1, "none").lines
    assert lines["reference model (bf16, ZeRO-3 sharded)"] == engines["reference"]


@pytest.mark.parametrize("offload", ["none", "optimizer", "all"])
def test_accelerate_reads_the_deepspeed_config(tmp_path, capsys, offload):
    from accelerate.commands.config.config_args import load_config_from_file

    argv = ["--engine", "finetune", "--context", "16384", "--gpus", "4", "--nodes", "2"]
    argv += ["--gpu-memory", "80GiB", "--backend", "deepspeed", "--offload", offload, "--json"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv)
    report = json.loads(out.out)
    assert code == 0 and report["chosen"]["backend"] == "deepspeed"
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(report["fragment"]))
    config = load_config_from_file(str(path))
    assert config.distributed_type == "DEEPSPEED" and config.num_processes == 8
    ds = config.deepspeed_config
    assert ds["zero_stage"] == 3
    assert ds["offload_optimizer_device"] == ("none" if offload == "none" else "cpu")
    assert ds["offload_param_device"] == ("cpu" if offload == "all" else "none")


@pytest.mark.parametrize(
    "engine, argv",
    [
        ("verl", ["--context", "8192"]),
        ("easyr1", ["--context", "8192"]),
        ("finetune", ["--context", "8192", "--cp", "2"]),
        ("finetune", ["--context", "8192", "--shard", "hybrid", "--nodes", "2"]),
    ],
)
def test_deepspeed_where_it_is_not_planned(tmp_path, capsys, engine, argv):
    argv = ["--engine", engine, *argv, "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--backend", "deepspeed")
    assert code == 2 and "error: backend: deepspeed" in out.err and "allowed" in out.err


@pytest.mark.parametrize("offload", ["none", "all"])
def test_trl_grpo_on_deepspeed(tmp_path, capsys, offload):
    """TRL's GRPOTrainer under accelerate's DeepSpeed ZeRO-3: the actor's ZeRO-3 states, the
    reference model as TRL's prepare_deepspeed shards it (bf16, 2 bytes per parameter over
    the ranks; on the CPU with the parameters), and a rollout beside ZeRO-3's grad buffer,
    which it keeps after the step (FSDP frees its grads)."""
    pytest.importorskip("trl")
    from accelerate.commands.config.config_args import load_config_from_file
    from trl import GRPOConfig

    argv = ["--engine", "trl", "--backend", "deepspeed", "--offload", offload, "--optim"]
    argv += ["adamw_torch", "--prompt", "4096", "--response", "28672", "--gpus", "8"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--gpu-memory", "140GiB", "--json")
    report = json.loads(out.out)
    assert code == 0 and report["chosen"]["backend"] == "deepspeed"
    lines, phases = report["bytes_per_gpu"], report["phases"]
    params = shape_from_config(QWEN25_7B).params
    assert lines["reference model (bf16, ZeRO-3 sharded)"] == (2 * params // 8) * (offload != "all")
    assert "reference model (fp32, sharded)" not in lines
    resident = sum(v for k, v in lines.items() if k in planner.RESIDENT)
    vllm = int(report["chosen"]["gpu_memory_utilization"] * 140 * GIB)
    assert phases["rollout"] == resident + vllm + 2 * GIB
    fields = {**report["fragment"], "bf16": False}
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, **fields)
    assert args.optim == "adamw_torch" and args.use_vllm and args.vllm_mode == "colocate"
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(report["accelerate"]))
    config = load_config_from_file(str(path))
    assert config.distributed_type == "DEEPSPEED" and config.deepspeed_config["zero_stage"] == 3
    offloaded = config.deepspeed_config["offload_param_device"]
    assert offloaded == ("cpu" if offload == "all" else "none")


@pytest.mark.parametrize("engine", ["finetune", "trl"])
def test_sp_where_the_engine_has_no_ulysses_names_the_engines_that_do(tmp_path, capsys, engine):
    argv = ["--engine", engine, "--context", "8192", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN3_8B, *argv, "--sp", "2")
    assert code == 2 and f"error: sp: {engine} has no Ulysses" in out.err
    assert "--engine sft on DeepSpeed" in out.err and "--cp" in out.err


@pytest.mark.parametrize("engine", ["verl", "easyr1", "finetune"])
def test_optim_where_transformers_does_not_build_the_optimizer(tmp_path, capsys, engine):
    argv = ["--engine", engine, "--context", "8192", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--optim", "adamw_torch")
    assert code == 2 and "error: optim" in out.err and "sft, swift or trl" in out.err


@pytest.mark.parametrize("engine", ["verl", "finetune"])
def test_a_micro_batch_of_two_is_two_sequences_of_activations(engine):
    shape = shape_from_config(QWEN3_8B)
    setup = planner.Setup(shape, engine, 32768, 8, 1, 140 * GIB, micro_batch=2)
    two = planner.evaluate(setup, sp=2, cp=1, tp=1, offload="none")
    assert two.tokens_per_gpu == 2 * 32768 // 2
    # a second path: one sequence of twice the tokens keeps the same per-token activations
    # (flash attention keeps nothing per pair of tokens)
    one = planner.evaluate(planner.replace(setup, context=65536, micro_batch=1), 2, 1, 1, "none")
    for line in ("activations kept (all layers)", "layer recompute + backward"):
        assert two.lines[line] == one.lines[line]
    if engine == "verl":
        actor = fragments.verl(two)["actor_rollout_ref"]["actor"]
        assert actor["ppo_max_token_len_per_gpu"] == 32768  # 2 sequences of 32768 / sp 2
    else:
        assert "--batch-size 2" in fragments.finetune_command(two)


def test_micro_batch_in_the_trl_and_easyr1_fragments(tmp_path):
    pytest.importorskip("trl")
    from trl import GRPOConfig

    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(
        shape, "trl", 768, 8, 1, 140 * GIB, prompt=256, response=512, micro_batch=2,
        trl_version=(1, 12),  # log-probs of the full logits, before TRL 1.13
    )  # fmt: skip
    plan = planner.evaluate(setup, sp=1, cp=1, tp=1, offload="none")
    assert plan.lines["loss head (logits, log-softmax, grads)"] == 12 * 2 * 512 * 152064
    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, **{**fragments.trl(plan), "bf16": False}
    )
    assert args.per_device_train_batch_size == 2
    easyr1 = planner.evaluate(planner.replace(setup, engine="easyr1"), 1, 1, 1, "none")
    actor = fragments.easyr1(easyr1)["worker"]["actor"]
    assert actor["micro_batch_size_per_device_for_update"] == 2


def test_loss_chunk_is_finetunes_chunk_size(tmp_path, capsys):
    argv = ["--engine", "finetune", "--context", "16384", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--loss-chunk", "4096", "--json")
    report = json.loads(out.out)
    assert report["bytes_per_gpu"]["loss head (logits, log-softmax, grads)"] == (12 * 4096 * 152064)
    assert "--chunk-size 4096" in report["command"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv[2:], "--loss-chunk", "4096")
    assert code == 2 and "error: loss_chunk" in out.err and "allowed" in out.err


def test_published_table_is_the_scripts_output():
    text = (BENCHMARKS.parent / "docs" / "plan.md").read_text()
    shown = text.split("<!-- published -->\n")[1].split("\n<!-- /published -->")[0]
    assert shown == load("plan_published").table()


def test_published_statistics_are_the_scripts_output():
    text = (BENCHMARKS.parent / "docs" / "plan.md").read_text()
    shown = text.split("<!-- published-stats -->\n")[1].split("\n<!-- /published-stats -->")[0]
    assert shown == load("plan_published").statistics()


def test_activation_offload_keeps_two_layers_on_the_gpu():
    # verl's enable_activation_offloading: one layer group offloading while the next computes
    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(shape, "verl", 131072, 8, 1, 140 * GIB, activation_offload=True)
    plan = planner.evaluate(setup, sp=4, cp=1, tp=1, offload="none")
    tokens, h = 32768, 3584
    extras = 2 * 128 * 2 + 8  # bf16 cos and sin, ids (per token)
    assert plan.lines["activations kept (all layers)"] == (2 * h * 2 + extras) * tokens
    kept = planner.evaluate(planner.replace(setup, activation_offload=False), 4, 1, 1, "none")
    assert (
        kept.lines["activations kept (all layers)"] - plan.lines["activations kept (all layers)"]
        == (28 - 2) * h * 2 * tokens
    )
    model = fragments.verl(plan)["actor_rollout_ref"]["model"]
    assert model["enable_activation_offload"] is True


def test_sft_activation_offload_is_transformers_checkpoint_offload(tmp_path, capsys):
    """transformers' checkpoint offload (``gradient_checkpointing_kwargs={"offload": True}``,
    which its Trainer passes to ``gradient_checkpointing_enable(offload=True)``: each layer's
    input in pinned host memory) keeps two layers' inputs on the GPU, as verl's; the field is
    read by TRL's own SFTConfig."""
    pytest.importorskip("trl")
    from trl import SFTConfig

    argv = ["--engine", "sft", "--context", "65536", "--gpus", "4", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN3_8B, *argv, "--activation-offload", "--json")
    report = json.loads(out.out)
    args = SFTConfig(
        output_dir=str(tmp_path), use_cpu=True, **{**report["fragment"], "bf16": False}
    )
    assert args.gradient_checkpointing_kwargs == {"offload": True}
    tokens, h = report["chosen"]["tokens_per_gpu"], 4096
    chosen = ["--sp", str(report["chosen"]["sp"]), "--offload", report["chosen"]["offload"]]
    code, out = _plan(tmp_path, capsys, QWEN3_8B, *argv, *chosen, "--json")
    kept = json.loads(out.out)["bytes_per_gpu"]["activations kept (all layers)"]
    offloaded = report["bytes_per_gpu"]["activations kept (all layers)"]
    assert kept - offloaded == (36 - 2) * h * 2 * tokens  # 34 of 36 bf16 layer inputs on CPU
    assert "gradient_checkpointing_kwargs" not in json.loads(out.out)["fragment"]


def test_sft_on_fsdp_splits_by_context_parallel(tmp_path, capsys):
    """TRL on FSDP2 with accelerate's context parallel (TRL's long-context guide): the states as
    yarnlib finetune's FSDP2, the same activations at the local tokens; the accelerate config
    and the SFTConfig fields read by their own loaders."""
    pytest.importorskip("trl")
    from accelerate.commands.config.config_args import load_config_from_file
    from trl import SFTConfig

    argv = ["--engine", "sft", "--backend", "fsdp", "--cp", "8", "--context", "1048576"]
    argv += ["--gpus", "8", "--gpu-memory", "79GiB", "--offload", "none", "--activation-offload"]
    code, out = _plan(tmp_path, capsys, QWEN3_8B, *argv, "--json")
    report = json.loads(out.out)
    assert report["chosen"]["cp"] == 8 and report["chosen"]["tokens_per_gpu"] == 131072
    args = SFTConfig(
        output_dir=str(tmp_path), use_cpu=True, **{**report["fragment"], "bf16": False}
    )
    assert args.pad_to_multiple_of == 16  # TRL pads to 2·cp_size
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(report["accelerate"]))
    config = load_config_from_file(str(path))
    assert config.distributed_type == "FSDP" and config.fsdp_config["fsdp_version"] == 2
    assert config.parallelism_config["parallelism_config_cp_size"] == 8
    shape = shape_from_config(QWEN3_8B)
    setup = planner.Setup(
        shape, "sft", 1048576, 8, 1, 79 * GIB, attn="sdpa", activation_offload=True
    )
    sft = planner.evaluate(setup, sp=1, cp=8, tp=1, offload="none")
    finetune = planner.evaluate(planner.replace(setup, engine="finetune"), 1, 8, 1, "none")
    for line in ("actor weights (fp32, sharded)", "AdamW states (sharded)",
                 "FSDP working copies (bf16)", "layer recompute + backward"):  # fmt: skip
        assert sft.lines[line] == finetune.lines[line], line


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--backend", "fsdp", "--sp", "2"], "sp"),  # TRL's Ulysses is DeepSpeed's
        (["--cp", "2"], "cp"),  # context parallel runs on FSDP2
    ],
)
def test_sft_parallelism_each_backend_runs(tmp_path, capsys, argv, field):
    base = ["--engine", "sft", "--context", "65536", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN3_8B, *base, *argv)
    assert code == 2 and f"error: {field}" in out.err and "allowed" in out.err


@pytest.mark.parametrize("engine", ["finetune", "trl", "easyr1"])
def test_activation_offload_only_where_the_engine_has_it(tmp_path, capsys, engine):
    argv = ["--engine", engine, "--context", "8192", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--activation-offload")
    assert code == 2 and "error: activation_offload" in out.err and "allowed" in out.err


def test_trl_rollout_is_planned_with_trls_own_batched_tokens(tmp_path, capsys):
    # TRL builds its colocated LLM(max_num_batched_tokens=4096) whatever its config says
    argv = ["--engine", "trl", "--context", "16384", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--tp", "2", "--json")
    report = json.loads(out.out)
    u = report["chosen"]["gpu_memory_utilization"]
    h, i, d, params = 3584, 18944, 128, 7615616512
    forward = 4096 * 2 * (4 * h + (2 * 28 * d + 2 * 2 * d) // 2 + 3 * i // 2)
    budget = int(u * 80 * GIB) - params - (forward + 2 * 4 * 256 * 152064) - GIB
    assert report["rollout"]["kv_blocks"] == budget // (16 * 2 * 28 * 2 * d * 2)
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--max-num-batched-tokens", "8192")
    assert code == 2 and "error: max_num_batched_tokens" in out.err


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_lora_params_equal_what_peft_trains(arch):
    from peft import LoraConfig, get_peft_model
    from tiny_models import tiny_config

    from yarnlib.finetune.cli import DEFAULT_LORA_TARGETS

    config = tiny_config(arch, num_attention_heads=4, num_key_value_heads=2, head_dim=24)
    model = AutoModelForCausalLM.from_config(config)
    targets = DEFAULT_LORA_TARGETS.split(",")
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=targets))
    trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert shape_from_config(config.to_dict()).lora_params(8) == trained


def test_lora_under_zero3_by_hand(tmp_path, capsys):
    # frozen base: its bf16 weights only, gathered without grads; the adapter's 16 bytes/param
    shape = shape_from_config(QWEN25_7B)
    setup = planner.Setup(shape, "finetune", 65536, 4, 1, 80 * GIB, backend="deepspeed")
    plan = planner.evaluate(planner.replace(setup, lora_rank=16), 1, 1, 1, "none")
    params, h, q, kv = 7615616512, 3584, 3584, 512
    adapter = 28 * 16 * ((h + q) + 2 * (h + kv) + (q + h))
    assert [plan.lines[k] for k in ZERO3] == [
        2 * (params + adapter) // 4,
        12 * adapter // 4,
        2 * adapter // 4,
        2 * 152064 * 3584,
    ]
    argv = ["--engine", "finetune", "--context", "65536", "--gpus", "4", "--gpu-memory", "80GB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--backend", "deepspeed", "--lora", "16")
    assert code == 0 and "--lora --lora-rank 16" in out.out
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *argv, "--lora", "16")  # FSDP: refused
    assert code == 2 and "error: lora" in out.err and "allowed" in out.err


def test_sft_with_ulysses_is_zero3_at_the_local_tokens():
    # a second path: Ulysses sp 4 over 65536 tokens keeps what one GPU keeps for 16384
    shape = shape_from_config(QWEN3_8B)
    setup = planner.Setup(
        shape, "sft", 65536, 4, 1, 80 * GIB, backend="deepspeed", trl_version=(1, 12)
    )  # TRL before 1.13: transformers' loss over the full logits
    ulysses = planner.evaluate(setup, sp=4, cp=1, tp=1, offload="optimizer")
    alone_setup = planner.replace(setup, engine="finetune", context=16384, logits="full")
    alone = planner.evaluate(alone_setup, 1, 1, 1, "optimizer")
    assert ulysses.tokens_per_gpu == 16384
    assert ulysses.lines == alone.lines
    assert ulysses.lines["loss head (logits, log-softmax, grads)"] == 12 * 16384 * 151936


def test_sft_fragment_read_by_trl_and_accelerate(tmp_path, capsys):
    pytest.importorskip("trl")
    from accelerate.commands.config.config_args import load_config_from_file
    from trl import SFTConfig

    argv = ["--engine", "sft", "--sp", "4", "--context", "65536", "--gpus", "8"]
    code, out = _plan(tmp_path, capsys, QWEN3_8B, *argv, "--gpu-memory", "80GiB", "--json")
    report = json.loads(out.out)
    assert code == 0 and report["chosen"]["sp"] == 4
    fields = {**report["fragment"], "bf16": False}
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, **fields)
    assert args.max_length == 65536 and args.pad_to_multiple_of == 4
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(report["accelerate"]))
    config = load_config_from_file(str(path))
    assert config.distributed_type == "DEEPSPEED" and config.deepspeed_config["zero_stage"] == 3
    parallelism = config.parallelism_config
    assert parallelism["parallelism_config_sp_size"] == 4
    assert parallelism["parallelism_config_sp_backend"] == "deepspeed"
    assert parallelism["parallelism_config_dp_shard_size"] * 4 == 8


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--sp", "8"], "sp"),  # Qwen2.5-7B's 28 heads do not split 8 ways
        (["--backend", "fsdp", "--sp", "4"], "sp"),  # on FSDP2 it splits by --cp
        (["--cp", "2"], "cp"),
    ],
)
def test_sft_settings_it_does_not_run(tmp_path, capsys, argv, field):
    base = ["--engine", "sft", "--context", "65536", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *base, *argv)
    assert code == 2 and f"error: {field}" in out.err and "allowed" in out.err


# ms-swift's own parser, in a child process (tests/ms_swift.py): its `swift sft` arguments as the
# plan prints them, with --use_cpu (transformers refuses bf16 on a machine without a GPU) and the
# model type and template a folder with only config.json needs
SWIFT_PARSE = """
import json, sys
from swift.arguments import SftArguments
from swift.utils import parse_args
args, rest = parse_args(SftArguments, sys.argv[1:])
zero = args.deepspeed["zero_optimization"]
print(json.dumps({
    "rest": rest, "sp": args.sequence_parallel_size, "stage": zero["stage"],
    "offload": [zero.get(k, {}).get("device") for k in ("offload_optimizer", "offload_param")],
    "tuner_type": args.tuner_type, "lora_rank": args.lora_rank,
    "target_modules": args.target_modules, "max_length": args.max_length,
    "checkpointing": args.gradient_checkpointing, "attn_impl": args.attn_impl,
    "batch": args.per_device_train_batch_size, "liger": args.use_liger_kernel,
}))
"""


@pytest.mark.parametrize(
    "argv, offload",
    [
        (["--sp", "4", "--offload", "none"], ["none", "none"]),
        (["--sp", "2", "--offload", "all", "--lora", "8", "--logits", "chunked"], ["cpu", "cpu"]),
    ],
)
def test_swift_command_read_by_ms_swift(tmp_path, capsys, argv, offload):
    base = ["--engine", "swift", "--context", "65536", "--gpus", "4", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *base, *argv, "--loss-chunk", "2048", "--json")
    report = json.loads(out.out)
    assert code == 0, report["problems"]
    command = report["command"].split()
    env = dict(word.split("=", 1) for word in command[: command.index("swift")])
    alloc = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert env == {**alloc, "NPROC_PER_NODE": "4", "CELOSS_PARALLEL_SIZE": "2048"}
    flags = command[command.index("sft") + 1 :]
    flags[flags.index("MODEL")] = str(tmp_path / "model")
    flags[flags.index("OUT")] = str(tmp_path / "out")
    liger = report["fragment"]["arguments"]["use_liger_kernel"]
    if liger and not _importable("liger_kernel"):  # ms-swift asserts liger-kernel is there
        flags[flags.index("--use_liger_kernel") + 1] = "false"
    extra = ["--model_type", "qwen2", "--template", "qwen2_5", "--use_cpu", "true"]
    done = run_with_swift(["-c", SWIFT_PARSE, *flags, *extra], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    lora = "--lora" in argv
    assert parsed["rest"] == [] and parsed["stage"] == 3 and parsed["offload"] == offload
    assert parsed["sp"] == report["chosen"]["sp"] == int(argv[1])
    assert parsed["tuner_type"] == ("lora" if lora else "full")
    if lora:
        assert parsed["lora_rank"] == 8 and parsed["target_modules"] == ["all-linear"]
    assert parsed["max_length"] == 65536 and parsed["checkpointing"] is True
    assert parsed["attn_impl"] == "flash_attn" and parsed["batch"] == 1


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--offload", "optimizer"], "offload"),  # no ms-swift preset offloads it alone
        (["--backend", "fsdp"], "backend"),
        (["--activation-offload"], "activation_offload"),
        (["--cp", "2"], "cp"),
    ],
)
def test_swift_settings_it_does_not_run(tmp_path, capsys, argv, field):
    base = ["--engine", "swift", "--context", "65536", "--gpus", "4", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *base, *argv)
    assert code == 2 and f"error: {field}" in out.err and "allowed" in out.err


def test_swift_loss_chunk_needs_ulysses_to_matter(tmp_path, capsys):
    # CELOSS_PARALLEL_SIZE chunks the sequence-parallel loss only; without sp it is not set
    base = ["--engine", "swift", "--context", "16384", "--gpus", "4", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN25_7B, *base, "--sp", "1", "--loss-chunk", "2048",
                      "--json")  # fmt: skip
    report = json.loads(out.out)
    assert code == 0 and "CELOSS_PARALLEL_SIZE" not in report["command"]
    assert report["bytes_per_gpu"]["loss head (logits, log-softmax, grads)"] == 12 * 16384 * 152064


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_swift_lora_params_equal_what_peft_trains_on_all_linear(arch):
    from peft import LoraConfig, get_peft_model
    from tiny_models import tiny_config

    config = tiny_config(arch, num_attention_heads=4, num_key_value_heads=2, head_dim=24)
    model = AutoModelForCausalLM.from_config(config)
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    shape = shape_from_config(config.to_dict())
    assert shape.lora_params(8, mlp=True) == trained
    setup = planner.Setup(shape, "swift", 4096, 4, 1, 80 * GIB, backend="deepspeed", lora_rank=8)
    assert setup.trained_params == trained


@pytest.mark.parametrize("engine", ["sft", "finetune"])
def test_training_launches_set_expandable_segments(tmp_path, capsys, engine):
    # the reserve holds fragmentation only with them (TRL's guide: its 4B run at 1M tokens,
    # 63.6 GiB allocated, fails on 80 GB GPUs without)
    argv = ["--engine", engine, "--context", "32768", "--gpus", "8", "--gpu-memory", "80GiB"]
    code, out = _plan(tmp_path, capsys, QWEN3_8B, *argv, "--json")
    command = shlex.split(json.loads(out.out)["command"])
    assert code == 0 and command[0] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert command[1:4] == ["accelerate", "launch", "--config_file"]
