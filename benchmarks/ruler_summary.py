"""One table of benchmarks/ruler_smollm2.sh's results: every row (the base model's methods and
specs, and the PoSE model as saved) by task and length, the average over the tasks, and the
effective length against the base model's own average at its native length.

    python benchmarks/ruler_summary.py [OUT]    # writes OUT/summary.md and prints it
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

POSE_ROW = "PoSE ×4 (as saved)"


def rows(out: Path) -> list[tuple[str, dict]]:
    """(row name, its report) for the base model's rows and the PoSE model's."""
    found = []
    base = json.loads((out / "ruler.json").read_text())
    found += [(m, base) for m in dict.fromkeys(c["method"] for c in base["cells"])]
    if (out / "pose" / "ruler.json").is_file():
        found.append((POSE_ROW, json.loads((out / "pose" / "ruler.json").read_text())))
    return found


def cell(record: dict | None, n: int | None = None) -> str:
    if record is None:
        return "–"
    right = f" ({round(record['score'] * record['samples'])}/{record['samples']})" if n else ""
    return (
        f"{100 * record['score']:.0f} [{100 * record['ci_low']:.0f}–{100 * record['ci_high']:.0f}]"
        + right
    )


def summary(out: Path) -> str:
    found = rows(out)
    lengths = sorted({c["length"] for _, report in found for c in report["cells"]})
    base = found[0][1]
    lines = [
        "| row | task | " + " | ".join(f"{n // 1024}k" for n in lengths) + " |",
        "|---|---|" + "---|" * len(lengths),
    ]
    effective = []
    for name, report in found:
        method = "none" if name == POSE_ROW else name
        cells = {(c["task"], c["length"]): c for c in report["cells"] if c["method"] == method}
        for task in report["tasks"]:
            values = [cell(cells.get((task, n)), 1) for n in lengths]
            lines.append(f"| {name} | {task} | " + " | ".join(values) + " |")
        means = {a["length"]: a for a in report["averages"] if a["method"] == method}
        values = [f"**{cell(means.get(n))}**" if n in means else "–" for n in lengths]
        lines.append(f"| {name} | **average** | " + " | ".join(values) + " |")
        length = report["effective_length"].get(method)
        effective.append(f"{name}: {length or 'below the threshold at every tested length'}")
    threshold = base["threshold"]
    text = "\n".join(lines) + "\n\n"
    if threshold is None:  # the base report has no `none` row at the native length
        return text + "Effective length: no threshold (run `none` at 8k or give --threshold).\n"
    text += f"Effective length (average ≥ {100 * threshold:.0f} %, the `none` row's at 8k): "
    text += "; ".join(effective) + ".\n"
    return text


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/ruler_smollm2")
    text = summary(out)
    (out / "summary.md").write_text(text)
    print(text, end="")
