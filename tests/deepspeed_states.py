"""Run as a script (one process, its own port): a real DeepSpeed ZeRO-3 engine on the CPU
(bf16, the optimizer on the device) for a transformers model built from config.json fields,
one step taken; prints the bytes of what it keeps per rank as JSON."""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
os.environ["LOCAL_RANK"] = "0"

import deepspeed  # noqa: E402
import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def main() -> None:
    fields = json.loads(sys.argv[2])
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(
        model=model, config=config, model_parameters=model.parameters()
    )
    ids = torch.randint(0, fields["vocab_size"], (1, 16))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    zero = engine.optimizer
    states = zero.optimizer.state.values()
    print(
        json.dumps(
            {
                "weights": sum(nbytes(p.ds_tensor) for p in model.parameters()),
                "grads": nbytes(zero.grad_partitions_flat_buffer),
                "grad_dtype": str(zero.grad_partitions_flat_buffer.dtype),
                "master": sum(nbytes(t) for t in zero.fp32_partitioned_groups_flat),
                "moments": sum(nbytes(v) for s in states for k, v in s.items() if "exp_avg" in k),
            }
        )
    )


if __name__ == "__main__":
    main()
