"""Issue 15's SmolLM2-135M plan: tune for 32k (4x its 8k) on some plays, evaluate on others.

1. ``yarnlib tune --space both`` at N on the calibration plays, one window of N tokens a trial,
   in bfloat16 (OUT/tune); a first search at the N/2 proxy ranked its candidates badly at N
   (OUT/tune-proxy16k: Spearman -0.29; its best at 16k were worse than the defaults at 32k);
2. the best of each space as a spec file (OUT/tuned-yarn.json, OUT/tuned-per-dim.json);
3. ``yarnlib eval perplexity`` at 8k/16k/32k on the held-out plays: native, yarn:4, ntk:4,
   dynamic_yarn:4 and both tuned specs (OUT/ppl);
4. ``yarnlib eval passkey`` at 16k/24k/32k, 5 trials x 3 depths, the same rows but native
   (OUT/passkey), in bfloat16 (angles stay float32): as served on a GPU, and about 3x faster
   here than float32 (the CPU's AMX units); the perplexity stays float32;
5. OUT/results.json and OUT/table.md, printed (perplexity, its ratio to native 8k, passkey);
   OUT/divisors.png, the divisor per frequency of the start and each tuned spec with its
   held-out perplexity at N (benchmarks/plot_tune.py).

Every step resumes: rerun the same command and finished trials and cells are taken from disk.
The default output is tracked in git (benchmarks/results/tune_smollm2): the full plan is about
a day of CPU here (a GPU run is minutes), so a session commits what it finished and the next
one goes on from there. ``--smoke`` runs the same pipeline at a pretended original context of
256 tokens (target 1024) in a few minutes, to prove it end to end (its numbers mean nothing).

    .venv/bin/python benchmarks/tune_smollm2.py
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import plot_tune  # benchmarks/, beside this script

from yarnlib.cli import main as yarnlib_main
from yarnlib.documents import DEFAULT_DATASET
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import write_json, write_spec_file

CALIBRATION = ("antony_and_cleopatra", "henry_v")
HELD_OUT = ("coriolanus", "winters_tale", "romeo_and_juliet")
FULL = {
    "original": None,  # SmolLM2's 8192
    "target": 32768,
    "ppl_lengths": "8192,16384,32768",
    "passkey_lengths": "16384,24576,32768",
    "budget": 40,
    "tune_samples": 1,
    "tune_dtype": "bfloat16",
    "trials": 5,
    "depths": "0.1,0.5,0.9",
    "samples": 2,
    "passkey_dtype": "bfloat16",
}
SMOKE = {
    "original": 256,
    "target": 1024,
    "ppl_lengths": "256,512,1024",
    "passkey_lengths": "768,1024",
    "budget": 4,
    "tune_samples": 1,
    "tune_dtype": "bfloat16",
    "trials": 1,
    "depths": "0.5",
    "samples": 1,
    "passkey_dtype": "bfloat16",
}


def yarnlib(*argv: str) -> None:
    code = yarnlib_main(list(argv))
    if code:
        raise SystemExit(f"yarnlib {' '.join(argv)}: exit {code}")


def tune(args, plan: dict, data: Path, output: Path) -> dict:
    argv = [
        "tune", "--model", args.model, "--target-length", str(plan["target"]),
        "--dataset", *(str(data / f"{p}.txt") for p in CALIBRATION),
        "--samples", str(plan["tune_samples"]), "--budget", str(plan["budget"]),
        "--space", "both", "--dtype", plan["tune_dtype"], "--output", str(output / "tune"),
    ]  # fmt: skip
    if plan["original"]:
        argv += ["--original-max-position-embeddings", str(plan["original"])]
    yarnlib(*argv)
    return json.loads((output / "tune" / "final.json").read_text())


def spec_files(final: dict, output: Path) -> dict[str, Path]:
    """The best spec of each space as a spec file (best.json holds only the overall best)."""
    return {
        space: write_spec_file(output / f"tuned-{space}.json", RopeScaling(**final[space]["spec"]))
        for space in ("yarn", "per-dim")
    }


def evaluate(args, plan: dict, data: Path, output: Path, specs: dict[str, Path]) -> dict:
    """Perplexity and passkey cells of the baselines and both tuned specs (rows spec:tuned-*)."""
    factor = plan["target"] / (plan["original"] or 8192)
    baselines = f"yarn:{factor:g},ntk:{factor:g},dynamic_yarn:{factor:g}"
    held_out = [str(data / f"{p}.txt") for p in HELD_OUT]
    common = ["--model", args.model, "--spec", *map(str, specs.values()), "--resume"]
    yarnlib(
        "eval", "perplexity", *common, "--methods", f"none,{baselines}",
        "--lengths", plan["ppl_lengths"], "--dataset", *held_out,
        "--samples", str(plan["samples"]), "--output", str(output / "ppl"),
    )  # fmt: skip
    yarnlib(
        "eval", "passkey", *common, "--methods", baselines, "--lengths", plan["passkey_lengths"],
        "--trials", str(plan["trials"]), "--depths", plan["depths"],
        "--dtype", plan["passkey_dtype"], "--layout", "classic",
        "--output", str(output / "passkey"),
    )  # fmt: skip
    return {
        name: json.loads((output / folder / f"{name}.json").read_text())["cells"]
        for name, folder in (("perplexity", "ppl"), ("passkey", "passkey"))
    }


def with_held_out(final: dict, cells: dict, plan: dict) -> dict:
    """The tune's results with each plotted spec's held-out NLL at N from the perplexity cells
    (the tune itself runs without --held-out: the evaluation scores the same text)."""
    factor = plan["target"] / (plan["original"] or 8192)
    rows = {"start": f"yarn:{factor:g}", "yarn": "spec:tuned-yarn", "per-dim": "spec:tuned-per-dim"}
    nll = {c["method"]: c["nll"] for c in cells["perplexity"] if c["length"] == plan["target"]}
    out = dict(final)
    for role, method in rows.items():
        measure = f"NLL of the first {plan['target']} tokens of the held-out plays ({method})"
        out[role] = {**final[role], "held_out": {"objective": nll[method], "measure": measure}}
    return out


def table(cells: dict, plan: dict) -> dict:
    """Per method: perplexity per length, its ratio to native at the first length, passkey
    accuracy per length (mean over depths)."""
    ppl: dict[str, dict] = {}
    for c in cells["perplexity"]:
        ppl.setdefault(c["method"], {})[c["length"]] = math.exp(c["nll"])
    native = ppl.get("none", {}).get(int(plan["ppl_lengths"].split(",")[0]))
    passkey: dict[str, dict] = {}
    for c in cells["passkey"]:
        passkey.setdefault(c["method"], {}).setdefault(c["length"], []).append(c["accuracy"])
    rows = {}
    for method in {**ppl, **passkey}:
        rows[method] = {
            "perplexity": ppl.get(method, {}),
            "ratio_to_native": {n: p / native for n, p in ppl.get(method, {}).items()}
            if native
            else {},
            "passkey": {n: sum(a) / len(a) for n, a in passkey.get(method, {}).items()},
        }
    return rows


def markdown_table(rows: dict, plan: dict) -> str:
    """The table of docs/results.md: perplexity per length, the last one's ratio to native at
    the first, passkey accuracy per length (mean over depths; '-' where not run)."""
    ppl_lengths = [int(n) for n in plan["ppl_lengths"].split(",")]
    key_lengths = [int(n) for n in plan["passkey_lengths"].split(",")]
    first, last = ppl_lengths[0], ppl_lengths[-1]
    head = [
        "method", *(f"ppl {n}" for n in ppl_lengths), f"ppl {last} / native {first}",
        *(f"passkey {n}" for n in key_lengths),
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, row in rows.items():
        ratio = row["ratio_to_native"].get(last)
        cells = [
            f"`{method}`", *(f"{row['perplexity'][n]:.2f}" for n in ppl_lengths),
            "-" if ratio is None else f"{ratio:.3f}",
            *("-" if n not in row["passkey"] else f"{row['passkey'][n]:.0%}" for n in key_lengths),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="benchmarks/results/tune_smollm2")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--data", default=str(DEFAULT_DATASET))
    p.add_argument("--budget", type=int, help="tune trials (default 40; smoke 4)")
    p.add_argument("--smoke", action="store_true", help="the pipeline at L=256, N=1024")
    args = p.parse_args(argv)
    plan = dict(SMOKE if args.smoke else FULL)
    if args.budget:
        plan["budget"] = args.budget
    output, data = Path(args.output), Path(args.data)
    output.mkdir(parents=True, exist_ok=True)
    final = tune(args, plan, data, output)
    specs = spec_files(final, output)
    cells = evaluate(args, plan, data, output, specs)
    rows = table(cells, plan)
    results = {
        "plan": plan, "smoke": args.smoke, "tune": with_held_out(final, cells, plan), "rows": rows
    }  # fmt: skip
    write_json(output / "results.json", results)
    plot_tune.main([str(output / "results.json"), "--output", str(output / "divisors")])
    markdown = markdown_table(rows, plan)
    (output / "table.md").write_text(markdown)
    print(markdown, end="")
    print(f"results: {output / 'results.json'}")


if __name__ == "__main__":
    main()
