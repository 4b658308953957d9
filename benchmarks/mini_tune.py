"""``yarnlib tune`` on the miniature of ``mini_yarn_paper.py``: tuned yarn vs the yarn defaults.

The 256-token tiny LLaMA of ``mini_yarn_paper.py`` (pretrained here the same way, or reused
from --output), extended to 4x and 8x without fine-tuning: ``yarnlib tune`` calibrates on
training plays and reports both settings on the held-out plays. Writes ``results.json`` in
--output and prints a table.

    .venv/bin/python benchmarks/mini_tune.py --output /tmp/mini_tune
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from mini_yarn_paper import HELD_OUT, build_base, finetune

from yarnlib.cli import main as yarnlib_main
from yarnlib.documents import DEFAULT_DATASET

ORIGINAL = 256
KNOB_COLUMNS = ("factor", "beta_fast", "beta_slow", "attention_factor")


def pretrained(args, output: Path, train_files: list[Path]) -> Path:
    model_dir = output / "pretrain" / "model"
    if (model_dir / "config.json").is_file():
        return model_dir
    base_dir = build_base(output / "init", train_files, args.vocab)
    run = finetune(
        str(base_dir), train_files, output / "pretrain", output / "cache", "--method", "none",
        "--seq-len", "256", "--batch-size", "8", "--steps", str(args.pretrain_steps),
        "--lr", "3e-3", "--warmup-steps", "20", "--weight-decay", "0.1", "--schedule", "linear",
        "--chunk-size", "0", "--no-gradient-checkpointing",
    )  # fmt: skip
    return Path(run.model_dir)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="benchmarks/results/mini_tune")
    p.add_argument("--data", default=str(DEFAULT_DATASET))
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--pretrain-steps", type=int, default=400)
    p.add_argument("--factors", default="4,8")
    p.add_argument("--budget", type=int, default=30)
    p.add_argument("--samples", type=int, default=2, help="documents per trial and held out")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # see mini_yarn_paper.py: one thread is fastest on shared cores
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    files = sorted(Path(args.data).glob("*.txt"))
    train_files, eval_files = files[:-HELD_OUT], files[-HELD_OUT:]
    model_dir = pretrained(args, output, train_files)
    results = {"settings": vars(args), "model": str(model_dir), "runs": {}}
    for factor in (int(f) for f in args.factors.split(",")):
        tic = time.perf_counter()
        out = output / f"tune-{factor}x"
        yarnlib_main(
            ["tune", "--model", str(model_dir), "--target-length", str(ORIGINAL * factor),
             "--dataset", *map(str, train_files[: args.samples]),
             "--held-out", *map(str, eval_files), "--samples", str(args.samples),
             "--budget", str(args.budget), "--output", str(out)]
        )  # fmt: skip
        final = json.loads((out / "final.json").read_text())
        results["runs"][f"{factor}x"] = {"seconds": round(time.perf_counter() - tic), **final}
    (output / "results.json").write_text(json.dumps(results, indent=1))
    print("held-out perplexity of the tokens beyond 256 (NLL beyond L, exponentiated)")
    print(f"{'target':<8}{'yarn defaults':>15}{'tuned':>10}  tuned spec")
    for name, run in results["runs"].items():
        start, best = run["start"]["held_out"], run["best"]["held_out"]
        spec = {k: v for k, v in run["best"]["spec"].items() if k in KNOB_COLUMNS}
        print(
            f"{name:<8}{math.exp(start['objective']):>15.2f}{math.exp(best['objective']):>10.2f}"
            f"  {spec}"
        )


if __name__ == "__main__":
    main()
