"""Plot what ``yarnlib tune`` found: the divisor of each rotary frequency and the held-out score.

Reads the results of benchmarks/mini_tune.py (its ``runs``) or of benchmarks/tune_smollm2.py
(its ``tune``, one run) and draws, per run, the divisor base_inv_freq / inv_freq of each
frequency for the start (the yarn defaults), the tuned yarn and the tuned per-dim spec, with
their held-out perplexity beyond the original context in the legend. Writes OUTPUT.png and the
plotted numbers to OUTPUT.json.

    .venv/bin/python benchmarks/plot_tune.py docs/mini_tune/results.json --output docs/img/mini_tune
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from yarnlib.frequencies import base_inv_freq
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import write_json

ROLES = ("start", "yarn", "per-dim")


def runs_of(results: dict) -> dict[str, dict]:
    """The runs searched at the full target length (the proxy runs rank, they are not plotted)."""
    if "runs" in results:
        return {k: v for k, v in results["runs"].items() if v["settings"]["proxy_length"] is None}
    return {"tune": results["tune"]}


def divisors(spec: dict) -> list[float]:
    scaled = RopeScaling(**spec)
    base = base_inv_freq(scaled.rope_theta, scaled.rotary_dim)
    return (base / scaled.inv_freq()).tolist()


def curves(run: dict) -> dict[str, dict]:
    return {
        role: {
            "key": run[role]["key"],
            "divisors": divisors(run[role]["spec"]),
            "held_out_perplexity": math.exp(run[role]["held_out"]["objective"]),
        }
        for role in ROLES
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="results.json of mini_tune.py or tune_smollm2.py")
    p.add_argument("--output", required=True, help="path without suffix: writes .png and .json")
    args = p.parse_args(argv)
    data = {
        name: curves(run)
        for name, run in runs_of(json.loads(Path(args.results).read_text())).items()
    }

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(5.5 * len(data), 4), squeeze=False)
    for ax, (name, run) in zip(axes[0], data.items(), strict=True):
        for role, style in zip(ROLES, ("k:", "C0-", "C3-"), strict=True):
            c = run[role]
            label = f"{role} (held-out ppl {c['held_out_perplexity']:.2f})"
            ax.plot(range(len(c["divisors"])), c["divisors"], style, marker=".", label=label)
        ax.set_yscale("log", base=2)
        ax.set(title=name, xlabel="frequency index (high → low)", ylabel="divisor of inv_freq")
        ax.legend(fontsize=8)
    fig.tight_layout()
    output = Path(args.output)
    fig.savefig(output.with_suffix(".png"), dpi=110)
    write_json(output.with_suffix(".json"), data)
    print(f"wrote {output.with_suffix('.png')} and {output.with_suffix('.json')}")


if __name__ == "__main__":
    main()
