"""`yarnlib plan` against measured training steps on CPU: peak memory of one step of a tiny
Llama and of SmolLM2-135M, with and without gradient checkpointing and the chunked loss, in
float32 and bf16 autocast, beside the plan's number (``yarnlib.plan.measure``).

Each row runs in its own process (one thread; SmolLM2 at 16k two); rows already in the JSON
are kept, so an interrupted run resumes with the same command. The planned bytes are
recomputed from the current formulas whenever the table is written.

    nice -n 10 python benchmarks/plan_memory.py                 # all rows (~1 h on 2 busy cores)
    python benchmarks/plan_memory.py --only tiny                # the tiny model's rows
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tqdm.auto import tqdm

from yarnlib.plan import memory
from yarnlib.plan.measure import TINY, measure_in_subprocess
from yarnlib.plan.shapes import shape_from_config

OUT = Path(__file__).parent / "results" / "plan_memory"
MB = 2**20


def rows(smollm2_path: str | None) -> list[dict]:
    out = []
    tiny = [
        (2048, precision, checkpointing, chunk)
        for precision in ("fp32", "bf16")
        for checkpointing in (False, True)
        for chunk in (0, 1024)
    ]
    tiny_long = [
        (4096, "fp32", False, 0),
        (4096, "bf16", True, 1024),
        (8192, "fp32", True, 1024),
        (8192, "bf16", False, 1024),
        (16384, "fp32", False, 0),
        (16384, "bf16", True, 1024),
    ]
    # SmolLM2-135M in float32 only: on CPUs without AMX or avx512_bf16 a bfloat16 matmul runs
    # at ~0.1 GFLOP/s (float32: ~68 on 2 cores), so its bf16 rows cannot run there; the tiny
    # model's rows cover bf16. Without checkpointing up to 8k (11 GB at 8k in float32).
    smol = [
        (2048, "fp32", False, 1024),
        (2048, "fp32", True, 0),
        (4096, "fp32", False, 0),
        (4096, "fp32", True, 1024),
        (8192, "fp32", True, 1024),
        (16384, "fp32", True, 1024),
        (8192, "fp32", False, 1024),
    ]
    # the cheap rows of each model before the long ones
    # (the tiny bf16 row at 16k last: bf16 matmuls are slowest where the CPU lacks bf16 units)
    groups = (("tiny", tiny), ("tiny", tiny_long[:-1]), ("smollm2", smol), ("tiny", tiny_long[-1:]))
    for name, settings in groups:
        for tokens, precision, checkpointing, chunk in settings:
            row = dict(name=name, tokens=tokens, precision=precision, attn="sdpa")
            where = {"model": TINY} if name == "tiny" else {"path": smollm2_path}
            # SmolLM2 at 16k: ~1.5 h on one thread here, so two
            threads = 2 if name == "smollm2" and tokens >= 16384 else 1
            out.append(
                dict(row, **where, checkpointing=checkpointing, chunk=chunk, threads=threads)
            )
    return out


def key(row: dict) -> str:
    ckpt = int(row["checkpointing"])
    return f"{row['name']}-{row['tokens']}-{row['precision']}-ckpt{ckpt}-chunk{row['chunk']}"


def planned(row: dict, config: dict, params: tuple[int, int]) -> int:
    shape = shape_from_config(config)
    p = memory.PRECISIONS[row["precision"]]
    acts = memory.activations(
        shape, row["tokens"], p, checkpointing=row["checkpointing"], attn="sdpa", chunk=row["chunk"]
    )
    return memory.step_peak(shape, acts, p, *params)


def table(results: dict) -> str:
    # measured / planned: "within ±15 % of the plan" is 0.85 ≤ this ≤ 1.15
    head = (
        "model | tokens | precision | checkpointing | loss | measured MiB | planned MiB "
        "| measured / planned"
    )
    lines = [f"| {head} |", "|---" * 8 + "|"]
    for r in results.values():
        cells = [r["name"], r["tokens"], r["precision"], "yes" if r["checkpointing"] else "no"]
        cells.append(f"chunked {r['chunk']}" if r["chunk"] else "full logits")
        cells.append(f"{r['measured_bytes'] / MB:.1f}")
        cells.append(f"{r['planned_bytes'] / MB:.1f}")
        cells.append(f"{r['measured_bytes'] / r['planned_bytes']:.3f}")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def write(results: dict, out: Path) -> None:
    for r in results.values():
        r["planned_bytes"] = planned(r, r["config"], tuple(r["params"]))
    staging = out / "results.json.tmp"
    staging.write_text(json.dumps(results, indent=1))
    staging.replace(out / "results.json")
    (out / "table.md").write_text(table(results) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("tiny", "smollm2"), default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    smollm2 = None
    if args.only != "tiny":
        from yarnlib.models import smollm2_dir

        smollm2 = str(smollm2_dir())
    todo = [r for r in rows(smollm2) if args.only in (None, r["name"]) and key(r) not in results]
    for row in tqdm(todo, desc="plan vs measured"):
        measured = measure_in_subprocess(row, nice=int(os.environ.get("PLAN_NICE", "0")))
        results[key(row)] = {**{k: v for k, v in row.items() if k != "model"}, **measured}
        results[key(row)].pop("model", None)
        write(results, args.out)
    write(results, args.out)
    print(table(results))


if __name__ == "__main__":
    main()
