"""``yarnlib tune`` on the miniature of ``mini_yarn_paper.py``: the yarn defaults, tuned yarn and
tuned per-dimension divisors (longrope), searched at N and with the N/2 proxy.

The 256-token tiny LLaMA of ``mini_yarn_paper.py`` (pretrained here the same way, or reused
from --output), extended to 4x and 8x without fine-tuning: ``yarnlib tune --space both``
calibrates on training plays, once scoring every trial at N and once at the proxy length N/2
(confirming the best at N), and reports every setting on the held-out plays. Writes
``results.json`` in --output and prints a table.

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
    p.add_argument("--budget", type=int, default=120, help="trials per run (both spaces)")
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
        length = ORIGINAL * factor
        for search, extra in (("N", []), ("N/2", ["--proxy-length", str(length // 2)])):
            out = output / f"tune-{factor}x" if search == "N" else output / f"tune-{factor}x-proxy"
            argv = [
                "tune", "--model", str(model_dir), "--target-length", str(length),
                "--dataset", *map(str, train_files[: args.samples]),
                "--held-out", *map(str, eval_files), "--samples", str(args.samples),
                "--budget", str(args.budget), "--space", "both", "--output", str(out), *extra,
            ]  # fmt: skip
            tic = time.perf_counter()
            yarnlib_main(argv)
            final = json.loads((out / "final.json").read_text())
            final["seconds"] = round(time.perf_counter() - tic, 1)
            final["command"] = "yarnlib " + " ".join(argv)
            results["runs"][f"{factor}x, search at {search}"] = final
    (output / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


def table(results: dict) -> str:
    """Held-out perplexity beyond L of the defaults and each space's best, per run."""
    lines = [
        "held-out perplexity of the tokens beyond 256 (NLL beyond L, exponentiated)",
        f"{'run':<22}{'trials':>7}{'search s':>9}{'defaults':>10}{'yarn':>8}{'per-dim':>9}"
        f"{'best':>8}  Spearman",
    ]
    for name, run in results["runs"].items():
        ppl = {k: math.exp(run[k]["held_out"]["objective"]) for k in ("start", "yarn", "per-dim")}
        rho = run.get("proxy", {}).get("spearman")
        lines.append(
            f"{name:<22}{run['trials']:>7}{run['search_seconds']:>9.1f}{ppl['start']:>10.2f}"
            f"{ppl['yarn']:>8.2f}{ppl['per-dim']:>9.2f}{run['best']['key'].split(':')[0]:>8}"
            f"  {'' if rho is None else f'{rho:.2f}'}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
