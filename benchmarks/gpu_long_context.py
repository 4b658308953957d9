"""GPU check step: ``yarnlib eval perplexity`` and one ``yarnlib finetune`` step at 32k tokens,
with a random model of SmolLM2-135M's shape (its real weights are larger than what may travel
to the GPU machine) and the fine-tuning tests' character tokenizer, yarn ×4 from 8k.

Reports time, tokens/s and peak memory of each, and the first step's loss computed in chunks
(the default) against the full-logits loss (``--chunk-size 0``) on the same batch. Each part is
guarded: one failing does not stop the next.
"""

from __future__ import annotations

import gc
import json
import sys
import traceback

import torch
from accelerate.state import AcceleratorState
from gpu_check import CHECKS_FAILED, absent_on_gpu_machine, step_arguments, write_json
from test_finetune_support import cyclic_texts, model_dir, text_folder

from yarnlib.cli import main as yarnlib_main

SMOLLM2_SHAPE = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
    rope_theta=100000.0, tie_word_embeddings=True,
)  # fmt: skip
LENGTH, DRY_RUN_LENGTH = 32768, 512  # the dry run's tiny model has an original context of 256
FACTOR = 4
LOSS_RTOL = 1e-2  # chunked vs full-logits loss of one bf16 step: same math, other roundings


def guarded(part, *args) -> dict:
    try:
        return part(*args)
    except (Exception, SystemExit) as error:  # SystemExit: argparse refusing an option
        return {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}


def perplexity(model, data, length, scratch) -> dict:
    out = scratch / "eval"
    code = yarnlib_main([
        "eval", "perplexity", "--model", str(model), "--dataset", str(data),
        "--methods", f"none,yarn:{FACTOR}", "--lengths", str(length), "--samples", "1",
        "--dtype", "bfloat16", "--output", str(out),
    ])  # fmt: skip
    if code:
        return {"error": f"yarnlib eval perplexity exited {code}"}
    keep = ("method", "length", "perplexity", "seconds", "tokens_per_s", "peak_memory_mb",
            "memory_kind")  # fmt: skip
    cells = json.loads((out / "perplexity.json").read_text())["cells"]
    return {"cells": [{k: c[k] for k in keep} for c in cells]}


def finetune(model, data, length, scratch, chunk_size: int) -> dict:
    if torch.cuda.is_available():  # the peak of this run only, not of the one before
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    out = scratch / f"finetune_chunk{chunk_size}"
    code = yarnlib_main([
        "finetune", "--model", str(model), "--dataset", str(data), "--seq-len", str(length),
        "--steps", "1", "--warmup-steps", "0", "--method", "yarn", "--factor", str(FACTOR),
        "--chunk-size", str(chunk_size), "--report-to", "none", "--output", str(out),
        "--cache-dir", str(scratch / "tokens"),
    ])  # fmt: skip
    AcceleratorState._reset_state(True)  # the next run builds its own Accelerator
    if code:
        return {"error": f"yarnlib finetune exited {code}"}
    record = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    return {k: record[k] for k in ("loss", "tokens_per_s", "memory_gib", "elapsed_s")}


def main() -> int:
    args = step_arguments(__doc__)
    length = DRY_RUN_LENGTH if args.dry_run else LENGTH
    shape = {} if args.dry_run else SMOLLM2_SHAPE  # the dry run: the tests' tiny Llama
    model = model_dir(args.scratch / "model", "llama", **shape)
    # one document: a character per token, two 32k rows for the fine-tuning data
    text = "\n".join(cyclic_texts(2 * length // 40 + 10))
    data = text_folder(args.scratch / "data", [text])
    result = {"tokens": length, "factor": FACTOR, "model_shape": shape or "tests' tiny llama"}
    result["perplexity"] = guarded(perplexity, model, data, length, args.scratch)
    write_json(args.out, result)  # after every part: a step stopped early keeps what it has
    for name, chunk in (("finetune_chunked", 1024), ("finetune_full_logits", 0)):
        result[name] = guarded(finetune, model, data, length, args.scratch, chunk)
        write_json(args.out, result)
    summary, passed = [], True
    for name, part in result.items():
        if isinstance(part, dict) and "error" in part:
            summary.append(f"FAILED {name}: {part['error']}")
            passed = False
    for cell in result["perplexity"].get("cells", []):
        if not args.dry_run and cell["memory_kind"] != "cuda_allocated":
            summary.append(f"FAILED eval perplexity: {cell['method']} ran on the CPU")
            passed = False
        summary.append(
            f"eval perplexity {cell['method']} @ {cell['length']}: {cell['seconds']} s, "
            f"{cell['tokens_per_s']} tokens/s, peak {cell['peak_memory_mb']} MB "
            f"({cell['memory_kind']})"
        )
    chunked, full = result["finetune_chunked"], result["finetune_full_logits"]
    for name, run in (("chunked", chunked), ("full logits", full)):
        if "loss" in run:
            summary.append(
                f"finetune step ({name} loss) @ {length}: {run['elapsed_s']:.1f} s, "
                f"{run['tokens_per_s']:.0f} tokens/s, peak {run['memory_gib']:.2f} GiB"
            )
    if "loss" in chunked and "loss" in full:
        diff = abs(chunked["loss"] - full["loss"])
        result["loss_abs_diff"] = diff
        close = diff <= LOSS_RTOL * abs(full["loss"])
        passed = passed and close
        summary.append(
            f"loss chunked {chunked['loss']:.5f} vs full logits {full['loss']:.5f}: "
            f"|Δ| {diff:.2g} {'ok' if close else 'TOO FAR'}"
        )
    result["passed"], result["summary"] = passed, summary
    result["absent_on_gpu_machine"] = absent_on_gpu_machine()
    write_json(args.out, result)
    print("\n".join(summary))
    return 0 if passed else CHECKS_FAILED


if __name__ == "__main__":
    sys.exit(main())
