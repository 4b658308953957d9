"""Quality of every scaling method on SmolLM2-135M (8k native) without fine-tuning.

Perplexity on the Shakespeare plays at 2k–16k, passkey retrieval beyond 8k, and the peak memory
of yarnlib's chunked perplexity at 16k against a naive full-logits loss. Resumable: rerun with
--resume after an interruption. Results land in --output; docs/results.md quotes them.

    .venv/bin/python benchmarks/quality_smollm2.py --parts perplexity,passkey,memory --resume
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from yarnlib.chunked_loss import causal_lm_loss
from yarnlib.cli import main as yarnlib_main
from yarnlib.documents import load_documents
from yarnlib.eval.measure import Meter
from yarnlib.models import load_smollm2

STATIC = ("linear", "ntk", "ntk_by_parts", "yarn")
PARTS = ("perplexity", "passkey", "memory")


def perplexity_methods(factors: list[str]) -> str:
    """Most telling first (an interrupted run still compares none, YaRN and Dynamic-YaRN)."""
    # dynamic_yarn's scale is max(1, length / original): the factor does not enter, run it once.
    methods = ["none", f"yarn:{factors[0]}", f"dynamic_yarn:{factors[0]}"]
    for f in factors:
        methods += [f"{m}:{f}" for m in STATIC if f"{m}:{f}" not in methods]
        methods.append(f"dynamic_ntk:{f}")
    return ",".join(methods)


def memory_check(length: int, layers: int | None, output: Path) -> dict:
    """Peak memory of one forward + loss at ``length`` tokens: chunked head vs full logits.

    ``layers`` keeps only the first decoder layers (same hidden size and vocabulary): without
    autograd the forward's working memory is one layer's, so the difference is the logits.
    """
    model, tokenizer = load_smollm2()
    if layers:
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
    text = load_documents()[0][1]
    ids = torch.tensor([tokenizer(text)["input_ids"][:length]])
    result = {"length": length, "layers": len(model.model.layers), "vocab": model.config.vocab_size}
    with torch.no_grad():
        with Meter() as chunked:
            loss, _ = causal_lm_loss(model, ids)
        result["chunked"] = {"loss": float(loss), **chunked.fields(length)}
        with Meter() as naive:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        result["full_logits"] = {"loss": float(loss), **naive.fields(length)}
    logits_gb = length * model.config.vocab_size * 4 / 2**30
    result["full_logits_tensor_gib"] = round(logits_gb, 2)
    (output / "memory.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="results/quality_smollm2")
    parser.add_argument("--parts", default=",".join(PARTS), help=", ".join(PARTS))
    parser.add_argument("--factors", default="2,4")
    parser.add_argument("--lengths", default="2048,4096,8192,12288,16384")
    parser.add_argument("--samples", type=int, default=1, help="plays per length")
    parser.add_argument("--passkey-methods", default="none,linear:2,ntk:2,yarn:2,dynamic_yarn:2")
    parser.add_argument("--passkey-lengths", default="12288")
    parser.add_argument("--depths", default="0.5")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--memory-length", type=int, default=16384)
    parser.add_argument("--memory-layers", type=int, help="keep only this many layers (speed)")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    output = Path(args.output)
    parts = args.parts.split(",")
    common = ["--model", "smollm2", *(["--resume"] if args.resume else [])]
    if "perplexity" in parts:
        methods = perplexity_methods(args.factors.split(","))
        yarnlib_main(
            ["eval", "perplexity", *common, "--methods", methods, "--lengths", args.lengths,
             "--samples", str(args.samples), "--output", str(output / "perplexity")]
        )  # fmt: skip
    if "passkey" in parts:
        yarnlib_main(
            ["eval", "passkey", *common, "--methods", args.passkey_methods,
             "--lengths", args.passkey_lengths, "--depths", args.depths,
             "--trials", str(args.trials), "--layout", "classic",
             "--output", str(output / "passkey")]
        )  # fmt: skip
    if "memory" in parts:
        print(json.dumps(memory_check(args.memory_length, args.memory_layers, output), indent=2))


if __name__ == "__main__":
    main()
