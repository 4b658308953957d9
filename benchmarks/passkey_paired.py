"""Rows of passkey results scored on the same prompts, compared prompt by prompt.

`yarnlib eval passkey` with independent prompts draws the same prompts (filler offset, depth,
key) for every row of a run and for every run with the same seed, trials and filler, so two
rows — or a trained model and an untrained spec from two output folders — can be compared
pairwise: which prompts only one of them gets. That is more telling than two overlapping
intervals: the exact McNemar test counts only the prompts where they disagree.

Reads the ``passkey.json`` of each folder (its settings and every answer), pairs the answers
of each length by (offset, prompt depth, key), prints per row the rate with its Wilson 95 %
interval and per depth bin, then per pair of rows the four counts and the p-value, and writes
them to ``--output`` as JSON. Rows come from different runs only if those runs share the
prompt settings and the precision (refused otherwise: a bfloat16 row and a float32 row differ in
more than the scaling). A ``none`` row is named after its folder unless renamed.

    .venv/bin/python benchmarks/passkey_paired.py \\
        benchmarks/results/pose_smollm2/passkey-pose \\
        benchmarks/results/tune_smollm2/passkey-independent \\
        --rename passkey-pose:none=pose --output benchmarks/results/passkey_paired_32k.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from yarnlib.eval.stats import mcnemar_exact, rate_fields
from yarnlib.spec_file import write_json

# Settings that decide which prompts are drawn and how they are read; `model` is left out (a
# trained model and its base are compared on purpose).
SHARED = ("dtype", "seed", "distractors", "max_new_tokens", "layout", "haystack", "haystack_tokens")


def load(folders: list[Path], rename: dict[str, str]) -> dict[str, dict[int, dict]]:
    """``{row: {length: {prompt: correct}}}`` from the passkey.json of each folder."""
    rows: dict[str, dict[int, dict]] = {}
    first = None
    for folder in folders:
        data = json.loads((folder / "passkey.json").read_text())
        shared = {k: data["settings"].get(k) for k in SHARED}
        if first is None:
            first = (folder, shared)
        elif shared != first[1]:
            diff = {k: (first[1][k], v) for k, v in shared.items() if v != first[1][k]}
            raise SystemExit(
                f"passkey_paired: {folder} and {first[0]} differ in {diff}; only runs with the "
                f"same {', '.join(SHARED)} score the same prompts the same way"
            )
        for cell in data["cells"]:
            method = cell["method"]
            name = rename.get(
                f"{folder.name}:{method}", folder.name if method == "none" else method
            )
            prompts = rows.setdefault(name, {}).setdefault(cell["length"], {})
            for a in cell["answers"]:
                prompt = (a["offset"], round(a["prompt_depth"], 9), a["key"])
                if prompt in prompts:
                    raise SystemExit(f"passkey_paired: row {name!r} appears twice; --rename one")
                prompts[prompt] = {"correct": a["answer"] == a["key"], "depth": cell["depth"]}
    return rows


def compare(rows: dict[str, dict[int, dict]]) -> dict:
    lengths = sorted({length for by_length in rows.values() for length in by_length})
    out = {"rows": {}, "pairs": []}
    for name, by_length in rows.items():
        for length, prompts in sorted(by_length.items()):
            bins: dict[float, list[int]] = {}
            for p in prompts.values():
                bins.setdefault(p["depth"], []).append(p["correct"])
            out["rows"].setdefault(name, {})[length] = {
                **rate_fields(sum(p["correct"] for p in prompts.values()), len(prompts)),
                "by_depth": {str(d): f"{sum(c)}/{len(c)}" for d, c in sorted(bins.items())},
            }
    for length in lengths:
        present = [n for n in rows if length in rows[n]]
        for a, b in itertools.combinations(present, 2):
            common = rows[a][length].keys() & rows[b][length].keys()
            if not common:
                continue
            ra = {p: rows[a][length][p]["correct"] for p in common}
            rb = {p: rows[b][length][p]["correct"] for p in common}
            only_a = sum(ra[p] and not rb[p] for p in common)
            only_b = sum(rb[p] and not ra[p] for p in common)
            both = sum(ra[p] and rb[p] for p in common)
            out["pairs"].append({
                "length": length, "a": a, "b": b, "prompts": len(common), "both": both,
                "only_a": only_a, "only_b": only_b,
                "neither": len(common) - both - only_a - only_b,
                "p_mcnemar": round(mcnemar_exact(only_a, only_b), 4),
            })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="eval passkey output folders")
    parser.add_argument(
        "--rename", nargs="*", default=[], metavar="FOLDER:ROW=NAME",
        help="name a row of one folder (folder by its last path part), e.g. passkey-pose:none=pose",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, help="write the comparison here as JSON")
    args = parser.parse_args(argv)
    rename = {}
    for item in args.rename:
        where, sep, name = item.partition("=")
        if not sep or ":" not in where or not name:
            parser.error(f"--rename: {item!r}; allowed: FOLDER:ROW=NAME")
        rename[where] = name
    result = compare(load(args.folders, rename))
    for name, by_length in result["rows"].items():
        for length, r in by_length.items():
            depths = ", ".join(r["by_depth"].values())
            print(
                f"{name:24} {length:>6}  {r['correct']}/{r['trials']} "
                f"[{100 * r['ci_low']:.0f}–{100 * r['ci_high']:.0f} %]  by depth {depths}"
            )
    print(f"\n{'length':>6}  {'a':24} {'b':24} {'n':>3} {'both':>4} {'only a':>6} {'only b':>6} "
          f"{'neither':>7}  p (exact McNemar)")  # fmt: skip
    for p in result["pairs"]:
        print(
            f"{p['length']:>6}  {p['a']:24} {p['b']:24} {p['prompts']:>3} {p['both']:>4} "
            f"{p['only_a']:>6} {p['only_b']:>6} {p['neither']:>7}  {p['p_mcnemar']:.3f}"
        )
    if args.output:
        write_json(args.output, result)


if __name__ == "__main__":
    main()
