"""A plan as the settings of the engine that runs it: verl and EasyR1 YAML, TRL's GRPOConfig
fields, an accelerate config for ``yarnlib finetune``, ms-swift's ``swift sft`` arguments.
Merge a fragment into the recipe (``examples/``); the RoPE itself comes from the rewritten
config.json (``yarnlib config``)."""

from __future__ import annotations

import math
from typing import Any

from yarnlib.plan import planner, rope
from yarnlib.plan.planner import Plan


def merge(recipe: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    """``recipe`` with ``fragment``'s values set, nested mappings merged key by key."""
    merged = dict(recipe)
    for key, value in fragment.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            value = merge(merged[key], value)
        merged[key] = value
    return merged


def _budget(plan: Plan) -> int:
    """Tokens per GPU per micro-batch: one whole sequence after the sequence split, in 1024s."""
    return math.ceil(plan.tokens_per_gpu / 1024) * 1024


def _lengths(plan: Plan) -> dict[str, int]:
    s = plan.setup
    if s.prompt or s.response:
        return {"max_prompt_length": s.prompt, "max_response_length": s.response}
    return {}


def verl(plan: Plan) -> dict[str, Any]:
    s = plan.setup
    offload_params, offload_optimizer = plan.offload == "all", plan.offload != "none"
    fsdp = {"param_offload": offload_params, "optimizer_offload": offload_optimizer}
    if s.shard == "hybrid":
        fsdp["fsdp_size"] = s.gpus
    budget = _budget(plan)
    fragment = {
        "actor_rollout_ref": {
            "model": {
                "use_remove_padding": True,
                "enable_gradient_checkpointing": s.checkpointing,
                "use_fused_kernels": s.logits_mode == "chunked",
                "enable_activation_offload": s.activation_offload,
            },
            "actor": {
                "ulysses_sequence_parallel_size": plan.sp,
                "use_dynamic_bsz": True,
                "ppo_max_token_len_per_gpu": budget,
                "fsdp_config": fsdp,
            },
            "ref": {
                "log_prob_max_token_len_per_gpu": budget,
                "fsdp_config": {"param_offload": offload_params},
            },
            "rollout": {
                "n": s.rollout_n,
                "tensor_model_parallel_size": plan.tp,
                "gpu_memory_utilization": plan.utilization,
                "enable_chunked_prefill": True,
                "max_num_batched_tokens": s.batched_tokens,
                "max_model_len": s.context,
                "log_prob_max_token_len_per_gpu": budget,
            },
        },
        "trainer": {"n_gpus_per_node": s.gpus, "nnodes": s.nodes},
    }
    if _lengths(plan):
        fragment["data"] = _lengths(plan)
    return fragment


def easyr1(plan: Plan) -> dict[str, Any]:
    s = plan.setup
    fragment = {
        "worker": {
            "actor": {
                "micro_batch_size_per_device_for_update": s.micro_batch,
                "micro_batch_size_per_device_for_experience": s.micro_batch,
                "padding_free": True,
                "dynamic_batching": True,
                "ulysses_size": plan.sp,
                "model": {"enable_gradient_checkpointing": s.checkpointing},
                "fsdp": {"enable_full_shard": True},
                "offload": {
                    "offload_params": plan.offload == "all",
                    "offload_optimizer": plan.offload != "none",
                },
            },
            "rollout": {
                "n": s.rollout_n,
                "tensor_parallel_size": plan.tp,
                "gpu_memory_utilization": plan.utilization,
                "max_model_len": s.context,
                "max_num_batched_tokens": s.vllm_batched_tokens,
            },
        },
        "trainer": {"n_gpus_per_node": s.gpus, "nnodes": s.nodes},
    }
    if _lengths(plan):
        fragment["data"] = _lengths(plan)
    return fragment


def _trainer_fields(plan: Plan) -> dict[str, Any]:
    """The transformers ``TrainingArguments`` that TRL's GRPOConfig and SFTConfig share."""
    s = plan.setup
    return {
        "bf16": True,
        "gradient_checkpointing": s.checkpointing,
        "per_device_train_batch_size": s.micro_batch,  # sequences per micro-batch
        "use_liger_kernel": s.logits_mode == "chunked",
        "optim": s.optim,  # what the plan's optimizer step counts, whatever torch's default
    }


def trl(plan: Plan) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments (the actor's FSDP or ZeRO-3 comes from
    ``accelerate(plan)``)."""
    s = plan.setup
    fields = {
        **_trainer_fields(plan),
        # a generation batch then holds whole prompt groups
        "gradient_accumulation_steps": s.rollout_n,
        "num_generations": s.rollout_n,
        "beta": 0.04 if s.reference else 0.0,
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_tensor_parallel_size": plan.tp,
        "vllm_gpu_memory_utilization": plan.utilization,
        "vllm_enable_sleep_mode": True,
        "vllm_max_model_length": s.context,
    }
    if s.response:
        fields["max_completion_length"] = s.response
    return fields


def accelerate(plan: Plan) -> dict[str, Any]:
    """An ``accelerate launch --config_file`` config: FSDP2 over every GPU, context parallel
    inside it when ``plan.cp > 1`` (as in examples/finetune/*.yaml)."""
    s = plan.setup
    if s.backend == "deepspeed":
        return deepspeed(plan)
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": "bf16",
        "num_machines": s.nodes,
        "num_processes": s.world,
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": s.shape.layer_class,
            "fsdp_reshard_after_forward": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": plan.offload != "none",
            # yarnlib finetune checkpoints itself (--gradient-checkpointing)
            "fsdp_activation_checkpointing": False,
        },
    }
    replicas = s.nodes if s.shard == "hybrid" else 1
    if plan.cp > 1 or replicas > 1:
        config["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": replicas,
            "parallelism_config_dp_shard_size": s.world // (replicas * plan.cp),
            "parallelism_config_tp_size": 1,
            "parallelism_config_cp_size": plan.cp,
            "parallelism_config_cp_backend": "torch",
            "parallelism_config_cp_comm_strategy": "allgather",
        }
    return config


def deepspeed(plan: Plan) -> dict[str, Any]:
    """An accelerate config for DeepSpeed ZeRO-3 (as examples/finetune/deepspeed_zero3*.yaml),
    offloading the optimizer (and the parameters) to CPU memory as planned; with Ulysses
    (``plan.sp > 1``) accelerate's parallelism config for DeepSpeed's sequence parallel."""
    s = plan.setup
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "mixed_precision": "bf16",
        "num_machines": s.nodes,
        "num_processes": s.world,
        "deepspeed_config": {
            "zero_stage": 3,
            "zero3_init_flag": True,
            "zero3_save_16bit_model": True,
            "offload_optimizer_device": "none" if plan.offload == "none" else "cpu",
            "offload_param_device": "cpu" if plan.offload == "all" else "none",
            "gradient_clipping": 1.0,
        },
    }
    if plan.sp > 1:
        config["parallelism_config"] = {
            "parallelism_config_dp_shard_size": s.world // plan.sp,
            "parallelism_config_sp_size": plan.sp,
            "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_seq_length_is_variable": True,
            "parallelism_config_sp_attn_implementation": ULYSSES_ATTENTION[s.attn],
        }
    return config


def sft(plan: Plan) -> dict[str, Any]:
    """``SFTConfig`` keyword arguments for TRL's SFTTrainer (launched with the
    ``accelerate(plan)`` config; a LoRA plan adds ``peft_config``, peft's ``LoraConfig``)."""
    s = plan.setup
    fields = {
        **_trainer_fields(plan),
        "max_length": s.context,
        # Ulysses splits every sequence into sp equal parts, context parallel into 2·cp chunks
        "pad_to_multiple_of": 2 * plan.cp if plan.cp > 1 else plan.sp,
    }
    if s.activation_offload:  # transformers' checkpoint offload: the layers' inputs to host
        fields["gradient_checkpointing_kwargs"] = {"offload": True}
    if s.lora_rank:
        targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
        fields["peft_config"] = {"r": s.lora_rank, "target_modules": targets}
    return fields


# The plan's 2 GiB reserve holds the allocator's fragmentation only with expandable segments:
# TRL's long-context guide reports its Qwen3-4B run at 1M tokens, 63.6 GiB allocated, failing
# on 80 GB GPUs without them
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def sft_command(plan: Plan) -> str:
    """The launch of a script that builds ``SFTConfig(**fragment)``: the accelerate config
    above, saved as plan_accelerate.yaml."""
    return f"{ALLOC_CONF} accelerate launch --config_file plan_accelerate.yaml TRAIN_SCRIPT.py"


def finetune_command(plan: Plan) -> str:
    s = plan.setup
    chunk = s.chunk if s.logits_mode == "chunked" else 0
    flags = [f"--seq-len {s.context}", f"--chunk-size {chunk}", "--mixed-precision bf16"]
    if s.micro_batch > 1:
        flags.append(f"--batch-size {s.micro_batch}")
    if s.lora_rank:
        flags.append(f"--lora --lora-rank {s.lora_rank}")
    if not s.checkpointing:
        flags.append("--no-gradient-checkpointing")
    if plan.cp > 1:
        flags.append("--attn-implementation sdpa")
    rope_flags = rope.finetune_flags(s.shape.rope, s.context)
    return (
        f"{ALLOC_CONF} accelerate launch --config_file plan_accelerate.yaml -m yarnlib.finetune "
        "--model MODEL "
        f"{rope_flags} --dataset DATA --steps STEPS --output OUT " + " ".join(flags)
    )


def swift(plan: Plan) -> dict[str, Any]:
    """ms-swift's ``swift sft`` (4.x): its command-line arguments and the environment it reads
    (``NPROC_PER_NODE``, ``NNODES``; ``CELOSS_PARALLEL_SIZE``, the chunk of its
    sequence-parallel loss). No ``--rope_scaling``: MODEL is the folder ``yarnlib config``
    wrote, whose config.json carries the scaling."""
    s = plan.setup
    env = {"PYTORCH_CUDA_ALLOC_CONF": ALLOC_CONF.split("=")[1], "NPROC_PER_NODE": s.gpus}
    if s.nodes > 1:
        env["NNODES"] = s.nodes
    if s.sp_loss_chunk and plan.sp > 1:
        env["CELOSS_PARALLEL_SIZE"] = s.sp_loss_chunk
    arguments = {
        "tuner_type": "lora" if s.lora_rank else "full",
        "torch_dtype": "bfloat16",
        "per_device_train_batch_size": s.micro_batch,
        "max_length": s.context,
        "attn_impl": SWIFT_ATTENTION[s.attn],
        "gradient_checkpointing": s.checkpointing,
        "deepspeed": planner.SWIFT_DEEPSPEED[plan.offload],
        "sequence_parallel_size": plan.sp,
        "use_liger_kernel": s.logits_mode == "chunked",
        "optim": s.optim,
    }
    if s.lora_rank:
        arguments |= {"lora_rank": s.lora_rank, "target_modules": "all-linear"}
    return {"env": env, "arguments": arguments}


def swift_command(plan: Plan) -> str:
    fragment = swift(plan)
    env = [f"{k}={v}" for k, v in fragment["env"].items()]
    if plan.setup.nodes > 1:
        env += ["NODE_RANK=RANK", "MASTER_ADDR=ADDR"]
    flags = [f"--{k} {str(v).lower() if isinstance(v, bool) else v}"
             for k, v in fragment["arguments"].items()]  # fmt: skip
    return " ".join([*env, "swift sft --model MODEL --dataset DATA --output_dir OUT", *flags])


# attn_implementation of DeepSpeed's Ulysses (accelerate's sp_attn_implementation)
ULYSSES_ATTENTION = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "sdpa"}
# ms-swift's --attn_impl
SWIFT_ATTENTION = {"flash": "flash_attn", "sdpa": "sdpa", "eager": "eager"}
RENDERERS = {
    "verl": verl,
    "easyr1": easyr1,
    "trl": trl,
    "finetune": accelerate,
    "sft": sft,
    "swift": swift,
}
