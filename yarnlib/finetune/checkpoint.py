"""Checkpoints: accelerate's ``save_state`` (model, optimizer, scheduler, RNG of every process)
plus a ``Cursor`` registered with it, which records how far the run got through the data.

The data order is a pure function of (seed, epoch), so the cursor's step is the whole data
position; it also records what the data and batch were, so a resume with different data or a
different global batch is refused instead of silently training on a different order. Each
checkpoint also holds ``run.json``, the settings that decide what the run computes (model,
RoPE scaling, optimizer, schedule, LoRA, ...): a resume that changes one is refused before
anything loads.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

from yarnlib import atomic

CHECKPOINTS = "checkpoints"
RUN_FILE = "run.json"
_NAME = re.compile(r"^step-(\d+)$")
# what a resume must keep (output, logging, checkpoint cadence and memory options may change)
RUN_FIELDS = (
    "steps", "lr", "weight_decay", "beta1", "beta2", "warmup_steps", "schedule",
    "max_grad_norm", "seed", "cross_document_attention", "lora", "lora_rank", "lora_alpha",
    "lora_dropout", "lora_targets",
)  # fmt: skip


class Cursor:
    """The run's position: optimizer steps done, and the identity of the data it reads."""

    def __init__(self, data_key: str, global_batch: int, seq_len: int):
        self.step = 0
        self.identity = {"data": data_key, "global_batch": global_batch, "seq_len": seq_len}

    def state_dict(self) -> dict:
        return {"step": self.step, **self.identity}

    def load_state_dict(self, state: dict) -> None:
        saved = {k: state.get(k) for k in self.identity}
        if saved != self.identity:
            changed = {k: (saved[k], v) for k, v in self.identity.items() if saved[k] != v}
            raise ValueError(
                f"resume: the checkpoint was written for other data or batch shape "
                f"(field: (checkpoint, now) = {changed}); allowed: the same --dataset, "
                "--seq-len, --batch-size, --grad-accum and process count"
            )
        self.step = int(state["step"])


def run_settings(args, spec, mixed_precision: str) -> dict:
    """The settings of ``run.json``: the RoPE scaling as resolved (``pi`` and ``linear`` are one
    method; a default original length equals the same length given explicitly)."""
    model = Path(args.model)
    return {
        "model": str(model.resolve()) if model.exists() else args.model,
        "method": spec.method if spec else "none",
        "factor": spec.factor if spec else None,
        "original_max_position_embeddings": spec.original_max_position_embeddings if spec else None,
        "mixed_precision": mixed_precision,
        **{name: getattr(args, name) for name in RUN_FIELDS},
        # absent (None) in checkpoints written before PoSE, which were all without it
        "pose": {"target_length": args.target_length, "chunks": args.pose_chunks}
        if args.pose
        else None,
    }


def trainable_only(models, weights, output_dir) -> None:
    """accelerate save-state hook (LoRA runs): keep only the parameters that train; the rest
    equal --model's weights, which a resume loads anyway (and run.json pins --model). FSDP
    and DeepSpeed write the model themselves (``weights`` is empty): every parameter, sharded."""
    if not weights:
        return
    for i, (model, state) in enumerate(zip(models, weights, strict=True)):
        names = {name for name, p in model.named_parameters() if p.requires_grad}
        weights[i] = {name: tensor for name, tensor in state.items() if name in names}


def check_new_run(output: Path, overwrite: bool) -> None:
    """A new run must not replace an earlier one in ``output`` unless asked (``--overwrite``),
    nor mix with its checkpoints."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"output: {output} is a file; allowed: a new or existing folder")
    resumable = bool(completed(output))
    earlier = ["model/"] if (output / "model").exists() else []
    earlier += ["checkpoints/"] if resumable else []
    if earlier and not overwrite:
        resume = "--resume latest to continue it, " if resumable else ""
        raise ValueError(
            f"output: {output} holds an earlier run ({', '.join(earlier)}); allowed: {resume}"
            "--overwrite to replace it, or a new --output"
        )


def check_same_run(folder: Path, settings: dict) -> None:
    """Refuse to resume ``folder`` with settings that would make it another run."""
    path = Path(folder) / RUN_FILE
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            raise ValueError(f"holds {type(saved).__name__}, not a JSON object")
    except (OSError, ValueError) as error:
        raise ValueError(
            f"resume: cannot read {path} ({error}); allowed: a checkpoint folder written by "
            "`yarnlib finetune`"
        ) from None
    changed = [
        f"{name}: checkpoint {saved.get(name)!r}, now {value!r}"
        for name, value in settings.items()
        if saved.get(name) != value
    ]
    if changed:
        raise ValueError(
            f"resume: {folder} was written by another run ({'; '.join(changed)}); allowed: the "
            "checkpoint's values, or a new --output for a new run"
        )


def checkpoint_dir(output: Path, step: int) -> Path:
    return Path(output) / CHECKPOINTS / f"step-{step:06d}"


def completed(output: Path) -> list[Path]:
    """Finished checkpoints, oldest first (a save cut short by a kill keeps its .tmp name)."""
    folder = Path(output) / CHECKPOINTS
    found = [p for p in folder.iterdir() if _NAME.match(p.name)] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def resolve_resume(resume: str, output: Path) -> Path:
    """``latest`` → the newest finished checkpoint under ``output``; else a checkpoint folder."""
    if resume == "latest":
        found = completed(output)
        if not found:
            raise ValueError(f"resume: 'latest' but no checkpoint in {Path(output) / CHECKPOINTS}")
        return found[-1]
    path = Path(resume)
    if not path.is_dir():
        raise ValueError(
            f"resume: {resume!r} is not a checkpoint folder; allowed: a folder or 'latest'"
        )
    return path


def save(accelerator, output: Path, step: int, keep: int, settings: dict) -> Path:
    """Every process writes its part into a .tmp folder, renamed once all are done. A write that
    fails (a full disk) removes the .tmp folder and ends in a ValueError naming the reason: the
    earlier checkpoints stay as they were."""
    final = checkpoint_dir(output, step)
    staging = final.with_name(final.name + ".tmp")
    try:
        _write(accelerator, staging, settings)
    except Exception as error:
        reason = write_failure(error, staging.parent)
        if reason is None:
            raise
        if accelerator.is_main_process:
            atomic.remove(staging)
        raise ValueError(
            f"checkpoint: cannot write {final} ({reason}); nothing of step {step} was kept, the "
            "earlier checkpoints are as they were (free space, then --resume latest)"
        ) from None
    if accelerator.is_main_process:
        atomic.remove(final)
        staging.rename(final)
        for old in completed(output)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _write(accelerator, staging: Path, settings: dict) -> None:
    if accelerator.is_main_process:
        staging.parent.mkdir(parents=True, exist_ok=True)  # the first save makes checkpoints/
        atomic.fresh_folder(staging)  # a killed save's folder, or a planted link, goes
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        atomic.write_text(staging / RUN_FILE, json.dumps(settings, indent=1) + "\n")


# how safetensors (Rust) names the errno of a failed write: "... (os error 28)"
_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_FULL_BELOW = 1 << 20  # bytes left: what a write that filled the disk leaves at most


def write_failure(error: BaseException, folder: Path) -> str | None:
    """Why a checkpoint writer failed to write into ``folder`` (a full disk, a read-only
    folder), or None when ``error`` is not a failed write. The writers say it three ways: an
    OSError (in the exception's chain), safetensors' error with the errno in its text, and
    torch.save's stream writer, which names no errno: then a disk left full names it."""
    cause = error
    while cause is not None:
        if isinstance(cause, OSError):
            return cause.strerror or str(cause)
        cause = cause.__cause__ or cause.__context__
    found = _OS_ERROR.search(str(error))
    if found:
        return os.strerror(int(found.group(1)))
    if isinstance(error, RuntimeError) and "inline_container" in str(error):
        try:
            stats = os.statvfs(folder)
        except OSError:
            return None
        if stats.f_bavail * stats.f_frsize < _FULL_BELOW:
            return os.strerror(errno.ENOSPC)
    return None


def truncate_log(path: Path, step: int) -> None:
    """Drop log records past ``step``: steps a killed run did after its last checkpoint."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by the kill
            continue
        if record.get("step", 0) <= step:
            kept.append(line)
    atomic.write_text(path, "".join(line + "\n" for line in kept), "log")
