"""Run as a script (one process, its own port): a real DeepSpeed ZeRO-3 engine on the CPU
(bf16, the optimizer on the device) for a transformers model built from config.json fields,
given torch's AdamW as transformers' Trainer and yarnlib finetune give it, for-each and fused;
two steps each. Prints, as JSON, the bytes of what it keeps per rank and the allocated peak of
its second optimizer step above what was there before it (the step's allocations traced and
replayed through tests/caching_allocator.py); and the bytes of a reference model initialized
with the same config and no optimizer, as TRL's GRPO prepares one."""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
os.environ["LOCAL_RANK"] = "0"

import deepspeed  # noqa: E402
import torch  # noqa: E402
from caching_allocator import replay, trace  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3},
    "zero_allow_untested_optimizer": True,  # what transformers sets for its own optimizer
}


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def engine_run(fields: dict, kind: str) -> dict:
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **{kind: True})
    engine, *_ = deepspeed.initialize(model=model, config=CONFIG, optimizer=optimizer)
    ids = torch.randint(0, fields["vocab_size"], (1, 16))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    step = replay(trace(engine.step))
    zero = engine.optimizer
    states = zero.optimizer.state.values()
    return {
        "weights": sum(nbytes(p.ds_tensor) for p in model.parameters()),
        "grads": nbytes(zero.grad_partitions_flat_buffer),
        "grad_dtype": str(zero.grad_partitions_flat_buffer.dtype),
        "master": sum(nbytes(t) for t in zero.fp32_partitioned_groups_flat),
        "moments": sum(nbytes(v) for s in states for k, v in s.items() if "exp_avg" in k),
        "step_peak": step.peak_allocated,
    }


def reference_weights(fields: dict) -> int:
    """What TRL's GRPO reference model keeps under ZeRO-3: ``prepare_deepspeed`` initializes
    it with the trainer's config and no optimizer."""
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))
    engine, *_ = deepspeed.initialize(model=model, config=CONFIG)
    engine.eval()
    return sum(nbytes(p.ds_tensor) for p in model.parameters())


if __name__ == "__main__":
    fields = json.loads(sys.argv[2])
    engines = {kind: engine_run(fields, kind) for kind in ("foreach", "fused")}
    print(json.dumps({**engines, "reference": reference_weights(fields)}))
