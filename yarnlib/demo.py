"""``yarnlib demo``: context extension for real, on SmolLM2-135M (8k native), offline.

Perplexity at 2k–12k for plain RoPE vs YaRN and Dynamic-YaRN, and passkey retrieval at 12k
with the key ~11k tokens before the question (beyond the 8k the model was trained on),
sized to run in under 10 minutes on 2 CPU cores. Resumable (``--resume``).
"""

from __future__ import annotations

import json
from pathlib import Path

from yarnlib import atomic
from yarnlib.cli import main as yarnlib_main


def summary(output: Path) -> dict:
    ppl = json.loads((output / "perplexity" / "perplexity.json").read_text())["cells"]
    keys = json.loads((output / "passkey" / "passkey.json").read_text())["cells"]
    return {
        "model": "SmolLM2-135M (original context 8192)",
        "perplexity": {f"{c['method']}@{c['length']}": round(c["perplexity"], 2) for c in ppl},
        "passkey_accuracy": {f"{c['method']}@{c['length']}": c["accuracy"] for c in keys},
        "plots": [
            str(output / "perplexity" / "perplexity.png"),
            str(output / "passkey" / "passkey.png"),
        ],
    }


def run(args) -> int:
    output = Path(args.output)
    common = ["--model", "smollm2", *(["--resume"] if args.resume else [])]
    print("== perplexity (Shakespeare, first L tokens of each play) ==", flush=True)
    code = yarnlib_main(
        ["eval", "perplexity", *common, "--methods", args.methods, "--lengths", args.lengths,
         "--samples", str(args.samples), "--output", str(output / "perplexity")]
    )  # fmt: skip
    if code:
        return code
    print("== passkey retrieval (greedy decoding) ==", flush=True)
    code = yarnlib_main(
        ["eval", "passkey", *common, "--methods", args.passkey_methods,
         "--lengths", args.passkey_lengths, "--depths", args.depths, "--trials", str(args.trials),
         "--layout", "classic", "--output", str(output / "passkey")]
    )  # fmt: skip
    if code:
        return code
    result = summary(output)
    atomic.write_text(output / "summary.json", json.dumps(result, indent=2) + "\n")
    print(f"summary: {output / 'summary.json'}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="SmolLM2-135M beyond its 8k context: perplexity and passkey, none vs YaRN"
    )
    parser.add_argument("--output", default="results/demo")
    parser.add_argument("--methods", default="none,yarn:2,dynamic_yarn:2")
    parser.add_argument("--lengths", default="2048,4096,8192,12288")
    parser.add_argument("--samples", type=int, default=1, help="plays per length")
    parser.add_argument("--passkey-methods", default="none,yarn:2")
    parser.add_argument("--passkey-lengths", default="12288")
    parser.add_argument("--depths", default="0.1", help="key depths (0.1: far from the question)")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--resume", action="store_true", help="keep the cells already computed")
    parser.set_defaults(func=run)
