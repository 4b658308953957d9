"""Which candidate `yarnlib tune --objective mix` would pick at each weight, from stored trials.

Every needle or mix trial records both parts of the mix objective from the same forward: the
needle NLL (answer tokens of the hidden keys) and ``nll_beyond_original`` (the other tokens
beyond L). So the trials of a finished search say, without another forward, which of the
candidates it visited minimises (1 − w) × text NLL + w × needle NLL for any weight w, and which
candidates are on the Pareto front of the two. This is a choice among the visited candidates,
not a search at w (a search at w would visit others); it shows where the weight starts to trade.

Prints the front and the choice per weight, writes both to ``--output`` as JSON;
``--spec-at W PATH`` writes the candidate chosen at weight W as a spec file (to measure it).

    .venv/bin/python benchmarks/mix_weights.py \\
        benchmarks/results/tune_smollm2/tune-needle benchmarks/results/tune_smollm2/tune-mix \\
        --output benchmarks/results/tune_smollm2/mix_weights.json \\
        --spec-at 0.1 benchmarks/results/tune_smollm2/checks/mix-0.1.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from yarnlib.spec import RopeScaling
from yarnlib.spec_file import write_json, write_spec_file

WEIGHTS = (0.0, 0.02, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0)


def load(folders: list[Path]) -> list[dict]:
    """One trial per candidate (its key), first folder first; trials without both parts (NLL
    searches) are refused: they do not say what the needle part would have been."""
    trials: dict[str, dict] = {}
    for folder in folders:
        for line in (folder / "trials.jsonl").read_text().splitlines():
            t = json.loads(line)
            if "needle_nll" not in t:
                raise SystemExit(f"mix_weights: {folder} holds trials without needle_nll; "
                                 "allowed: folders of needle or mix searches")  # fmt: skip
            trials.setdefault(t["key"], t)
    return list(trials.values())


def summary(t: dict) -> dict:
    return {
        "space": t["space"],
        "text_nll": round(t["nll_beyond_original"], 4),
        "needle_nll": round(t["needle_nll"], 4),
        "attention_factor": round(RopeScaling(**t["spec"]).attention_factor(t["length"]), 4),
        "slowest_divisor": round(slowest_divisor(t), 3),
        "key": t["key"],
    }


def slowest_divisor(t: dict) -> float:
    """The divisor of the slowest frequency: yarn interpolates it by its factor."""
    long_factor = t["spec"].get("long_factor")
    return long_factor[-1] if long_factor else t["spec"]["factor"]


def front(trials: list[dict]) -> list[dict]:
    """The candidates no other one beats on both parts, by text NLL (one of equal ones)."""

    def dominated(t):
        return any(
            u is not t
            and u["nll_beyond_original"] <= t["nll_beyond_original"]
            and u["needle_nll"] <= t["needle_nll"]
            and (u["nll_beyond_original"], u["needle_nll"])
            != (t["nll_beyond_original"], t["needle_nll"])
            for u in trials
        )

    kept = {(t["nll_beyond_original"], t["needle_nll"]): t for t in trials if not dominated(t)}
    return [kept[k] for k in sorted(kept)]


def chosen(trials: list[dict], w: float) -> dict:
    return min(trials, key=lambda t: (1 - w) * t["nll_beyond_original"] + w * t["needle_nll"])


def choices(trials: list[dict]) -> list[dict]:
    return [{"weight": w, **summary(chosen(trials, w))} for w in WEIGHTS]


def row(r: dict) -> str:
    return (
        f"{r['text_nll']:8.4f} {r['needle_nll']:10.4f} {r['attention_factor']:9.4f} "
        f"{r['slowest_divisor']:11.3f}  {r['space']}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="yarnlib tune output folders")
    parser.add_argument("--output", type=Path, help="write the front and choices here as JSON")
    parser.add_argument(
        "--spec-at", nargs=2, metavar=("W", "PATH"), help="write the choice at weight W to PATH"
    )
    args = parser.parse_args(argv)
    if args.spec_at and not 0 <= float(args.spec_at[0]) <= 1:
        parser.error(f"--spec-at: weight {args.spec_at[0]!r}; allowed: a number in [0, 1]")
    trials = load(args.folders)
    result = {
        "folders": [str(f) for f in args.folders],
        "candidates": len(trials),
        "front": [summary(t) for t in front(trials)],
        "choices": choices(trials),
    }
    head = f"{'text NLL':>8} {'needle NLL':>10} {'attention':>9} {'slowest div':>11}  space"
    print(f"{len(trials)} candidates; Pareto front (text NLL beyond L, needle NLL):\n{head}")
    for r in result["front"]:
        print(row(r))
    print(f"\n{'weight':>6}  {head}")
    for r in result["choices"]:
        print(f"{r['weight']:6.2f}  {row(r)}")
    if args.output:
        write_json(args.output, result)
    if args.spec_at:
        w, path = float(args.spec_at[0]), args.spec_at[1]
        t = chosen(trials, w)
        extra = {
            "mix_weight": w,
            "needle_nll": t["needle_nll"],
            "text_nll": t["nll_beyond_original"],
        }
        print(f"weight {w}: {write_spec_file(path, RopeScaling(**t['spec']), chosen_by=extra)}")


if __name__ == "__main__":
    main()
