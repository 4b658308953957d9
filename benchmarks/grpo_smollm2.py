"""A few GRPO steps of SmolLM2-135M (8k original context) on long Knights-and-Knaves prompts, CPU.

Runs examples/grpo_knights_knaves.py with SmolLM2 (yarn, rollouts in vLLM, actor in
transformers, float32) and keeps its summary: step time split into rollout and actor,
tokens/s, reward per step, and the log-prob gap table (yarnlib vs the two mistaken setups).
The summary is copied to --json; docs/results.md quotes it.

    .venv/bin/python benchmarks/grpo_smollm2.py --prompt-tokens 10240 --steps 2 \\
        --output runs/grpo_smollm2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# two ~10k-token sequences per step (n=2 children prefill side by side): 1 GiB is too tight
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")


def load_example():
    path = ROOT / "examples" / "grpo_knights_knaves.py"
    spec = importlib.util.spec_from_file_location("grpo_knights_knaves", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-tokens", type=int, default=10240)
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--num-generations", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--output", default="runs/grpo_smollm2")
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "grpo_smollm2.json"))
    opts = p.parse_args()
    example = load_example()
    argv = ["--model", "smollm2", "--factor", str(opts.factor)]
    argv += ["--prompt-tokens", str(opts.prompt_tokens), "--steps", str(opts.steps)]
    argv += ["--max-completion-length", str(opts.max_completion_length)]
    argv += ["--num-generations", str(opts.num_generations), "--gradient-checkpointing"]
    summary = example.run([*argv, "--output", opts.output])
    summary["command"] = " ".join(["python benchmarks/grpo_smollm2.py", *sys.argv[1:]])
    summary["example_arguments"] = argv
    path = Path(opts.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
