"""Issue 29: SmolLM2-135M (8k) tuned for retrieval at 32k, beside issue 15's NLL-tuned specs.

1. ``yarnlib tune --space both`` at 32k on issue 15's calibration plays (benchmarks/tune_smollm2.py:
   the same plays, budget, window and precision), once per objective of ``SEARCHES``:
   ``needle`` and ``mix`` (retrieval-scored, no floor: does the objective alone keep the slow
   frequencies in range?) and ``nll`` with ``--slow-in-range`` (the floor, NLL-scored), each into
   OUT/tune-NAME; the best of each as OUT/tuned-NAME.json;
2. perplexity at 8k/16k/32k on the held-out plays of the rows ``spec:tuned-NAME`` and of the
   hand-made checks ``OUT/checks/*.json`` (the floored per-dim table, the candidate a mix weight
   of 0.1 picks: benchmarks/mix_weights.py) into OUT/ppl-retrieval, float32 as issue 15's
   OUT/ppl, whose rows are read;
3. OUT/retrieval.json and OUT/retrieval.md: those rows beside ``yarn:4``, tuned yarn and tuned
   per-dim, with the passkey of every row that benchmarks/passkey_smollm2.sh has measured
   (independent prompts, Wilson 95 % intervals; run it with ROWS naming the new spec files).

Every step resumes from its files (the output folder is tracked in git); ``--only NAME`` runs
one search, ``--report`` none (steps 2 and 3). A 32k trial is one forward of 32k tokens: ~1–2
min on a CPU core with AMX in bfloat16 (~11 min on an AMD EPYC core with avx512_bf16), so a
search of 40 trials is about an hour there (float32 on a CPU without bf16 units is ~35 min a
trial: out of reach). ``--smoke``: the pipeline at L=256, N=1024 (minutes).

    nice -n 10 .venv/bin/python benchmarks/tune_retrieval_smollm2.py
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from tune_smollm2 import CALIBRATION, FULL, HELD_OUT, SMOKE, yarnlib  # benchmarks/, beside this

from yarnlib.documents import DEFAULT_DATASET
from yarnlib.eval.passkey import by_length
from yarnlib.eval.stats import percent_interval
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import write_json, write_spec_file

SEARCHES = {
    "needle": ["--objective", "needle"],
    "mix": ["--objective", "mix", "--mix-weight", "0.5"],  # the default when it ran
    "nll-slow": ["--objective", "nll", "--slow-in-range"],
}
# benchmarks/passkey_smollm2.sh's lengths, trials, filler and precision (its cells' settings)
PASSKEY_LENGTHS = "16384,24576,32768"
# Issue 15's rows, read from the same folders, for comparison.
BASELINES = ("yarn:4", "spec:tuned-yarn", "spec:tuned-per-dim", "spec:per-dim-floor")


def search(args, plan: dict, data: Path, output: Path, name: str) -> Path:
    folder = output / f"tune-{name}"
    argv = [
        "tune", "--model", args.model, "--target-length", str(plan["target"]),
        "--dataset", *(str(data / f"{p}.txt") for p in CALIBRATION),
        "--samples", str(plan["tune_samples"]), "--budget", str(plan["budget"]),
        "--space", "both", "--dtype", plan["tune_dtype"], "--output", str(folder),
        *SEARCHES[name],
    ]  # fmt: skip
    if plan["original"]:
        argv += ["--original-max-position-embeddings", str(plan["original"])]
    yarnlib(*argv)
    best = json.loads((folder / "final.json").read_text())["best"]["spec"]
    return write_spec_file(output / f"tuned-{name}.json", RopeScaling(**best))


def perplexity(args, plan: dict, data: Path, output: Path) -> list[dict]:
    """Perplexity cells of every row: issue 15's rows from OUT/ppl, the new spec rows (the
    searches' bests, the floored per-dim table) computed into OUT/ppl-retrieval on the same
    held-out plays (OUT/ppl was keyed on the plays' paths under ../shared, before cells were keyed
    on their tokens; the packaged plays are byte-identical copies, so the numbers compare)."""
    new = [f for f in spec_files(output) if f.stem not in ("tuned-yarn", "tuned-per-dim")]
    yarnlib(
        "eval", "perplexity", "--model", args.model, "--methods", "", "--spec", *map(str, new),
        "--lengths", plan["ppl_lengths"], "--dataset", *(str(data / f"{p}.txt") for p in HELD_OUT),
        "--samples", str(plan["samples"]), "--output", str(output / "ppl-retrieval"), "--resume",
    )  # fmt: skip
    found = [output / folder / "perplexity.json" for folder in ("ppl", "ppl-retrieval")]
    return [
        cell for path in found if path.is_file() for cell in json.loads(path.read_text())["cells"]
    ]


def spec_files(output: Path) -> list[Path]:
    """Every spec row of the comparison that has its file (a row not named is left out of a
    results file: eval keeps a spec row's cells only for the file it is given)."""
    found = [output / "tuned-yarn.json", output / "tuned-per-dim.json",
             *sorted((output / "checks").glob("*.json")),
             *(output / f"tuned-{n}.json" for n in SEARCHES)]  # fmt: skip
    return [f for f in found if f.is_file()]


def passkey(args, output: Path) -> list[dict]:
    """The finished cells of benchmarks/passkey_smollm2.sh's folder (its settings) for every
    row that has a spec file, computing nothing (``--report``)."""
    folder = output / "passkey-independent"
    if args.smoke or not folder.is_dir():
        return []
    yarnlib(
        "eval", "passkey", "--model", args.model, "--methods", "yarn:4",
        "--spec", *map(str, spec_files(output)), "--lengths", PASSKEY_LENGTHS,
        "--trials", "30", "--haystack", "classic", "--dtype", "bfloat16",
        "--output", str(folder), "--report",
    )  # fmt: skip
    return json.loads((folder / "passkey.json").read_text())["cells"]


def rows(cells: list[dict], passkey_cells: list[dict], names: list[str], plan: dict) -> dict:
    """Per row: perplexity per length, 32k over native 8k, passkey per length (pooled)."""
    ppl: dict[str, dict] = {}
    for c in cells:
        ppl.setdefault(c["method"], {})[c["length"]] = math.exp(c["nll"])
    native = ppl.get("none", {}).get(int(plan["ppl_lengths"].split(",")[0]))
    keys = {(r["method"], r["length"]): r for r in by_length(passkey_cells)}
    out = {}
    for name in names:
        if name not in ppl and not any(m == name for m, _ in keys):
            continue
        mine = ppl.get(name, {})
        out[name] = {
            "perplexity": mine,
            "ratio_to_native": {n: p / native for n, p in mine.items()} if native else {},
            "passkey": {n: r for (m, n), r in keys.items() if m == name},
        }
    return out


def markdown(found: dict, plan: dict) -> str:
    ppl_lengths = [int(n) for n in plan["ppl_lengths"].split(",")]
    key_lengths = [int(n) for n in plan["passkey_lengths"].split(",")]
    last = ppl_lengths[-1]
    head = ["row", *(f"ppl {n}" for n in ppl_lengths), f"ppl {last} / native {ppl_lengths[0]}",
            *(f"passkey {n}" for n in key_lengths)]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in found.items():
        ratio = row["ratio_to_native"].get(last)
        keys = [row["passkey"].get(n) for n in key_lengths]
        lines.append("| " + " | ".join([
            f"`{name}`", *(f"{row['perplexity'][n]:.2f}" if n in row["perplexity"] else "-"
                           for n in ppl_lengths),
            "-" if ratio is None else f"{ratio:.3f}",
            *("-" if r is None else f"{percent_interval(r)} (n={r['trials']})" for r in keys),
        ]) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="benchmarks/results/tune_smollm2")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--data", default=str(DEFAULT_DATASET))
    p.add_argument("--only", choices=sorted(SEARCHES), help="run this search only")
    p.add_argument("--report", action="store_true", help="no search: steps 2 and 3 only")
    p.add_argument("--smoke", action="store_true", help="the pipeline at L=256, N=1024")
    args = p.parse_args(argv)
    plan = dict(SMOKE if args.smoke else FULL)
    output, data = Path(args.output), Path(args.data)
    output.mkdir(parents=True, exist_ok=True)
    names = [] if args.report else [args.only] if args.only else list(SEARCHES)
    for name in names:
        search(args, plan, data, output, name)
    cells = perplexity(args, plan, data, output)
    names = dict.fromkeys([*BASELINES, *(f"spec:{f.stem}" for f in spec_files(output))])
    found = rows(cells, passkey(args, output), list(names), plan)
    write_json(output / "retrieval.json", {"plan": plan, "smoke": args.smoke, "rows": found})
    text = markdown(found, plan)
    (output / "retrieval.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
