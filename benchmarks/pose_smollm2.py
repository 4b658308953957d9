"""Issue 28: SmolLM2-135M (8k) to 32k (and 64k) with YaRN and PoSE, trained on 2k-token rows on CPU.

1. train: ``yarnlib finetune --pose --target-length 32768 --seq-len 2048`` with LoRA (q, k, v, o)
   on the packaged plays that are not held out (benchmarks/tune_smollm2.py
   HELD_OUT); checkpoints hold the adapter and its optimizer state only (22 MB, kept out of
   git: .gitignore), and rerunning the same command on the same machine continues the run;
2. OUT/adapter/ (peft adapter, kept in git) and OUT/spec.json (the RoPE scaling it was trained
   under); OUT/train/model (merged, not in git) is rebuilt from them when missing;
3. perplexity at 2k/8k/32k on the held-out plays of the PoSE model, the same
   scaling untrained (``yarn:4``) and the native model (2k and 8k);
4. passkey at 16k/32k with independent prompts (30 per length: own offset in the classic
   filler, depth and key; Wilson 95 % intervals) of the PoSE model; ``yarn:4``'s, the same
   prompts, come from issue 29's run (benchmarks/passkey_smollm2.sh). The classic
   filler, not the plays: SmolLM2-135M unscaled at 2k, inside its own window, finds 9/9 keys
   in the classic filler and 3/9 in the plays (benchmarks/results/passkey_haystack_smollm2),
   so a play haystack would measure the small model's reading, not the context length. One
   prompt per invocation, the rows taking turns over the depth bins, the target length first;
5. OUT/results.json and OUT/table.md.

Every part resumes: rerun the command and finished steps and cells are read from disk.
Precision: training and perplexity in float32 (``FULL["dtype"]``), passkey in bfloat16
(``FULL["passkey_dtype"]``, generation as a GPU serves it; angles stay float32). bfloat16 runs
~3× faster than float32 on CPUs with AMX (a SmolLM2 16k forward on one Xeon core: 78 s) and
~8× slower on CPUs without bf16 units (an AMD EPYC in one session,
``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` False): the passkey part refuses to start
there. The precision is part of each cell's settings, so a row never mixes the two.
``--parts control`` (not in the default parts): the same LoRA run without scaling or PoSE into
OUT/control, its perplexity at 2k/8k (OUT/ppl-control): how much of the trained model's gain
inside the original window comes from the plays rather than from the scaling.
``--target 65536``: the same at ×8 into OUT_64k, in bfloat16 throughout (``EIGHT``), both
rows' passkey at 32k and 64k measured here (a CPU with AMX: ~15–20 min a 64k prompt on one core).
``--smoke`` runs the same pipeline at a pretended original context of 256 (target 1024) in a
few minutes (its numbers mean nothing).

    nice -n 10 .venv/bin/python benchmarks/pose_smollm2.py
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import torch
from tune_smollm2 import HELD_OUT  # benchmarks/, beside this script

from yarnlib.cli import main as yarnlib_main
from yarnlib.documents import DEFAULT_DATASET
from yarnlib.eval.passkey import by_length
from yarnlib.eval.stats import percent_interval
from yarnlib.finetune import checkpoint
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import read_spec_file, write_json, write_spec_file

PARTS = ("train", "ppl", "passkey", "control")
FULL = {
    "original": None,  # SmolLM2's 8192
    "target": 32768,
    "window": 2048,
    "chunks": 2,
    "steps": 120,
    "grad_accum": 1,
    "lr": 2e-4,
    "warmup": 5,
    "lora_rank": 16,
    "save_every": 1,
    "ppl_lengths": "2048,8192,32768",
    "native_lengths": "2048,8192",
    "samples": 3,
    "passkey_lengths": "16384,32768",
    "trials": 30,
    "dtype": "float32",  # training and perplexity; see the module doc
    "passkey_dtype": "bfloat16",  # generation as served; see the module doc
    "ppl_documents": "plays",  # the held-out plays, one sample each
    # the untrained row's passkey: issue 29's run of the same prompts (passkey_smollm2.sh)
    "untrained_passkey": "benchmarks/results/tune_smollm2/passkey-independent",
}
# 8x (64k): bfloat16 throughout (training under autocast, perplexity, passkey), since a 64k
# float32 forward is hours on a CPU core; every row of its table is measured here, in bfloat16.
EIGHT = {
    **FULL,
    "target": 65536,
    "ppl_lengths": "2048,8192,32768,65536",  # one forward per sample gives every length
    "passkey_lengths": "32768,65536",
    "dtype": "bfloat16",
    "untrained_passkey": None,
    # no held-out play is 64k tokens long (44k-52k): each sample is a play followed by the next
    "ppl_documents": "pairs",
}
SMOKE = {
    **FULL,
    "original": 256,
    "target": 1024,
    "window": 128,
    "steps": 2,
    "warmup": 0,
    "ppl_lengths": "256,1024",
    "native_lengths": "256",
    "samples": 1,
    "passkey_lengths": "1024",
    "untrained_passkey": None,
    "trials": 3,  # one per depth bin
}


def yarnlib(*argv: str) -> None:
    code = yarnlib_main(list(argv))
    if code:
        raise SystemExit(f"yarnlib {' '.join(argv)}: exit {code}")


def train_argv(args, plan: dict, data: Path, train_dir: Path, control: bool = False) -> list[str]:
    """The PoSE run; ``control``: the same LoRA run on the same rows without scaling or PoSE."""
    plays = sorted(p for p in data.glob("*.txt") if p.stem not in HELD_OUT)
    scaling = ["--method", "none"] if control else [
        "--method", "yarn", "--pose", "--target-length", str(plan["target"]),
        "--pose-chunks", str(plan["chunks"]),
    ]  # fmt: skip
    argv = [
        "finetune", "--model", args.model, *scaling, "--seq-len", str(plan["window"]),
        "--dataset", *map(str, plays),
        "--lora", "--lora-rank", str(plan["lora_rank"]), "--mixed-precision",
        "bf16" if plan["dtype"] == "bfloat16" else "no",
        "--steps", str(plan["steps"]), "--grad-accum", str(plan["grad_accum"]),
        "--lr", str(plan["lr"]), "--warmup-steps", str(plan["warmup"]),
        "--save-every", str(plan["save_every"]), "--keep-checkpoints", "1",
        "--report-to", "none", "--output", str(train_dir),
    ]  # fmt: skip
    if plan["original"]:
        argv += ["--original-max-position-embeddings", str(plan["original"])]
    if args.stop_after:
        argv += ["--stop-after", str(args.stop_after)]
    if checkpoint.completed(train_dir):
        argv += ["--resume", "latest"]
    elif train_dir.exists():
        argv += ["--overwrite"]  # a run that never reached its first checkpoint
    return argv


def train(args, plan: dict, data: Path, output: Path, control: bool = False) -> Path | None:
    """The merged model folder, or None while the run is unfinished."""
    train_dir = output / "train"
    adapter, spec_path = output / "adapter", output / "spec.json"
    if not (adapter / "adapter_model.safetensors").is_file():
        argv = train_argv(args, plan, data, train_dir, control)
        if args.stop_after and checkpoint.completed(train_dir):
            done = int(checkpoint.completed(train_dir)[-1].name.split("-")[1])
            if done >= args.stop_after:
                return None
        yarnlib(*argv)
        if not (train_dir / "model").is_dir():
            return None
        config = json.loads((train_dir / "model" / "config.json").read_text())
        write_spec_file(
            spec_path, RopeScaling.from_hf(config), trained_by="benchmarks/pose_smollm2.py"
        )
        shutil.copytree(train_dir / "adapter", adapter, dirs_exist_ok=True)
    return merged(args, adapter, spec_path, train_dir / "model")


def merged(args, adapter: Path, spec_path: Path, folder: Path) -> Path:
    """The base model patched with the spec, plus the adapter, merged (rebuilt if missing)."""
    if (folder / "model.safetensors").is_file():
        return folder
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import yarnlib as yl
    from yarnlib.models import resolve

    spec = read_spec_file(spec_path)
    base = AutoModelForCausalLM.from_pretrained(resolve(args.model), dtype=torch.float32)
    if spec.method != "none":  # the control run trains the model unscaled
        original = spec.original_max_position_embeddings
        yl.patch(base, method=spec.method, factor=spec.factor,
                 original_max_position_embeddings=original)  # fmt: skip
    model = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    AutoTokenizer.from_pretrained(resolve(args.model)).save_pretrained(staging)
    staging.rename(folder)
    return folder


def rows(args, plan: dict, model: Path, lengths: str) -> list[tuple[str, str, str, str]]:
    """(key, model, methods, lengths): the PoSE model as saved, the same scaling untrained, and
    the native model (smoke: the PoSE model only; its pretended original is in no config)."""
    factor = plan["target"] / (plan["original"] or 8192)
    found = [("pose", str(model), "none", plan[lengths])]
    if not plan["original"]:
        found.append(("base", args.model, f"yarn:{factor:g}", plan[lengths]))
    return found


def held_out_pairs(data: Path, folder: Path) -> list[str]:
    """Each held-out play followed by the next (cyclically), one file each: samples longer than
    any play whose first 2k/8k tokens are the plays' own (the 32k table's short samples)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, play in enumerate(HELD_OUT):
        after = HELD_OUT[(i + 1) % len(HELD_OUT)]
        path = folder / f"{i}_{play}+{after}.txt"
        text = (data / f"{play}.txt").read_text() + "\n\n" + (data / f"{after}.txt").read_text()
        if not path.is_file() or path.read_text() != text:
            partial = path.with_suffix(".partial")
            partial.write_text(text)
            partial.replace(path)
        paths.append(str(path))
    return paths


def perplexity(args, plan: dict, data: Path, output: Path, model: Path) -> None:
    if plan["ppl_documents"] == "pairs":
        held_out = held_out_pairs(data, output / "held-out-pairs")
    else:
        held_out = [str(data / f"{p}.txt") for p in HELD_OUT]
    runs = rows(args, plan, model, "ppl_lengths")
    if not plan["original"]:
        runs.append(("native", args.model, "none", plan["native_lengths"]))
    for key, name, methods, lengths in runs:
        yarnlib(
            "eval", "perplexity", "--model", name, "--methods", methods, "--lengths", lengths,
            "--dataset", *held_out, "--samples", str(plan["samples"]), "--dtype", plan["dtype"],
            "--output", str(output / f"ppl-{key}"), "--resume",
        )  # fmt: skip


def control(args, plan: dict, data: Path, output: Path) -> None:
    """How much of PoSE's gain inside the original window is the plays rather than the scaling:
    the same LoRA run on the same rows, unscaled, its perplexity at the native lengths."""
    model = train(args, plan, data, output / "control", control=True)
    if model is None:
        print("control training unfinished: rerun the same command to continue")
        return
    yarnlib(
        "eval", "perplexity", "--model", str(model), "--methods", "none",
        "--lengths", plan["native_lengths"],
        "--dataset", *(str(data / f"{p}.txt") for p in HELD_OUT),
        "--samples", str(plan["samples"]), "--dtype", plan["dtype"],
        "--output", str(output / "ppl-control"), "--resume",
    )  # fmt: skip


def require_bf16_units(part: str, dtype: str) -> None:
    on_cpu = not torch.cuda.is_available()  # yarnlib eval runs on CUDA where there is one
    if dtype == "bfloat16" and on_cpu and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise SystemExit(
            f"{part}: bfloat16 on a CPU without AMX or avx512_bf16 runs ~45x slower than float32 "
            "(see the module doc); run this part on a CPU that has them"
        )


def passkey(args, plan: dict, output: Path, model: Path) -> None:
    """The PoSE model's prompts; the untrained row's too unless plan["untrained_passkey"] names
    issue 29's run of the same prompts (benchmarks/passkey_smollm2.sh: the same seed, trials,
    filler and precision), which is read instead of computed twice."""
    dtype = plan["passkey_dtype"]
    require_bf16_units("passkey", dtype)
    runs = rows(args, plan, model, "passkey_lengths")
    runs = runs[:1] if plan["untrained_passkey"] else runs
    # On a CPU one prompt per invocation, the rows taking turns and the depth bin with the
    # fewest finished prompts first (--max-trials 1), the target length first: a run cut short
    # after a few 64k prompts still compares the rows evenly over depths. On a GPU a row's
    # length takes seconds: one invocation each (a model load per prompt would dominate).
    one_at_a_time = not torch.cuda.is_available()
    for length in sorted(plan["passkey_lengths"].split(","), key=int, reverse=True):
        for _ in range(plan["trials"] if one_at_a_time else 1):
            for key, name, methods, _lengths in runs:
                yarnlib(
                    "eval", "passkey", "--model", name, "--methods", methods, "--lengths", length,
                    "--trials", str(plan["trials"]), "--haystack", "classic", "--dtype", dtype,
                    "--output", str(output / f"passkey-{key}"), "--resume",
                    *(["--max-trials", "1"] if one_at_a_time else []),
                )  # fmt: skip


def cells(folder: Path, kind: str) -> list[dict]:
    path = folder / f"{kind}.json"
    return json.loads(path.read_text())["cells"] if path.is_file() else []


def table(args, output: Path, plan: dict) -> dict:
    """Rows: PoSE-trained, untrained yarn, native; perplexity per length, passkey per length
    with its interval."""
    factor = plan["target"] / (plan["original"] or 8192)
    names = {"pose (trained)": "pose", f"yarn:{factor:g} (untrained)": "base", "native": "native",
             "LoRA without scaling (control)": "control"}  # fmt: skip
    result = {}
    for name, key in names.items():
        ppl = {c["length"]: math.exp(c["nll"]) for c in cells(output / f"ppl-{key}", "perplexity")}
        found = cells(output / f"passkey-{key}", "passkey")
        if key == "base" and plan["untrained_passkey"]:
            # that folder's passkey.json names the rows of its last run: ask for this one
            folder = Path(plan["untrained_passkey"])
            yarnlib(
                "eval", "passkey", "--model", args.model, "--methods", f"yarn:{factor:g}",
                "--lengths", plan["passkey_lengths"], "--trials", str(plan["trials"]),
                "--haystack", "classic", "--dtype", plan["passkey_dtype"],
                "--output", str(folder), "--report",
            )  # fmt: skip
            found = cells(folder, "passkey")
        pooled = by_length(found)
        result[name] = {"perplexity": ppl, "passkey": {r["length"]: r for r in pooled}}
    return result


def markdown(found: dict, plan: dict) -> str:
    ppl_lengths = [int(n) for n in plan["ppl_lengths"].split(",")]
    key_lengths = [int(n) for n in plan["passkey_lengths"].split(",")]
    head = ["model", *(f"ppl {n}" for n in ppl_lengths), *(f"passkey {n}" for n in key_lengths)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in found.items():
        ppl = [
            f"{row['perplexity'][n]:.2f}" if n in row["perplexity"] else "-" for n in ppl_lengths
        ]
        keys = []
        for n in key_lengths:
            r = row["passkey"].get(n)
            keys.append("-" if r is None else f"{percent_interval(r)} (n={r['trials']})")
        lines.append("| " + " | ".join([name, *ppl, *keys]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=int, choices=(32768, 65536), default=32768,
                   help="yarn x4 (the first run) or x8, bfloat16 throughout")  # fmt: skip
    p.add_argument("--output", help="default benchmarks/results/pose_smollm2[_64k]")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--data", default=str(DEFAULT_DATASET))
    p.add_argument("--parts", default="train,ppl,passkey", help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--stop-after", type=int, help="end this session's training at step N")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="the pipeline at L=256, N=1024")
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    if not set(parts) <= set(PARTS):
        raise SystemExit(f"parts: {args.parts!r}; allowed: {', '.join(PARTS)}")
    torch.set_num_threads(args.threads)
    plan = dict(SMOKE if args.smoke else EIGHT if args.target == 65536 else FULL)
    require_bf16_units("plan", plan["dtype"])
    suffix = "_64k" if args.target == 65536 else ""
    output = Path(args.output or f"benchmarks/results/pose_smollm2{suffix}")
    data = Path(args.data)
    output.mkdir(parents=True, exist_ok=True)
    if "control" in parts:
        control(args, plan, data, output)
    model = train(args, plan, data, output) if "train" in parts else None
    if model is None and (output / "adapter").is_dir():
        model = merged(args, output / "adapter", output / "spec.json", output / "train" / "model")
    if model is None:
        print("training unfinished: rerun the same command to continue")
        return
    if "ppl" in parts:
        perplexity(args, plan, data, output, model)
    if "passkey" in parts:
        passkey(args, plan, output, model)
    found = table(args, output, plan)
    write_json(output / "results.json", {"plan": plan, "smoke": args.smoke, "rows": found})
    text = markdown(found, plan)
    (output / "table.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
