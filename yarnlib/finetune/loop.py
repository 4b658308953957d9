"""The fine-tuning loop, on accelerate (DDP, FSDP2, DeepSpeed and context parallelism come from
``accelerate launch`` and its config file; this file is the same for all of them).

    load the model → patch its RoPE → tokenize + pack the data → prepare with accelerate
    for each optimizer step: for each micro-batch: loss from hidden states in chunks, backward
                             clip, AdamW step, scheduler step, log, checkpoint every N steps
    save the final model with its patched config

Every process reads the rows of the global batch that belong to its data-parallel rank
(ranks of one context-parallel group read the same rows; accelerate splits them along the
sequence). The global batch of step s is a pure function of (seed, s), which is what makes
``--resume`` exact.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, set_seed
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler

import yarnlib
from yarnlib import atomic
from yarnlib.chunked_loss import IGNORE_INDEX, nll_sum
from yarnlib.finetune import checkpoint, checks
from yarnlib.finetune.batches import micro_batch
from yarnlib.finetune.data import PackedRows, tokenize
from yarnlib.finetune.logs import LOG_FILE, JsonlLog, choose_trackers, peak_memory_gib
from yarnlib.models import cache_dir, load_config, resolve
from yarnlib.patches import choose_attn_implementation
from yarnlib.pose import pose_position_ids
from yarnlib.spec import RopeScaling, canonical_method, checked_factor

SCHEDULES = {"linear": "linear", "constant": "constant_with_warmup"}
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")


@dataclass
class Result:
    model_dir: Path | None  # the saved model (None when stopped early by --stop-after)
    steps: int  # optimizer steps done in total
    model: torch.nn.Module | None = None  # the trained model, unwrapped (for evaluations)
    optimizer: torch.optim.Optimizer | None = None  # its AdamW (under FSDP: this rank's shards)
    losses: dict[int, float] = field(default_factory=dict)  # step → mean loss, this run


def rope_spec(config, method: str, factor: float, original: int | None) -> RopeScaling | None:
    """The spec the run trains with, validated from the config alone (None: RoPE as is)."""
    if canonical_method(method) == "none":
        checked_factor("none", 1.0 if factor is None else factor)  # none:4 is not the native RoPE
        return None
    return RopeScaling.from_hf(config).rescaled(method, factor, original)


def data_parallel(accelerator) -> tuple[int, int]:
    """(rank, size) among data-parallel replicas: context/tensor/sequence-parallel ranks share
    a replica's rows, and they are the fastest-varying dims of accelerate's device mesh."""
    config = accelerator.parallelism_config
    inner = config.non_data_parallel_size if config else 1
    return accelerator.process_index // inner, accelerator.num_processes // inner


@functools.lru_cache(maxsize=2)
def _permutation(rows: int, seed: int) -> torch.Tensor:
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed))


def step_rows(step: int, global_batch: int, rows: int, seed: int) -> torch.Tensor:
    """Row indices of the global batch of ``step``: a fresh permutation every epoch."""
    first = step * global_batch
    stream = range(first, first + global_batch)
    return torch.stack([_permutation(rows, seed + k // rows)[k % rows] for k in stream])


def step_positions(step: int, global_batch: int, args) -> torch.Tensor:
    """PoSE position ids of the global batch of ``step``, ``[global_batch, seq_len]``: a pure
    function of (seed, step) like the rows, so a resume and any process count draw the same."""
    generator = torch.Generator().manual_seed(args.seed * 2**32 + step)
    draw = pose_position_ids(
        global_batch, args.seq_len, args.target_length, args.pose_chunks, generator=generator
    )
    return draw.position_ids


def build_model(args, attn_implementation: str, factor: float | None):
    """(model to train, the transformers model inside it): loaded, patched, and LoRA-wrapped."""
    model = AutoModelForCausalLM.from_pretrained(
        resolve(args.model), dtype=torch.float32, attn_implementation=attn_implementation
    )
    if canonical_method(args.method) != "none":
        yarnlib.patch(
            model,
            method=args.method,
            factor=factor,
            original_max_position_embeddings=args.original_max_position_embeddings,
            use_kernel=args.use_kernel,
        )
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not args.lora:
        return model, model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=[m.strip() for m in args.lora_targets.split(",")],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora), model


def loss_of(model, head, inputs: dict, labels: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Mean next-token NLL. Chunked: the forward still goes through the wrapped model (DDP /
    FSDP / DeepSpeed hooks run) but keeps logits of one position; the head then runs on the
    final hidden states ``chunk_size`` positions at a time (yarnlib.chunked_loss)."""
    if chunk_size > 0:
        out = model(**inputs, use_cache=False, output_hidden_states=True, logits_to_keep=1)
        total, count = nll_sum(out.hidden_states[-1], unhooked(head), labels, chunk_size)
        return total / max(count, 1)
    logits = model(**inputs, use_cache=False).logits.float()
    return F.cross_entropy(
        logits.flatten(0, 1), labels.flatten().to(logits.device), ignore_index=IGNORE_INDEX
    )


def unhooked(head):
    """The head as a plain linear map. Under FSDP2 the head's unit runs its hooks on every
    call; the chunked loss calls it once per chunk and again in backward (checkpoint
    recompute), which corrupts FSDP2's state (a segfault on CPU). Its weight stays gathered from
    the forward to the end of the backward (accelerate: the tail unit does not reshard after
    forward), so the same matmul without the module's hooks is exact. LoRA on the head and
    other head types are called as they are."""
    if not isinstance(head, torch.nn.Linear):
        return head

    def linear(hidden: torch.Tensor) -> torch.Tensor:
        if hasattr(head.weight, "to_local"):  # still sharded: the unit resharded after forward
            raise RuntimeError(
                "fsdp_reshard_after_forward: the output head was resharded after forward, so "
                "the chunked loss cannot use it; allowed: --chunk-size 0, or keep the head's "
                "unit gathered (accelerate's FSDP2 does)"
            )
        return F.linear(hidden, head.weight, head.bias)

    return linear


def has_accelerator() -> bool:
    if hasattr(torch, "accelerator"):  # torch >= 2.6: CUDA, XPU, MPS, ...
        return torch.accelerator.is_available()
    return torch.cuda.is_available()


def make_accelerator(args) -> Accelerator:
    if args.mixed_precision not in MIXED_PRECISION:
        raise ValueError(
            f"mixed_precision: {args.mixed_precision!r}; allowed: {', '.join(MIXED_PRECISION)}"
        )
    precision = args.mixed_precision
    if precision == "auto":  # bf16 where the hardware runs it fast
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    trackers = choose_trackers(args.report_to)
    accelerator = Accelerator(
        # without this, torchrun on a machine without accelerators gives N unrelated runs
        cpu=not has_accelerator(),
        gradient_accumulation_steps=args.grad_accum,
        mixed_precision=precision,
        log_with=trackers or None,
        project_dir=args.output,
        step_scheduler_with_optimizer=False,  # stepped once per optimizer step, below
    )
    fsdp_on_cpu(accelerator)
    return accelerator


def fsdp_on_cpu(accelerator) -> None:
    """accelerate (1.15) turns an FSDP config into FSDP on GPU-like devices only and runs DDP
    over CPU processes; torch's FSDP2 runs on CPU/gloo. With an FSDP config (the
    ACCELERATE_USE_FSDP that ``accelerate launch`` sets) on several CPU processes, switch the
    state to FSDP, so that prepare, save_state and get_state_dict take accelerate's own FSDP2
    path (tests/test_finetune_fsdp.py: two ranks end where one process does)."""
    wanted = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not wanted or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    plugin = FullyShardedDataParallelPlugin()  # from the FSDP_* variables, as accelerate does
    if plugin.fsdp_version != 2:
        raise ValueError(
            f"fsdp_version: {plugin.fsdp_version} on CPU processes; allowed: 2 (FSDP1 needs "
            "a GPU; set fsdp_version: 2 in the accelerate config)"
        )
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def check_grad_accum(accelerator, wanted: int) -> None:
    """An accelerate/DeepSpeed config may set its own accumulation; the data layout of a step
    (and the exact resume) assumes ``--grad-accum``, so the two must agree."""
    if accelerator.gradient_accumulation_steps != wanted:
        raise ValueError(
            f"grad_accum: --grad-accum is {wanted} but the accelerate/DeepSpeed config sets "
            f"gradient_accumulation_steps={accelerator.gradient_accumulation_steps}; allowed: "
            "the same value in both (or leave it out of the config)"
        )


def train(args) -> Result:
    """Run (or resume) a fine-tuning job described by the parsed ``yarnlib finetune`` args."""
    if args.schedule not in SCHEDULES:
        raise ValueError(f"schedule: {args.schedule!r}; allowed: {', '.join(SCHEDULES)}")
    accelerator = make_accelerator(args)
    check_grad_accum(accelerator, args.grad_accum)
    if args.lora and accelerator.distributed_type == DistributedType.FSDP:
        # peft saves and merges the adapter from full tensors, FSDP2 holds shards of them
        raise ValueError(
            "lora: --lora under FSDP is not supported (the adapter cannot be saved or merged "
            "from sharded weights); allowed: --lora on one process, DDP or DeepSpeed, or full "
            "fine-tuning under FSDP"
        )
    set_seed(args.seed)
    output = Path(args.output)
    resume_from = checkpoint.resolve_resume(args.resume, output) if args.resume else None
    if not resume_from:
        checkpoint.check_new_run(output, args.overwrite)
    parallel = accelerator.parallelism_config
    cp_size = parallel.cp_size if parallel else 1
    checks.check_seq_len(args.seq_len, cp_size, parallel.sp_size if parallel else 1)
    if cp_size > 1 and not args.cross_document_attention:
        raise ValueError(
            "cross_document_attention: context parallelism supports only a plain causal mask; "
            "drop --no-cross-document-attention or use cp_size 1"
        )
    if cp_size > 1 and args.pose:
        raise ValueError(
            "pose: context parallelism splits long rows across ranks, PoSE rows are short; "
            "allowed: --pose with cp_size 1, or context parallelism without --pose"
        )
    config = load_config(args.model)
    factor = args.factor
    if args.pose and factor is None and canonical_method(args.method) != "none":
        factor = checks.pose_factor(
            config, args.target_length, args.original_max_position_embeddings
        )
    spec = rope_spec(config, args.method, factor, args.original_max_position_embeddings)
    if args.pose:
        checks.check_target(args.target_length, spec)
    else:
        checks.check_length(args.seq_len, spec)
    # the length a dynamic method scales to: the target, not a row's largest position
    declared_length = args.target_length if args.pose else args.seq_len
    run_settings = checkpoint.run_settings(args, spec, accelerator.mixed_precision)
    if resume_from:
        checkpoint.check_same_run(resume_from, run_settings)
    attn = choose_attn_implementation(args.attn_implementation, accelerator.device)
    if cp_size > 1 and attn != "sdpa":  # torch's ring attention replaces SDPA only
        if args.attn_implementation != "auto":
            raise ValueError(
                f"attn_implementation: {attn!r} with context parallelism; allowed: sdpa, auto"
            )
        attn = "sdpa"

    tokenizer = AutoTokenizer.from_pretrained(resolve(args.model))
    with accelerator.main_process_first():  # the main process tokenizes, the others read the cache
        stream = tokenize(
            args.dataset,
            tokenizer,
            Path(args.cache_dir or cache_dir() / "finetune"),
            args.text_column,
            args.split,
            args.dataset_config,
            show_progress=accelerator.is_local_main_process,
        )
    data = PackedRows(stream, args.seq_len)
    dp_rank, dp_size = data_parallel(accelerator)
    global_batch = args.batch_size * args.grad_accum * dp_size
    checks.check_dataset(len(data), stream.tokens.numel(), args.seq_len, global_batch)

    model, inner = build_model(args, attn, factor)
    head = inner.get_output_embeddings()
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=args.lr,
        betas=(args.beta1, args.beta2),
        weight_decay=args.weight_decay,
    )
    scheduler = get_scheduler(
        SCHEDULES[args.schedule], optimizer, args.warmup_steps, num_training_steps=args.steps
    )
    if accelerator.state.deepspeed_plugin is not None:  # DeepSpeed wants it before prepare
        config = accelerator.state.deepspeed_plugin.deepspeed_config
        config["train_micro_batch_size_per_gpu"] = args.batch_size
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    check_grad_accum(accelerator, args.grad_accum)
    cursor = checkpoint.Cursor(stream.digest(), global_batch, args.seq_len)
    accelerator.register_for_checkpointing(cursor)
    if args.lora:  # checkpoints of megabytes: the frozen base comes from --model on resume
        accelerator.register_save_state_pre_hook(checkpoint.trainable_only)

    log = JsonlLog(output / LOG_FILE, accelerator.is_main_process)
    if resume_from:
        accelerator.load_state(str(resume_from), strict=not args.lora)
        if accelerator.is_main_process:
            checkpoint.truncate_log(log.path, cursor.step)
        accelerator.print(f"resumed from {resume_from} at step {cursor.step}")
    elif accelerator.is_main_process:
        output.mkdir(parents=True, exist_ok=True)
        log.path.unlink(missing_ok=True)
        # --overwrite: an earlier run's checkpoints would pass for this run's "latest"
        shutil.rmtree(output / checkpoint.CHECKPOINTS, ignore_errors=True)
    accelerator.init_trackers("yarnlib-finetune", config={k: str(v) for k, v in vars(args).items()})

    last = min(args.steps, args.stop_after or args.steps)
    result = Result(None, cursor.step)
    bar = tqdm(
        total=args.steps,
        initial=cursor.step,
        desc="finetune",
        unit="step",
        disable=not accelerator.is_local_main_process,
    )
    model.train()
    started = time.perf_counter()
    with bar:  # closed before an error is printed, which stays the last line
        while cursor.step < last:
            tic = time.perf_counter()
            rows = step_rows(cursor.step, global_batch, len(data), args.seed)
            mine = rows.view(args.grad_accum, dp_size, args.batch_size)[:, dp_rank]
            poses = [None] * args.grad_accum
            if args.pose:
                positions = step_positions(cursor.step, global_batch, args)
                poses = positions.view(args.grad_accum, dp_size, args.batch_size, -1)[:, dp_rank]
            losses = []
            for micro_rows, pose in zip(mine, poses, strict=True):
                inputs, labels = micro_batch(
                    data, micro_rows, args.cross_document_attention, attn, pose=pose
                )
                inputs = {k: v.to(accelerator.device) for k, v in inputs.items()}
                labels = labels.to(accelerator.device)
                if cp_size > 1:  # every shard needs its true positions
                    positions = torch.arange(args.seq_len, device=labels.device)
                    inputs["position_ids"] = positions.repeat(labels.shape[0], 1)
                with accelerator.accumulate(model), context_parallel(accelerator, inputs, labels):
                    with accelerator.autocast(), declared(inner, declared_length, spec):
                        loss = loss_of(model, head, inputs, labels, args.chunk_size)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and args.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                losses.append(loss.detach())
            scheduler.step()
            cursor.step += 1
            mean_loss = accelerator.reduce(torch.stack(losses).mean(), reduction="mean").item()
            seconds = time.perf_counter() - tic
            record = {
                "step": cursor.step,
                "loss": mean_loss,
                "lr": scheduler.get_last_lr()[0],
                "tokens": cursor.step * global_batch * args.seq_len,
                "tokens_per_s": global_batch * args.seq_len / seconds,
                "memory_gib": peak_memory_gib(accelerator.device),
                "elapsed_s": time.perf_counter() - started,
            }
            result.losses[cursor.step] = mean_loss
            if not math.isfinite(mean_loss):
                raise FloatingPointError(f"loss is {mean_loss} at step {cursor.step}; stopping")
            if cursor.step % args.log_every == 0 or cursor.step == last:
                log.write(record)
                accelerator.log({k: v for k, v in record.items() if k != "step"}, step=cursor.step)
            bar.update(1)
            bar.set_postfix(
                loss=f"{mean_loss:.4f}",
                tok_s=f"{record['tokens_per_s']:.0f}",
                mem=f"{record['memory_gib']:.1f}G",
            )
            stopping = cursor.step == last < args.steps  # --stop-after: always resumable
            if stopping or (args.save_every and cursor.step % args.save_every == 0):
                checkpoint.save(
                    accelerator, output, cursor.step, args.keep_checkpoints, run_settings
                )
    result.steps, result.model = cursor.step, accelerator.unwrap_model(model)
    result.optimizer = optimizer.optimizer  # accelerate's wrapper holds the torch optimizer
    if cursor.step >= args.steps:
        result.model_dir = save_model(accelerator, model, tokenizer, output / "model", args.lora)
    accelerator.end_training()
    return result


@contextlib.contextmanager
def declared(inner, seq_len: int, spec: RopeScaling | None):
    """Dynamic methods scale to the row length (with PoSE: the target length), not to the
    longest packed document or largest position in it."""
    if spec is None or not spec.is_dynamic:
        yield
        return
    with yarnlib.declare_length(inner, seq_len):
        yield


def context_parallel(accelerator, inputs: dict, labels: torch.Tensor):
    """Shard the row along the sequence across the context-parallel ranks (no-op without CP).
    Labels are shifted before sharding, as context parallelism requires."""
    config = accelerator.parallelism_config
    if not (config and config.cp_enabled):
        return contextlib.nullcontext()
    buffers = [inputs["input_ids"], inputs["position_ids"], labels]
    return accelerator.maybe_context_parallel(
        buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)
    )


def save_model(accelerator, model, tokenizer, folder: Path, lora: bool) -> Path:
    """The trained model with the config the patch wrote (LoRA merged into the weights), saved
    under a .tmp name and renamed: an earlier model stays whole until this one is."""
    staging = folder.with_name(folder.name + ".tmp")
    if accelerator.is_main_process:
        atomic.fresh_folder(staging)  # a killed save's folder, or a planted link, goes
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    if lora:  # the adapter alone too (megabytes, beside the merged model), before merging
        save_adapter(accelerator, unwrapped, folder.with_name("adapter"))
        unwrapped = unwrapped.merge_and_unload()
        state = unwrapped.state_dict()
    else:
        state = accelerator.get_state_dict(model)  # gathered from every shard
    unwrapped.save_pretrained(
        staging,
        is_main_process=accelerator.is_main_process,
        save_function=accelerator.save,
        state_dict=state,
    )
    # transformers 4.x writes the weights from every rank: none may still be writing into
    # the staging folder when the main process renames it
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        tokenizer.save_pretrained(staging)
        atomic.remove(folder)  # a link there goes, what it points to stays
        staging.rename(folder)
    accelerator.wait_for_everyone()
    return folder


def save_adapter(accelerator, peft_model, folder: Path) -> None:
    """The LoRA adapter (peft's adapter_config.json + adapter_model.safetensors), written under
    a .tmp name and renamed; the patched config in model/ says which RoPE it was trained with."""
    staging = folder.with_name(folder.name + ".tmp")
    if accelerator.is_main_process:
        atomic.fresh_folder(staging)
        peft_model.save_pretrained(staging)
        atomic.remove(folder)
        staging.rename(folder)
    accelerator.wait_for_everyone()
