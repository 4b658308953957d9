"""GPU check step: a patched model, Triton kernel on, against the same model configured
natively in transformers (its own rope): 2 layers of a Qwen2.5-7B-like shape (rope_kernels.py's
heads, yarn ×4 from 32k), random weights, bfloat16, SDPA, at 16k and 64k tokens.

Per length and model: forward (hidden states) and forward+backward (chunked loss, weight
gradients) median time and peak memory, the latter beside ``yarnlib plan``'s prediction for
the same shape (issue 30); max |Δ logits| of the patched model against the native one, with
the kernel and with transformers' rotation of yarnlib's tables (which must be exactly 0).
Logits are compared a chunk of positions at a time (never [64k × 152k]).
"""

from __future__ import annotations

import sys

import torch
from gpu_check import absent_on_gpu_machine, step_arguments, write_json
from patch_overhead import native_twin
from rope_kernels import HEAD_DIM, KV_HEADS, Q_HEADS, SPEC, timer
from tiny_models import tiny_config
from transformers import AutoConfig, AutoModelForCausalLM

import yarnlib
from yarnlib.chunked_loss import causal_lm_loss
from yarnlib.eval.measure import Meter
from yarnlib.patches import patch_state
from yarnlib.plan import memory
from yarnlib.plan.shapes import shape_from_config

LENGTHS, DRY_RUN_LENGTHS = (16384, 65536), (64, 128)
REPEATS, DRY_RUN_REPEATS = 3, 1
LOGIT_CHUNK = 4096


def model_config(dry_run: bool):
    if dry_run:
        return tiny_config("qwen2")
    return AutoConfig.for_model(
        "qwen2", hidden_size=Q_HEADS * HEAD_DIM, intermediate_size=18944, num_hidden_layers=2,
        num_attention_heads=Q_HEADS, num_key_value_heads=KV_HEADS, vocab_size=152064,
        max_position_embeddings=SPEC.original_max_position_embeddings,
        rope_theta=SPEC.rope_theta, tie_word_embeddings=False,
    )  # fmt: skip


def measure(model, ids, device, repeats) -> dict:
    """Median ms and peak memory of a forward and of a forward+backward."""

    def forward():
        with torch.no_grad():
            model.model(input_ids=ids, use_cache=False)

    def forward_backward():
        loss, _ = causal_lm_loss(model, ids)
        loss.backward()
        model.zero_grad(set_to_none=True)

    row = {}
    for phase, fn in (("forward", forward), ("fwd_bwd", forward_backward)):
        with Meter(device) as meter:
            row[f"{phase}_ms"] = timer(fn, device, repeats)
        row[f"{phase}_peak_mb"] = meter.peak_memory_mb
    return row


# the model's weights, activations and gradients are all bfloat16 here (no autocast, no FSDP)
BF16_WEIGHTS = memory.Precision("bf16-weights", 2, 2, 2, False)


def planned_fwd_bwd_mb(model, tokens: int) -> float:
    """The plan's peak of a forward+backward with ``causal_lm_loss`` (1024-token loss chunks):
    the weights, then the activation peak with the head's grad, or every grad at the end."""
    shape = shape_from_config(model.config.to_dict())
    params = sum(p.numel() for p in model.parameters())
    p = BF16_WEIGHTS
    acts = memory.activations(shape, tokens, p, checkpointing=False, attn="sdpa", chunk=1024)
    head_grad = p.param * shape.vocab_size * shape.hidden_size
    peak = p.param * params + max(memory.activation_peak(acts) + head_grad, p.param * params)
    return round(peak / 2**20, 1)


@torch.no_grad()
def max_logit_diff(model, native, ids) -> tuple[float, float]:
    """(max |logits − native logits|, max |native logits|) over every position."""
    ours = model.model(input_ids=ids, use_cache=False).last_hidden_state[0]
    theirs = native.model(input_ids=ids, use_cache=False).last_hidden_state[0]
    diff = scale = 0.0
    for start in range(0, ids.shape[1], LOGIT_CHUNK):
        a = model.lm_head(ours[start : start + LOGIT_CHUNK]).float()
        b = native.lm_head(theirs[start : start + LOGIT_CHUNK]).float()
        diff = max(diff, (a - b).abs().max().item())
        scale = max(scale, b.abs().max().item())
    return diff, scale


def main() -> int:
    args = step_arguments(__doc__)
    device = torch.device("cpu" if args.dry_run else "cuda")
    lengths = DRY_RUN_LENGTHS if args.dry_run else LENGTHS
    repeats = DRY_RUN_REPEATS if args.dry_run else REPEATS
    config = model_config(args.dry_run)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation="sdpa", dtype=torch.bfloat16
        )
    yarnlib.patch(model, "yarn", 4.0, use_kernel=True)
    spec = patch_state(model).spec
    native = native_twin(model, spec)
    model.eval()
    # each model is measured while its twin's weights stay resident: the plan is for one model
    twin_mb = sum(t.numel() * t.element_size() for t in native.state_dict().values()) / 2**20

    def inputs(n):
        gen = torch.Generator().manual_seed(n)
        return torch.randint(0, config.vocab_size, (1, n), generator=gen).to(device)

    rows = []
    for n in lengths:
        ids = inputs(n)
        row = {"tokens": n, "native": measure(native, ids, device, repeats)}
        row["kernel"] = measure(model, ids, device, repeats)
        row["planned_fwd_bwd_peak_mb"] = planned_fwd_bwd_mb(model, n)
        row["resident_twin_mb"] = round(twin_mb, 1)
        row["max_abs_diff_logits_kernel"], row["max_abs_logits"] = max_logit_diff(
            model, native, ids
        )
        rows.append(row)
    yarnlib.patch(model, "yarn", 4.0, use_kernel=False)  # transformers' rotation, our tables
    for row in rows:
        row["max_abs_diff_logits_torch_rotation"], _ = max_logit_diff(
            model, native, inputs(row["tokens"])
        )
    summary = [f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, "
               f"{spec.describe()}"]  # fmt: skip
    for r in rows:
        k, nat = r["kernel"], r["native"]
        summary.append(
            f"{r['tokens']} tokens: kernel / native time fwd "
            f"{k['forward_ms'] / nat['forward_ms']:.3f}× ({k['forward_ms']:.1f} vs "
            f"{nat['forward_ms']:.1f} ms), fwd+bwd {k['fwd_bwd_ms'] / nat['fwd_bwd_ms']:.3f}× "
            f"({k['fwd_bwd_ms']:.1f} vs {nat['fwd_bwd_ms']:.1f} ms); peak fwd+bwd "
            f"{k['fwd_bwd_peak_mb']} vs {nat['fwd_bwd_peak_mb']} MB, of which the resident "
            f"twin {r['resident_twin_mb']} MB: kernel peak − twin / plan "
            f"{(k['fwd_bwd_peak_mb'] - r['resident_twin_mb']) / r['planned_fwd_bwd_peak_mb']:.3f} "
            f"(plan {r['planned_fwd_bwd_peak_mb']} MB); max |Δ logits| kernel "
            f"{r['max_abs_diff_logits_kernel']:.3g}, transformers' rotation "
            f"{r['max_abs_diff_logits_torch_rotation']:.3g} (|logits| ≤ "
            f"{r['max_abs_logits']:.3g})"
        )
    write_json(args.out, {
        "device": str(device), "dtype": "bfloat16", "config": config.to_dict(),
        "spec": spec.describe(), "repeats": repeats, "rows": rows, "summary": summary,
        "absent_on_gpu_machine": absent_on_gpu_machine(),
    })  # fmt: skip
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
