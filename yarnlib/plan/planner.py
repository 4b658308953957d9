"""Per-GPU memory of a long-context run in each phase, the settings that fit, or the smallest
change that would.

Phases (verl and EasyR1 colocate actor, reference and rollout on the same GPUs; the rollout
sleeps while the actor trains, and the actor's states stay on the GPU while vLLM generates):

    rollout   actor states + reference + vLLM's gpu_memory_utilization share
    log-prob  actor states + reference + FSDP working copies + a forward without grad
    update    actor states + grads + FSDP working copies + activations of one micro-batch
    step      (DeepSpeed ZeRO-3, optimizer on the GPU) states + one sub-group's grads as the
              step copies them, and AdamW's temporaries

``yarnlib finetune`` has the update phase only; TRL's colocated vLLM sleeps through the update
as well (``vllm_enable_sleep_mode`` in the fragment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from yarnlib.finetune.checks import sequence_multiple
from yarnlib.plan import memory, parallel, rollout
from yarnlib.plan.shapes import ModelShape

GIB = 1024**3
ENGINES = ("verl", "easyr1", "trl", "finetune", "sft", "swift")
# update phase only: yarnlib finetune, TRL's SFTTrainer under accelerate with DeepSpeed ZeRO-3
# and Ulysses sequence parallel (accelerate's parallelism_config sp, DeepSpeed ALST), and
# ms-swift's `swift sft` (DeepSpeed ZeRO-3, its own Ulysses)
TRAINING = ("finetune", "sft", "swift")
OFFLOAD = ("none", "optimizer", "all")  # optimizer states; then weights and grads as well
BACKENDS = ("fsdp", "deepspeed")  # the actor's sharding: FSDP2, or DeepSpeed ZeRO-3
GRPO = ("verl", "easyr1", "trl")
TRL_BATCHED_TOKENS = 4096  # trl.generation.vllm_generation builds LLM(max_num_batched_tokens=4096)
CHUNK = 1024  # tokens per loss chunk (yarnlib finetune --chunk-size, verl's fused kernels)
# DeepSpeed's zero_optimization.sub_group_size default: ZeRO-3 steps its fp32 partition in
# sub-groups of this many parameters, each with an fp32 copy of its grads made for the step
SUB_GROUP = 10**9
TRL_TESTED = (1, 16)  # the TRL the sft fragment is checked with (constraints.txt)
TRL_FUSED_HEAD = (1, 15)  # its SFT loss since: a fused LM head
TRL_FULL_LOGITS = (1, 13)  # before it: transformers' loss over the full logits (or Liger's)
SWIFT_LOSS_CHUNK = 2048  # the CELOSS_PARALLEL_SIZE of ms-swift's sequence-parallel examples
# ms-swift's --deepspeed presets by offload: optimizer and parameters go to CPU together
SWIFT_DEEPSPEED = {"none": "zero3", "all": "zero3_offload"}
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch")  # transformers' `optim` the plan knows
ZERO3_STEP = "ZeRO-3 step: one sub-group's fp32 grads and copies"
# what stays on the GPU between phases
RESIDENT = (
    "actor weights (fp32, sharded)",
    "actor grads (fp32, sharded)",
    "AdamW states (sharded)",
    "reference model (fp32, sharded)",
    "ZeRO-3 bf16 weights (sharded)",
    "ZeRO-3 fp32 master and AdamW (sharded)",
    "ZeRO-3 grads (bf16, sharded)",
    "reference model (bf16, ZeRO-3 sharded)",
)
# reserved, not allocated: the freed logits block the loss backward cannot reuse
CACHED_LOGITS = "allocator cache (freed logits; reserved)"
# gathered for the layer at work, freed after it
WORKING = ("FSDP working copies (bf16)", "ZeRO-3 gathered module (bf16 weights, grads)")


@dataclass(frozen=True)
class Setup:
    shape: ModelShape
    engine: str
    context: int  # tokens of one sequence: prompt + response, or the training window
    gpus: int  # per node
    nodes: int
    gpu_bytes: int
    prompt: int = 0
    response: int = 0
    rollout_n: int = 8
    sp: int | None = None  # Ulysses (verl, EasyR1); None: the smallest that fits
    cp: int | None = None  # context parallel (finetune)
    tp: int | None = None  # vLLM tensor parallel
    offload: str | None = None  # None: the least that fits
    shard: str = "full"  # FSDP over all GPUs, or "hybrid": within a node, replicated across
    checkpointing: bool = True
    attn: str = "flash"
    logits: str | None = None  # chunked | full; None: the engine's default
    utilization: float | None = None  # vLLM's share; None: what the actor leaves
    batched_tokens: int = 8192  # vLLM max_num_batched_tokens (chunked prefill)
    reference: bool = True  # a reference model for the KL term (GRPO)
    reserve: int = 2 * GIB  # CUDA context, NCCL buffers, allocator fragmentation
    backend: str = "fsdp"  # fsdp | deepspeed (ZeRO-3; finetune, and sft always)
    micro_batch: int = 1  # sequences per micro-batch per GPU (before the sequence split)
    chunk: int = CHUNK  # loss chunk in tokens when the loss is chunked (yarnlib finetune)
    activation_offload: bool = False  # verl's enable_activation_offload, TRL SFTConfig's
    # activation_offloading
    lora_rank: int = 0  # finetune --lora --lora-rank (0: full fine-tuning)
    sp_loss_chunk: int = 0  # ms-swift's CELOSS_PARALLEL_SIZE (swift, sp > 1); 0: unchunked
    optim: str = "adamw_torch_fused"  # transformers' `optim` (sft, swift), its default
    trl_version: tuple[int, int] = TRL_TESTED  # the TRL an sft plan is for: its loss by version

    @property
    def world(self) -> int:
        return self.gpus * self.nodes

    @property
    def vllm_batched_tokens(self) -> int:
        """vLLM's max_num_batched_tokens as the engine runs it: EasyR1 turns chunked prefill
        off, and vLLM then needs the whole sequence in one step; TRL's colocated vLLM is
        built with 4096 whatever the config says."""
        if self.engine == "easyr1":
            return max(self.batched_tokens, self.context)
        if self.engine == "trl":
            return TRL_BATCHED_TOKENS
        return self.batched_tokens

    @property
    def logits_mode(self) -> str:
        # verl: use_fused_kernels; EasyR1 and TRL (without Liger) take log-probs of full logits
        # SFTTrainer before TRL 1.15: transformers' loss over the full logits unless
        # use_liger_kernel; since, TRL's fused LM head whatever use_liger_kernel says
        if self.trl_fused_head:
            return self.logits or "fused"
        full = ("easyr1", "trl", "sft", "swift")
        return self.logits or ("full" if self.engine in full else "chunked")

    @property
    def trl_fused_head(self) -> bool:
        """TRL 1.15 and later compute the SFT loss and GRPO's log-probs with their own fused
        LM head (``add_fused_lm_head``), whatever ``use_liger_kernel`` says."""
        return self.engine in ("sft", "trl") and self.trl_version >= TRL_FUSED_HEAD

    @property
    def liger(self) -> bool:
        """TRL's and ms-swift's chunked loss is Liger (``use_liger_kernel``), which swaps in
        Liger's RMSNorm and SwiGLU as well as its fused linear cross-entropy."""
        return self.engine in ("trl", "sft", "swift") and self.logits_mode == "chunked"

    @property
    def trained_params(self) -> int:
        """The adapter's parameters under LoRA (ms-swift targets every linear layer, the
        others q, k, v and o), else 0."""
        return self.shape.lora_params(self.lora_rank, mlp=self.engine == "swift")

    def swift_sp_loss(self, sp: int) -> bool:
        """ms-swift with Ulysses takes its own loss over the bf16 logits, Liger's or not."""
        return self.engine == "swift" and sp > 1


@dataclass
class Plan:
    setup: Setup
    sp: int
    cp: int
    tp: int
    offload: str
    utilization: float
    tokens_per_gpu: int  # local tokens of one micro-batch (one sequence split by sp / cp)
    lines: dict[str, int] = field(default_factory=dict)  # component → bytes per GPU
    phases: dict[str, int] = field(default_factory=dict)  # phase → bytes per GPU
    # phase → what max_memory_reserved() and nvidia-smi show, where the allocator's cache adds
    # to a total; not a verdict: the allocator frees cached blocks and retries before it fails
    reserved: dict[str, int] = field(default_factory=dict)
    kv: rollout.KVCache | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems


def _states(s: Setup, offload: str) -> dict[str, int]:
    if s.backend == "deepspeed":
        return _zero3_states(s, offload)
    shards = s.world if s.shard == "full" else s.gpus
    params = s.shape.params
    on_gpu = offload == "none", offload != "all"
    weights = 4 * params // shards if on_gpu[1] else 0
    optimizer = 8 * params // shards if on_gpu[0] else 0
    # FSDP gathers one layer in bf16 and prefetches the next, keeps the layer's bf16 grads
    # until the reduce-scatter, and the root unit (embeddings, head) stays gathered
    layer = s.shape.layer_params
    outside = s.shape.embedding_params + s.shape.head_params
    working = 2 * 2 * layer + 2 * layer + 2 * outside
    reference = 4 * params // shards if s.reference and s.engine in GRPO else 0
    return {
        "actor weights (fp32, sharded)": weights,
        "actor grads (fp32, sharded)": weights,
        "AdamW states (sharded)": optimizer,
        "FSDP working copies (bf16)": working,
        "reference model (fp32, sharded)": reference,
    }


def _zero3_states(s: Setup, offload: str) -> dict[str, int]:
    """DeepSpeed ZeRO-3 with bf16, as its runtime holds them: per parameter over all ranks, the
    bf16 weights (2 bytes), and with the optimizer on the GPU the fp32 master and AdamW's two
    moments (12) and the grad partitions (2: DeepSpeed accumulates grads in its
    ``grad_accum_dtype``, which under ZeRO defaults to the model's bf16; its estimator,
    ``estimate_zero3_model_states_mem_needs``, counts them as fp32, 18 bytes in all); with the
    optimizer offloaded the grads and states live on the CPU, with the parameters offloaded the
    weights too. Plus the largest module gathered with its grads, 4 bytes per parameter (for
    these models the embedding or the output head). With LoRA the base is frozen: its bf16
    weights only, gathered without grads, and the master, moments and grads are the adapter's.
    TRL's GRPO reference model (``prepare_deepspeed``: the trainer's ZeRO-3 config without an
    optimizer) keeps bf16 partitions, on the CPU with the parameters offloaded."""
    params, trained = s.shape.params, s.trained_params
    weights = 2 * (params + trained) // s.world if offload != "all" else 0
    on_gpu = (trained or params) // s.world if offload == "none" else 0
    largest = s.shape.largest_module_params
    reference = 2 * params // s.world if s.reference and s.engine in GRPO else 0
    return {
        "ZeRO-3 bf16 weights (sharded)": weights,
        "ZeRO-3 fp32 master and AdamW (sharded)": 12 * on_gpu,
        "ZeRO-3 grads (bf16, sharded)": 2 * on_gpu,
        "ZeRO-3 gathered module (bf16 weights, grads)": (2 if trained else 4) * largest,
        "reference model (bf16, ZeRO-3 sharded)": reference if offload != "all" else 0,
    }


def _zero3_step(s: Setup, offload: str) -> int:
    """What ZeRO-3's optimizer step adds, one sub-group at a time (on the GPU when the optimizer
    is; freed before the next sub-group's): DeepSpeed flattens the sub-group's bf16 grads into a
    new tensor and copies that to fp32 (2 + 4 bytes per parameter at that moment,
    ``_prepare_fp32_grad_for_sub_group``); then torch's for-each AdamW writes the square root of
    the second moment into a new tensor beside the fp32 grads (4 + 4), where the fused kernel
    updates in place (4). For-each: yarnlib finetune's ``torch.optim.AdamW`` (its default on
    CUDA) and transformers' ``optim="adamw_torch"``; fused: ``adamw_torch_fused``, transformers'
    default since torch 2.8. Measured on a real ZeRO-3 engine in tests/test_plan_setups.py."""
    if s.backend != "deepspeed" or offload != "none":
        return 0
    partition = (s.trained_params or s.shape.params) // s.world
    foreach = s.engine == "finetune" or s.optim == "adamw_torch"
    return (8 if foreach else 6) * min(partition, SUB_GROUP)


def _tokens(s: Setup, sp: int, cp: int) -> int:
    """Local tokens of one micro-batch: its sequences, each split by sp · cp."""
    return s.micro_batch * math.ceil(s.context / (sp * cp))


def evaluate(s: Setup, sp: int, cp: int, tp: int, offload: str) -> Plan:
    """Every memory line and phase total for one choice of degrees and offload."""
    p = memory.PRECISIONS["bf16-fsdp"]
    tokens = _tokens(s, sp, cp)
    chunk = s.chunk if s.logits_mode == "chunked" else 0
    # TRL's loss covers the completions only
    head_rows = s.micro_batch * s.response if s.engine == "trl" and s.response else tokens
    acts = memory.activations(
        s.shape,
        tokens,
        p,
        checkpointing=s.checkpointing,
        attn=s.attn,
        chunk=chunk,
        attended=s.context,
        offloaded=s.activation_offload,
        liger=s.liger,
        ring=cp > 1,
    )
    rows = min(chunk or head_rows, head_rows)
    if s.swift_sp_loss(sp):
        head = memory.bf16_loss_bytes(s.shape, head_rows, s.sp_loss_chunk, p)
    elif s.trl_fused_head:
        head = memory.trl_fused_head_bytes(s.shape, head_rows)
    else:
        head = memory.logits_bytes(s.shape, rows, p)
    acts = replace(acts, head=head)
    lines = _states(s, offload)
    lines["activations kept (all layers)"] = acts.saved
    lines["final norm (kept for the loss head)"] = acts.final_norm
    lines["layer recompute + backward"] = acts.recompute + acts.backward
    lines["loss head (logits, log-softmax, grads)"] = acts.head
    resident = sum(v for k, v in lines.items() if k in RESIDENT)
    plan = Plan(s, sp, cp, tp, offload, 0.0, tokens, lines)
    working = sum(v for k, v in lines.items() if k in WORKING)
    update = resident + working + memory.activation_peak(acts)
    plan.phases["update"] = update + s.reserve
    step = _zero3_step(s, offload)
    if step:  # the activations are freed by then; the states and grads are not
        lines[ZERO3_STEP] = step
        plan.phases["optimizer step"] = resident + step + s.reserve
    # transformers' loss only: ms-swift's bf16 grads reuse the freed logits block
    if s.engine in TRAINING and s.logits_mode == "full" and not s.swift_sp_loss(sp):
        cached = memory.cached_logits_bytes(s.shape, rows, p)
        lines[CACHED_LOGITS] = cached
        # beside the loss head's peak only: the layers' backward reuses the cached block
        peak = memory.activation_peak(replace(acts, head=acts.head + cached))
        plan.reserved["update"] = resident + working + peak + s.reserve
    if s.engine in TRAINING:
        _check(plan)
        return plan
    logprob = memory.forward_peak(s.shape, tokens, p, rows, fused=s.trl_fused_head)
    lines["log-prob forward (no grad)"] = logprob
    plan.phases["log-prob"] = resident + working + logprob + s.reserve
    plan.utilization = s.utilization or _utilization(s, resident)
    budget = rollout.gpu_kv_budget(
        s.shape, s.gpu_bytes, plan.utilization, tp, s.vllm_batched_tokens
    )
    plan.kv = rollout.kv_cache(budget, s.shape, tp)
    lines["vLLM weights (bf16, per TP rank)"] = rollout.weight_bytes(s.shape, tp)
    lines["vLLM KV cache"] = plan.kv.budget
    vllm = int(plan.utilization * s.gpu_bytes)
    # FSDP frees the actor's grads after its step (the rollout sees weights and optimizer only);
    # ZeRO-3 keeps its flat grad buffer
    grads = lines.get("actor grads (fp32, sharded)", 0)
    plan.phases["rollout"] = resident - grads + vllm + s.reserve
    _check(plan)
    return plan


def _utilization(s: Setup, resident: int) -> float:
    """vLLM's share: what the actor leaves, in steps of 0.05, at most 0.9."""
    free = (s.gpu_bytes - resident - s.reserve) / s.gpu_bytes
    return max(0.05, min(0.9, math.floor(free * 20) / 20))


def _check(plan: Plan) -> None:
    s = plan.setup
    for phase, total in plan.phases.items():
        if total > s.gpu_bytes:
            plan.problems.append(
                f"{phase}: {total / GIB:.1f} GiB per GPU > {s.gpu_bytes / GIB:.1f} GiB"
            )
    if plan.kv is not None and plan.kv.sequences(s.context) < 1:
        plan.problems.append(
            f"rollout: the KV cache ({plan.kv.budget / GIB:.1f} GiB per rank at "
            f"gpu_memory_utilization {plan.utilization:.2f}) holds {plan.kv.tokens} tokens, "
            f"less than one {s.context}-token sequence"
        )


def _candidates(s: Setup) -> tuple[list[int], list[int], list[int], list[str]]:
    # TRL's Ulysses is DeepSpeed's (accelerate's sp backend); on FSDP2 it splits by --cp
    ulysses = s.engine in ("verl", "easyr1", "swift") or (s.engine == "sft" and s.backend != "fsdp")
    if s.sp is not None:
        parallel.check_ulysses(s.shape, s.sp, s.world)
        if s.sp > 1 and not ulysses:
            raise ValueError(
                f"sp: {s.engine} has no Ulysses sequence parallel; allowed: 1 (Ulysses for "
                "fine-tuning: --engine sft on DeepSpeed, accelerate's parallelism config, or "
                "--engine swift; a sequence split on FSDP2: --cp)"
            )
    if s.cp is not None:
        parallel.check_context_parallel(s.cp, s.world, s.context)
        if s.cp > 1 and not (s.engine == "finetune" or (s.engine == "sft" and s.backend == "fsdp")):
            raise ValueError(
                f"cp: context parallel runs on FSDP2 (accelerate's parallelism_config), planned "
                f"for finetune and for sft with --backend fsdp, not {s.engine} on {s.backend}; "
                "allowed: --cp with --engine finetune or --engine sft --backend fsdp (or Ulysses "
                "--sp)"
            )
    if s.tp is not None:
        parallel.check_tensor_parallel(s.shape, s.tp, s.gpus)
    _check_engine_settings(s)
    sps = [s.sp] if s.sp else parallel.ulysses_degrees(s.shape, s.world) if ulysses else [1]
    cps = [s.cp] if s.cp else (parallel.context_parallel_degrees(s.world, s.context))
    if s.engine not in ("finetune", "sft") or s.backend == "deepspeed":
        cps = [1]
    tps = [s.tp] if s.tp else parallel.tensor_parallel_degrees(s.shape, s.gpus)
    if s.engine in TRAINING:
        tps = [1]
    offloads = [s.offload] if s.offload else list(OFFLOAD)
    if s.engine == "swift":  # its DeepSpeed presets: zero3 and zero3_offload
        offloads = [o for o in offloads if o in SWIFT_DEEPSPEED]
    return sps, cps, tps, offloads


def _check_engine_settings(s: Setup) -> None:
    """Refuse settings the chosen engine has no setting for (one line naming the field)."""
    if s.lora_rank and (s.engine not in TRAINING or s.backend != "deepspeed"):
        raise ValueError(
            "lora: planned under DeepSpeed ZeRO-3 (yarnlib finetune refuses --lora under "
            "FSDP); allowed: --lora with --engine sft or swift, or --engine finetune --backend "
            "deepspeed"
        )
    if s.activation_offload and s.engine not in ("verl", "sft"):
        raise ValueError(
            f"activation_offload: {s.engine} has no offload of the checkpointed activations "
            "the plan could set; allowed: --activation-offload with --engine verl or sft"
        )
    if s.engine == "sft" and s.backend == "fsdp" and (s.sp or 1) > 1:
        raise ValueError(
            "sp: TRL's Ulysses runs on DeepSpeed (accelerate's parallelism_config sp backend); "
            "allowed: --sp with --backend deepspeed, or --cp with --backend fsdp"
        )
    if s.engine == "swift" and s.backend != "deepspeed":
        raise ValueError("backend: swift is planned under its DeepSpeed ZeRO-3; allowed: deepspeed")
    if s.engine == "swift" and s.offload not in (None, *SWIFT_DEEPSPEED):
        raise ValueError(
            f"offload: {s.offload!r} has no ms-swift DeepSpeed preset (zero3_offload offloads "
            "the parameters with the optimizer); allowed: none (--deepspeed zero3), all "
            "(--deepspeed zero3_offload)"
        )
    if s.optim != OPTIMIZERS[0] and s.engine not in ("sft", "swift", "trl"):
        raise ValueError(
            f"optim: {s.engine} does not take transformers' optim (yarnlib finetune runs "
            "torch.optim.AdamW, for-each on CUDA); allowed: --optim with --engine sft, swift "
            "or trl"
        )
    if s.trl_version != TRL_TESTED and s.engine not in ("sft", "trl"):
        raise ValueError(
            f"trl_version: the loss by TRL version is planned for sft and trl, not {s.engine}; "
            "allowed: --trl-version with --engine sft or trl"
        )
    if TRL_FULL_LOGITS <= s.trl_version < TRL_FUSED_HEAD:
        raise ValueError(
            f"trl_version: {'.'.join(map(str, s.trl_version))} computes its loss in chunks of "
            "its own (chunked_nll), which the plan does not model; allowed: before 1.13 (the "
            "full logits, or Liger's), 1.15 or later (its fused LM head)"
        )
    if s.trl_fused_head and s.logits == "full":
        raise ValueError(
            "logits: TRL 1.15 and later never make the full logits for the loss or the "
            "log-probs (their fused LM head does it in tiles); allowed: leave --logits out, "
            "chunked (Liger's kernels in the layers), or --trl-version below 1.13"
        )
    if s.sp_loss_chunk and s.engine != "swift":
        raise ValueError(
            f"loss_chunk: {s.engine} sets its own loss chunking; allowed: --loss-chunk with "
            "--engine finetune or swift"
        )
    if s.backend == "fsdp":
        return
    if s.engine not in (*TRAINING, "trl"):
        raise ValueError(
            f"backend: deepspeed is planned for finetune, sft, swift and trl, not {s.engine}; "
            "allowed: fsdp"
        )
    if (s.cp or 1) > 1 or s.shard != "full":
        raise ValueError(
            "backend: deepspeed shards over every GPU without context parallel (accelerate's "
            "context parallel runs on FSDP2); allowed: --backend fsdp with --cp or --shard "
            "hybrid, or deepspeed with neither"
        )


def choose(s: Setup) -> Plan:
    """The first plan that fits, trying less offload first, then the smallest sequence-split,
    then the smallest vLLM tensor parallel; else the last one tried (with its problems)."""
    sps, cps, tps, offloads = _candidates(s)
    last = None
    for offload in offloads:
        for split in sorted({(sp, cp) for sp in sps for cp in cps}, key=lambda x: x[0] * x[1]):
            for tp in tps:
                last = evaluate(s, split[0], split[1], tp, offload)
                if last.fits:
                    return last
    return last


def suggestions(s: Setup) -> list[str]:
    """The smallest single changes that make ``s`` fit, as one line each; each was planned
    exactly as the command would run with the flags it names added."""
    found = []
    if s.offload != "all":
        if choose(replace(s, offload="all")).fits:
            found.append("offload weights, grads and optimizer states to CPU (--offload all)")
    if s.logits_mode == "full" and s.engine != "easyr1":
        if choose(replace(s, logits="chunked")).fits:
            # ms-swift with Ulysses keeps its own loss: Liger's kernels in the layers only
            what = "use Liger's kernels" if s.engine == "swift" else "compute the loss in chunks"
            found.append(f"{what} (--logits chunked)")
    if s.engine == "swift" and not s.sp_loss_chunk and s.sp != 1:
        if choose(replace(s, sp_loss_chunk=SWIFT_LOSS_CHUNK)).fits:
            found.append(
                "chunk ms-swift's sequence-parallel loss "
                f"(--loss-chunk {SWIFT_LOSS_CHUNK}: CELOSS_PARALLEL_SIZE)"
            )
    for nodes in (s.nodes * 2, s.nodes * 4):
        if choose(replace(s, nodes=nodes)).fits:
            found.append(f"more GPUs: {nodes} nodes × {s.gpus} (--nodes {nodes})")
            break
    shorter = _longest_fitting(s)
    if shorter:
        found.append(shorter)
    return found


def _shortened(s: Setup, length: int) -> Setup:
    """``s`` with a sequence of ``length`` tokens: the context shrinks down to prompt +
    response, then the response (GRPO) with it."""
    if s.engine in GRPO and s.response:
        return replace(s, context=length, response=min(s.response, length - s.prompt))
    return replace(s, context=length)


def _longest_fitting(s: Setup) -> str | None:
    """The longest sequence below ``s.context`` that fits: a shorter context (while it still
    holds prompt + response), else a shorter response (GRPO) or training window (finetune).
    Lengths step by 1024 tokens, or by what a given ``--cp`` splits (2·cp chunks)."""
    fixed = s.prompt if s.engine in GRPO and s.response else 0
    step = math.lcm(1024, sequence_multiple(s.cp or 1, 1))
    low, high = 0, (s.context - fixed - 1) // step
    while low < high:  # the largest k with a fitting sequence of fixed + k·step tokens
        mid = (low + high + 1) // 2
        if choose(_shortened(s, fixed + mid * step)).fits:
            low = mid
        else:
            high = mid - 1
    if low == 0:
        return None
    length = fixed + low * step
    if not fixed:
        kind = "training window" if s.engine in TRAINING else "context"
        return f"a shorter {kind}: {length} tokens (--context {length})"
    if length >= s.prompt + s.response:
        return f"a shorter context: {length} tokens (--context {length})"
    response = length - s.prompt
    # --context too: a --context the user gave would otherwise keep the sequence as long
    return f"a shorter response: {response} tokens (--response {response} --context {length})"
