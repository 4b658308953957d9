"""Issue 29: yarnlib's coordinate search against LongRoPE's evolutionary search, on the miniature
of ``mini_tune.py`` (the 256-token tiny LLaMA, extended without fine-tuning), at the same number
of objective evaluations.

Both search the per-dim space (divisors per frequency and the attention factor, yarnlib's box)
from the same start, the YaRN defaults' tables, minimising the mean NLL beyond L of the same
calibration windows: ``coordinate`` is ``yarnlib tune --space per-dim``; ``evolution`` is
``yarnlib.tune.evolution`` with LongRoPE's default sizes (population 64, 16 mutations + 16
crossovers a generation, 32 parents) and ``evolution/4`` with them scaled by 1/4 (LongRoPE's
``evo_scale``), which fits several generations into a small budget (and runs on past its 10
generations to the budget). Per run: the best
objective after each evaluation, and the held-out NLL beyond L of the best table. Writes
``results.json`` (every curve) and ``table.md`` in --output; every run resumes from its
trials file.

    .venv/bin/python benchmarks/tune_search_compare.py   # pretrains the miniature if needed
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from pathlib import Path

import torch
from mini_tune import ORIGINAL, pretrained
from mini_yarn_paper import HELD_OUT
from transformers import AutoTokenizer

from yarnlib.documents import DEFAULT_DATASET
from yarnlib.eval.store import CellStore
from yarnlib.models import load_model
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import write_json
from yarnlib.tune.cli import samples_of
from yarnlib.tune.evolution import DEFAULTS, evolve, scaled
from yarnlib.tune.search import Search, objective, to_spec

# evolution/4 would end after its 10 generations (96 evaluations): it runs on to the budget
ALGORITHMS = {
    "coordinate": None,
    "evolution": DEFAULTS,
    "evolution/4": {**scaled(0.25), "generations": 10**6},
}
MARKS = (15, 30, 60, 120, 240)  # evaluations at which the table reads the curves


def run_one(model, calibration, held_out, native, length, folder, algorithm, seed, budget):
    store = CellStore(folder, ("key",), {"algorithm": algorithm, "seed": seed}, True)
    search = Search(model, calibration, native, ORIGINAL, length, store, budget)
    tic = time.perf_counter()
    if ALGORITHMS[algorithm] is None:
        search.run(seed, "per-dim")
    else:
        evolve(search, seed, ALGORITHMS[algorithm])
    seconds = time.perf_counter() - tic
    records = sorted(store.done.values(), key=lambda r: r["trial"])[:budget]
    curve = list(itertools.accumulate((r["objective"] for r in records), min))
    spec = to_spec(native, ORIGINAL, search.best_point)
    return {
        "algorithm": algorithm, "seed": seed, "evaluations": len(records),
        "best_so_far": curve, "best": search.best["objective"], "best_key": search.best["key"],
        "held_out": objective(model, held_out, spec, ORIGINAL)["objective"],
        "seconds_this_run": round(seconds, 1),
    }  # fmt: skip


def table(runs: list[dict], factors: list[int], budget: int) -> str:
    """Mean over seeds of the best objective after k evaluations, and of the held-out
    perplexity beyond L of each run's best."""
    marks = [k for k in MARKS if k <= budget]
    head = ["target", "search", "seeds", *(f"after {k}" for k in marks), "held-out ppl"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for factor in factors:
        for algorithm in ALGORITHMS:
            mine = [r for r in runs if r["factor"] == factor and r["algorithm"] == algorithm]
            if not mine:
                continue
            at = [
                sum(r["best_so_far"][min(k, len(r["best_so_far"])) - 1] for r in mine) / len(mine)
                for k in marks
            ]
            ppl = sum(math.exp(r["held_out"]) for r in mine) / len(mine)
            cells = [
                f"{factor}x",
                algorithm,
                str(len(mine)),
                *(f"{v:.4f}" for v in at),
                f"{ppl:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="benchmarks/results/tune_search_compare")
    p.add_argument("--work", default="/tmp/mini_search", help="pretrained model and trials")
    p.add_argument("--data", default=str(DEFAULT_DATASET))
    p.add_argument("--factors", default="4,8")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--budget", type=int, default=120, help="objective evaluations per run")
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--pretrain-steps", type=int, default=400)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    output, work = Path(args.output), Path(args.work)
    output.mkdir(parents=True, exist_ok=True)
    files = sorted(Path(args.data).glob("*.txt"))
    train_files, eval_files = files[:-HELD_OUT], files[-HELD_OUT:]
    model_dir = pretrained(args, work, train_files)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model, _ = load_model(str(model_dir), torch.float32)
    native = RopeScaling.from_hf(model.config)
    factors = [int(f) for f in args.factors.split(",")]
    runs = []
    for factor in factors:
        length = ORIGINAL * factor
        calibration = samples_of("data", train_files[: args.samples], tokenizer, "text", length,
                                 args.samples)  # fmt: skip
        held_out = samples_of("data", eval_files, tokenizer, "text", length, args.samples)
        for seed in (int(s) for s in args.seeds.split(",")):
            for algorithm in ALGORITHMS:
                folder = work / "runs" / f"{factor}x-{algorithm.replace('/', '_')}-seed{seed}"
                run = run_one(model, calibration, held_out, native, length, folder, algorithm,
                              seed, args.budget)  # fmt: skip
                runs.append({"factor": factor, **run})
                print(f"{factor}x {algorithm} seed {seed}: best {run['best']:.4f}, held-out "
                      f"{run['held_out']:.4f}")  # fmt: skip
                results = {"settings": vars(args), "model": str(model_dir), "runs": runs}
                write_json(output / "results.json", results)
    markdown = table(runs, factors, args.budget)
    (output / "table.md").write_text(markdown)
    print(markdown, end="")


if __name__ == "__main__":
    main()
