"""`yarnlib config`: real save_pretrained folders rewritten on disk, read back by transformers
and by vLLM's config loader; idempotency, no compounding, exact reset, safety on bad input."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import ARCHS, tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from yarnlib.cli import main
from yarnlib.config import current_spec, show
from yarnlib.config.file_set import JOURNAL
from yarnlib.convert import MARKER, native_rope_parameters, to_hf
from yarnlib.hf_compat import hf_format
from yarnlib.spec import RopeScaling

ROTARY = {
    "llama": LlamaRotaryEmbedding,
    "qwen2": Qwen2RotaryEmbedding,
    "qwen3": Qwen3RotaryEmbedding,
}
THETA, HEAD_DIM, L = 50000.0, 16, 256  # tiny_models' settings
# the config.json forms the installed transformers reads (4.x ignores rope_parameters; there
# "v5" is what its save_pretrained writes, i.e. v4 keys)
FORMS = ("v5", "v4", "legacy") if hf_format() == "v5" else ("v4", "legacy")
METHOD_ARGS = {  # CLI flags -> the spec they must produce (L=256 taken from the folder)
    "yarn": (["--factor", "4"], {}),
    "yarn-knobs": (["--factor", "4", "--beta-fast", "16", "--mscale", "0.707"], {}),
    "linear": (["--method", "linear", "--factor", "4"], {}),
    "ntk": (["--method", "ntk", "--factor", "4"], {}),
    # vLLM >= 0.22 runs rope_type dynamic otherwise (refused; tests/test_vllm_versions.py)
    "dynamic_ntk": (["--method", "dynamic", "--factor", "4", "--vllm-version", "0.21.0"], {}),
    "ntk_by_parts": (["--method", "ntk-by-parts", "--factor", "4", "--no-truncate"], {}),
    "dynamic_yarn": (["--method", "dynamic_yarn", "--factor", "4"], {}),
}


def expected_spec(name: str) -> RopeScaling:
    method = name.removesuffix("-knobs")
    knobs = {"beta_fast": 16.0, "mscale": 0.707} if name == "yarn-knobs" else {}
    if method == "ntk_by_parts":
        knobs = {"truncate": False}
    return RopeScaling(method, 4.0, L, THETA, HEAD_DIM, **knobs)


def save_folder(path: Path, arch: str) -> None:
    model = tiny_model(arch)
    model.generation_config = GenerationConfig(max_length=100)
    model.save_pretrained(path)
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate("to be or not that is".split())}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", model_max_length=L
    )
    tokenizer.save_pretrained(path)


def to_form(path: Path, form: str) -> None:
    """Rewrite a transformers 5 config.json by hand in the v4 forms (unsorted, as vendors do)."""
    if form == "v5":
        return
    config = json.loads((path / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["rope_theta"] = THETA
    # Qwen's model cards: add a yarn block, leave max_position_embeddings as it was
    legacy = {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": L}
    config["rope_scaling"] = legacy if form == "legacy" else None
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    for arch in ARCHS:
        save_folder(root / arch, arch)
    return root


@pytest.fixture
def folder(saved, tmp_path):
    """A fresh copy of a saved folder: folder(arch, form, name)."""

    def make(arch: str = "qwen3", form: str = "v5", name: str = "") -> Path:
        path = tmp_path / (name or f"{arch}-{form}")
        shutil.copytree(saved / arch, path)
        to_form(path, form)
        return path

    return make


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root: symlink target or content hash, and mode."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_file():
            out[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode)
    return out


def config(path: Path, *args: str) -> int:
    return main(["config", str(path), *args])


def assert_runs(path: Path, spec: RopeScaling) -> None:
    """transformers builds the spec's rotary embedding from the folder, and the limits follow."""
    loaded = AutoConfig.from_pretrained(path)
    rotary = ROTARY[loaded.model_type](loaded)
    torch.testing.assert_close(rotary.inv_freq, spec.inv_freq(), rtol=0, atol=0)
    assert rotary.attention_scaling == pytest.approx(spec.attention_factor(), rel=1e-12)
    assert AutoTokenizer.from_pretrained(path).model_max_length == spec.max_position_embeddings
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["max_length"] == spec.max_position_embeddings


# -- transformers reads what was written ------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("form", FORMS)
def test_yarn_on_every_arch_and_form(folder, arch, form):
    path = folder(arch, form)
    assert config(path, "--factor", "4", "--in-place") == 0
    assert_runs(path, expected_spec("yarn"))
    written = json.loads((path / "config.json").read_text())
    assert written["max_position_embeddings"] == 4 * L
    if form == "v5":
        assert written["rope_parameters"]["rope_theta"] == THETA
    else:  # v4: rope_theta stays top-level; the legacy spelling `type` is kept
        assert written["rope_theta"] == THETA and "rope_parameters" not in written
        assert ("type" in written["rope_scaling"]) == (form == "legacy")


@pytest.mark.parametrize("method", METHOD_ARGS)
@pytest.mark.parametrize("form", ("v5", "v4") if hf_format() == "v5" else ("v4",))
def test_every_method(folder, method, form):
    path = folder("llama" if form == "v4" else "qwen3", form)
    assert config(path, *METHOD_ARGS[method][0], "--in-place") == 0
    spec = expected_spec(method)
    assert_runs(path, spec)
    assert current_spec(path) == spec


@pytest.mark.parametrize("fmt", ("v4", "v5") if hf_format() == "v5" else ("v4",))
def test_format_option_converts_and_reset_restores(folder, fmt):
    for form in ("v5", "legacy"):
        path = folder("qwen2", form)
        before = snapshot(path)
        assert config(path, "--factor", "4", "--format", fmt, "--in-place") == 0
        written = json.loads((path / "config.json").read_text())
        assert ("rope_parameters" in written) == (fmt == "v5")
        assert ("rope_scaling" in written) == (fmt == "v4")
        assert_runs(path, expected_spec("yarn"))
        assert config(path, "--reset", "--in-place") == 0
        after = snapshot(path)
        assert {k: v for k, v in after.items() if not k.endswith(".bak")} == before


@pytest.mark.skipif(hf_format() == "v4", reason="transformers 4 reads no rope_parameters block")
@pytest.mark.parametrize("fmt", ("auto", "v4"))
def test_partial_rotary_factor_inside_rope_parameters_is_kept(folder, capsys, fmt):
    path = folder("llama", "v5")
    data = json.loads((path / "config.json").read_text())
    data.pop("partial_rotary_factor", None)
    data["rope_parameters"]["partial_rotary_factor"] = 0.5
    (path / "config.json").write_text(json.dumps(data, indent=2))
    before = snapshot(path)
    assert config(path, "--factor", "4", "--format", fmt, "--in-place") == 0
    assert_runs(path, RopeScaling("yarn", 4, L, THETA, HEAD_DIM // 2))  # 8 of 16 dims rotate
    assert config(path, "--check") == 0
    assert config(path, "--reset", "--in-place") == 0
    assert {k: v for k, v in snapshot(path).items() if not k.endswith(".bak")} == before
    # what an older yarnlib wrote: the factor dropped, transformers rotating all 16 dims
    assert config(path, "--factor", "4", "--in-place") == 0
    data = json.loads((path / "config.json").read_text())
    del data["rope_parameters"]["partial_rotary_factor"]
    (path / "config.json").write_text(json.dumps(data, indent=2))
    capsys.readouterr()
    assert config(path, "--check") == 1
    assert "rotate 16 dims of each head, but before yarnlib rewrote" in capsys.readouterr().out


def test_disagreeing_v4_and_v5_blocks_are_reported(folder, capsys):
    path = folder("qwen2", "v5")
    data = json.loads((path / "config.json").read_text())
    # transformers 4 saves no rope_parameters: the block a transformers 5 save would hold
    data.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": THETA})
    data["rope_theta"] = 2 * THETA  # a v4 reader (transformers 4) takes this one
    (path / "config.json").write_text(json.dumps(data, indent=2))
    assert config(path, "--check") == 1
    out = capsys.readouterr().out
    assert f"rope_theta + rope_scaling say rope_type=default rope_theta={2 * THETA}" in out
    assert "transformers 5 and vLLM read rope_parameters, transformers 4 reads" in out
    data["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    (path / "config.json").write_text(json.dumps(data, indent=2))
    assert config(path, "--check") == 1
    assert "vLLM read rope_scaling (set, it wins)" in capsys.readouterr().out
    assert current_spec(path).describe().startswith("linear factor=2")
    data["rope_theta"] = THETA  # agreeing blocks are not reported
    data["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": THETA}
    (path / "config.json").write_text(json.dumps(data, indent=2))
    assert "two RoPE blocks" not in " ".join(show(path)["inconsistencies"])


def test_format_alone_keeps_the_settings(folder):
    path = folder("qwen3", "v5")
    assert config(path, "--format", "v4", "--in-place") == 0
    written = json.loads((path / "config.json").read_text())
    assert written["rope_theta"] == THETA and "rope_parameters" not in written
    assert current_spec(path) == RopeScaling("none", 1, L, THETA, HEAD_DIM)


# -- vLLM reads the same ----------------------------------------------------------------------

VLLM_PROBE = """
import json, sys
from vllm.config import ModelConfig
out = {}
for path in sys.argv[1:]:
    mc = ModelConfig(model=path, tokenizer=path, dtype="float32")
    out[path] = {"rope": dict(mc.hf_config.rope_parameters), "max_model_len": mc.max_model_len}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vllm_config_loader_reads_the_same(folder):
    cases = {}
    for method in ("yarn", "yarn-knobs", "linear", "ntk", "dynamic_ntk", "ntk_by_parts"):
        for arch, form in (("qwen3", "v5"), ("llama", "legacy")):
            path = folder(arch, form, f"{method}-{arch}")
            assert config(path, *METHOD_ARGS[method][0], "--in-place") == 0
            cases[str(path)] = expected_spec(method)
    untouched = folder("qwen2", "legacy")  # max_position_embeddings not raised by hand
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    run = subprocess.run(
        [sys.executable, "-c", VLLM_PROBE, *cases, str(untouched)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    read = json.loads(line.removeprefix("RESULT "))
    for path, spec in cases.items():
        for key, value in native_rope_parameters(spec).items():
            assert read[path]["rope"][key] == pytest.approx(value), (path, key)
        assert read[path]["max_model_len"] == spec.max_position_embeddings, path
        assert show(path)["vllm"]["max_model_len"] == read[path]["max_model_len"]
    # the show report predicts vLLM's length for the hand-edited file, and flags it
    report = show(untouched)
    assert report["vllm"]["max_model_len"] == read[str(untouched)]["max_model_len"] == L
    assert report["extended_context"] == 2 * L and report["inconsistencies"]


# -- idempotency, no compounding, exact reset ------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_idempotent_and_never_compounds(folder, form):
    path = folder("qwen2", form)
    assert config(path, "--factor", "4", "--in-place") == 0
    first = snapshot(path)
    assert config(path, "--factor", "4", "--in-place") == 0
    assert snapshot(path) == first
    # 4 then 8 gives the same bytes as 8 straight away; ntk's theta is raised from the unscaled one
    for flags in (["--factor", "8"], ["--method", "ntk", "--factor", "8"]):
        fresh = folder("qwen2", form, f"fresh-{flags[1]}")
        assert config(fresh, *flags, "--in-place") == 0
        assert config(path, *flags, "--in-place") == 0
        for name in ("config.json", "tokenizer_config.json", "generation_config.json"):
            assert (path / name).read_bytes() == (fresh / name).read_bytes()


def test_a_second_rewrite_keeps_the_original_the_user_gave(folder):
    """Qwen3-8B's config says 40960 while its original context is 32768: once scaled with the
    true original, a later --factor (no original given) rescales from it, as vllm-args and
    yarnlib.patch do, and --method none gives the native file's length back."""

    def with_longer_native(name: str) -> Path:
        path = folder("qwen3", "v4", name)
        config = json.loads((path / "config.json").read_text())
        config["max_position_embeddings"] = L + 64  # 320: the native file overstates L
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return path

    path = with_longer_native("scaled")
    flags = ("--original-max-position-embeddings", str(L), "--in-place")
    assert config(path, "--factor", "4", *flags) == 0
    assert current_spec(path) == RopeScaling("yarn", 4.0, L, THETA, HEAD_DIM)
    assert config(path, "--factor", "2", "--in-place") == 0
    assert current_spec(path) == RopeScaling("yarn", 2.0, L, THETA, HEAD_DIM)
    assert json.loads((path / "config.json").read_text())["max_position_embeddings"] == 2 * L
    fresh = with_longer_native("fresh")
    assert config(fresh, "--factor", "2", *flags) == 0
    assert (path / "config.json").read_bytes() == (fresh / "config.json").read_bytes()
    assert config(path, "--method", "none", "--in-place") == 0
    assert json.loads((path / "config.json").read_text())["max_position_embeddings"] == L + 64


def styled(path: Path, style: str) -> None:
    """Rewrite config.json in a formatting transformers would not produce."""
    config = json.loads((path / "config.json").read_text())
    if style == "tabs":
        text = json.dumps(config, indent="\t")
    elif style == "compact":
        text = json.dumps(config)
    elif style == "crlf":
        text = json.dumps(config, indent=2).replace("\n", "\r\n") + "\r\n"
    else:  # hand-written values: 1e6-like floats and a one-line rope block
        text = json.dumps(config, indent=4).replace('"rope_theta": 50000.0', '"rope_theta": 5e4')
    (path / "config.json").write_text(text)


@pytest.mark.parametrize("style", ("tabs", "compact", "crlf", "hand"))
@pytest.mark.parametrize("form", ("v5", "v4"))
def test_style_is_kept_and_reset_is_byte_exact(folder, style, form):
    path = folder("llama", form)
    styled(path, style)
    original = snapshot(path)
    before = json.loads((path / "config.json").read_text())
    for flags in (["--factor", "4"], ["--method", "ntk", "--factor", "2", "--format", "v5"]):
        assert config(path, *flags, "--in-place") == 0
        text = (path / "config.json").read_bytes().decode()
        after = json.loads(text)
        assert [k for k in after if k in before] == [k for k in before if k in after]
        touched = {"rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings"}
        assert {k: v for k, v in before.items() if k not in touched} == {
            k: v for k, v in after.items() if k in before and k not in touched
        }
        if style == "tabs":
            assert '\n\t"max_position_embeddings"' in text and "\n  " not in text
        if style == "compact":
            assert "\n" not in text
        if style == "crlf":
            assert text.count("\n") == text.count("\r\n")
    assert config(path, "--reset", "--in-place") == 0
    assert {k: v for k, v in snapshot(path).items() if not k.endswith(".bak")} == original
    # the first change left a .bak of each file it changed
    assert (path / "config.json.bak").read_bytes() == (path / "config.json").read_bytes()


def test_reset_keeps_unrelated_edits(folder):
    path = folder("qwen3", "v5")
    original = (path / "config.json").read_text()
    assert config(path, "--factor", "4", "--in-place") == 0
    edited = (path / "config.json").read_text().replace('"use_cache": true', '"use_cache": false')
    (path / "config.json").write_text(edited)
    assert config(path, "--reset", "--in-place") == 0
    assert (path / "config.json").read_text() == original.replace(
        '"use_cache": true', '"use_cache": false'
    )


def test_hand_edited_rope_keys_are_not_overwritten_by_reset(folder, capsys):
    path = folder("qwen3", "v5")
    assert config(path, "--factor", "4", "--in-place") == 0
    text = (path / "config.json").read_text().replace('"factor": 4.0', '"factor": 3.0', 1)
    (path / "config.json").write_text(text)
    before = snapshot(path)
    assert config(path, "--reset", "--in-place") == 2
    assert "edited after yarnlib wrote them" in capsys.readouterr().err
    assert snapshot(path) == before


def test_marker_without_record_resets_the_settings(folder):
    """A config saved after yarnlib.patch carries the marker but no record of the files."""
    path = folder("llama", "v4")
    config_path = path / "config.json"
    data = json.loads(config_path.read_text())
    data.update(to_hf(RopeScaling("ntk", 4, L, THETA, HEAD_DIM), "v4"))
    config_path.write_text(json.dumps(data, indent=2))
    assert config(path, "--factor", "2", "--in-place") == 0  # from the unscaled theta
    assert_runs_partial = AutoConfig.from_pretrained(path)
    rotary = LlamaRotaryEmbedding(assert_runs_partial)
    spec = RopeScaling("yarn", 2, L, THETA, HEAD_DIM)
    torch.testing.assert_close(rotary.inv_freq, spec.inv_freq(), rtol=0, atol=0)
    assert config(path, "--reset", "--in-place") == 0
    reset = json.loads(config_path.read_text())
    assert MARKER not in reset and reset["rope_theta"] == THETA and reset["rope_scaling"] is None
    assert reset["max_position_embeddings"] == L


def test_generation_max_length_is_only_raised(folder):
    path = folder("qwen3", "v5")
    (path / "generation_config.json").write_text(json.dumps({"max_length": 100000}, indent=2))
    assert config(path, "--factor", "4", "--in-place") == 0
    assert json.loads((path / "generation_config.json").read_text())["max_length"] == 100000
    assert not (path / "generation_config.json.bak").exists()


# -- safety -----------------------------------------------------------------------------------


def test_dry_run_writes_nothing(folder, capsys):
    path = folder("qwen3", "v5")
    before = snapshot(path)
    assert config(path, "--factor", "4", "--dry-run") == 0
    out = capsys.readouterr().out
    assert '+  "max_position_embeddings": 1024,' in out and "+++ b/tokenizer_config.json" in out
    assert snapshot(path) == before


def fake_hf_cache(root: Path, source: Path) -> tuple[Path, Path, Path]:
    """models--org--name/{blobs/<sha>, snapshots/<rev>/<file> -> ../../blobs/<sha>}, two revs."""
    repo = root / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    revisions = [repo / "snapshots" / rev for rev in ("rev1", "rev2")]
    for rev in revisions:
        rev.mkdir(parents=True)
    for file in source.iterdir():
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / digest)
        for rev in revisions:
            (rev / file.name).symlink_to(Path("../../blobs") / digest)
    return repo, revisions[0], revisions[1]


def killed_at(path: Path, args: list[str], step: int) -> bool:
    """Run ``yarnlib config PATH ARGS`` in a forked child that SIGKILLs itself at its step-th
    rename or journal removal; True if it got that far."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            steps = itertools.count(1)
            rename, unlink = os.replace, os.unlink

            def step_then(function, *call):
                if next(steps) == step:
                    os.kill(os.getpid(), signal.SIGKILL)
                return function(*call)

            os.replace = lambda *call: step_then(rename, *call)
            os.unlink = lambda name: (
                step_then(unlink, name) if Path(name).name == JOURNAL else unlink(name)
            )
            main(["config", str(path), *args])
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


@pytest.mark.parametrize("args", (["--factor", "4"], ["--reset"]), ids=("scale", "reset"))
def test_a_kill_between_renames_is_completed_by_rerunning(folder, tmp_path, capsys, args):
    start = folder("qwen3", "v5", "start")
    if args == ["--reset"]:
        assert config(start, "--factor", "4", "--in-place") == 0
    uninterrupted = tmp_path / "uninterrupted"
    shutil.copytree(start, uninterrupted)
    assert config(uninterrupted, *args, "--in-place") == 0
    expected = snapshot(uninterrupted)
    journals = 0
    for step in itertools.count(1):
        path = tmp_path / f"killed-at-{step}"
        shutil.copytree(start, path)
        if not killed_at(path, [*args, "--in-place"], step):
            break
        capsys.readouterr()
        if (path / JOURNAL).exists():  # half old, half new: readers refuse it
            journals += 1
            assert config(path) == 2 and "was interrupted" in capsys.readouterr().err
        assert config(path, *args, "--in-place") == 0
        assert snapshot(path) == expected, f"killed at step {step}"
    # every rename (journal, a .bak and the new text of each of 3 files) and the journal removal
    assert (step, journals) == ((9, 7) if args == ["--factor", "4"] else (6, 4))


def test_a_file_edited_after_a_kill_is_not_overwritten(folder, capsys):
    path = folder("qwen3", "v5")
    # renamed: the journal, config.json.bak, config.json, tokenizer_config.json.bak
    assert killed_at(path, ["--factor", "4", "--in-place"], 5)
    (path / "tokenizer_config.json").write_text('{"model_max_length": 7}')
    before = {k: v for k, v in snapshot(path).items() if not k.endswith(".tmp")}
    assert config(path, "--factor", "4", "--in-place") == 2
    assert "tokenizer_config.json changed after the rewrite" in capsys.readouterr().err
    assert snapshot(path) == before  # only the killed run's temporary files are gone


def test_hf_cache_symlinks_are_replaced_not_written_through(folder, tmp_path):
    repo, rev1, rev2 = fake_hf_cache(tmp_path / "hub", folder("qwen3", "v5"))
    blobs, other = snapshot(repo / "blobs"), snapshot(rev2)
    assert config(rev1, "--factor", "4", "--in-place") == 0
    assert snapshot(repo / "blobs") == blobs and snapshot(rev2) == other
    for name in ("config.json", "tokenizer_config.json", "generation_config.json"):
        assert not (rev1 / name).is_symlink() and (rev1 / name).is_file()
        assert not (rev1 / (name + ".bak")).is_symlink()
    assert (rev1 / "model.safetensors").is_symlink() and (rev1 / "tokenizer.json").is_symlink()
    assert_runs(rev1, expected_spec("yarn"))
    assert config(rev1, "--reset", "--in-place") == 0
    assert (rev1 / "config.json").read_bytes() == (rev2 / "config.json").read_bytes()


@pytest.mark.parametrize("weights", ("symlink", "copy"))
def test_output_folder(folder, tmp_path, weights):
    repo, rev1, _ = fake_hf_cache(tmp_path / "hub", folder("qwen2", "v4"))
    before = snapshot(repo)
    out = tmp_path / "out" / "extended"
    assert config(rev1, "--factor", "4", "--output", str(out), "--weights", weights) == 0
    assert snapshot(repo) == before
    weight = out / "model.safetensors"
    assert weight.is_symlink() == (weights == "symlink")
    assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE(rev1.stat().st_mode)
    assert weight.read_bytes() == (rev1 / "model.safetensors").read_bytes()
    assert not (out / "tokenizer.json").is_symlink() and not list(out.glob("*.bak"))
    assert_runs(out, expected_spec("yarn"))
    # the output carries the record: reset there gives back the source's exact bytes
    assert config(out, "--reset", "--in-place") == 0
    assert (out / "config.json").read_bytes() == (rev1 / "config.json").read_bytes()
    assert config(rev1, "--factor", "4", "--output", str(out)) == 2  # exists, not empty
    assert snapshot(repo) == before


def bad_inputs(path: Path) -> dict[str, tuple[list[str], str]]:
    return {
        "unknown method": (["--method", "rope2", "--factor", "4", "--in-place"], "rope2"),
        "factor below 1": (["--factor", "0.5", "--in-place"], "factor must be >= 1"),
        "factor too large": (["--factor", "1e300", "--in-place"], "factor must be <= 1024"),
        "empty method": (["--method", "", "--factor", "4", "--in-place"], "method: unknown"),
        "none with factor": (["--method", "none", "--factor", "4", "--in-place"], "factor"),
        "no destination": (["--factor", "4"], "--in-place"),
        "reset and factor": (["--reset", "--factor", "4", "--in-place"], "--reset"),
        "show and change": (["--check", "--factor", "4"], "--show"),
        "bad knob": (
            ["--method", "linear", "--factor", "4", "--beta-fast", "8", "--in-place"],
            "beta_fast",
        ),
        "output inside": (["--factor", "4", "--output", str(path / "sub")], "inside"),
    }


def test_bad_options_exit_2_and_touch_nothing(folder, capsys):
    path = folder("qwen3", "v5")
    before = snapshot(path)
    for name, (args, message) in bad_inputs(path).items():
        assert config(path, *args) == 2, name
        assert message in capsys.readouterr().err, name
        assert snapshot(path) == before, name


@pytest.mark.parametrize(
    "damage, message",
    [
        ("missing folder", "is not a folder"),
        ("no config", "no config.json"),
        ("malformed config", "config.json: malformed JSON at line 5"),
        ("malformed tokenizer config", "tokenizer_config.json: malformed JSON at line 3"),
        ("no rope", "has no rotary embedding"),
        ("read-only folder", "read-only"),
    ],
)
def test_bad_folders_exit_2_and_touch_nothing(folder, tmp_path, capsys, damage, message):
    path = folder("qwen3", "v5")
    if damage == "missing folder":
        path = tmp_path / "nope"
    elif damage == "no config":
        (path / "config.json").unlink()
    elif damage.startswith("malformed"):
        name = "config.json" if damage == "malformed config" else "tokenizer_config.json"
        lines = (path / name).read_text().splitlines()
        lines[4 if name == "config.json" else 2] += " oops"
        (path / name).write_text("\n".join(lines))
    elif damage == "no rope":
        gpt2 = {"model_type": "gpt2", "n_positions": 1024, "n_embd": 64, "n_head": 4}
        (path / "config.json").write_text(json.dumps(gpt2, indent=2))
    before = snapshot(path) if path.exists() else None
    mode = path.stat().st_mode if path.exists() else None
    if damage == "read-only folder":
        path.chmod(0o555)
    try:
        assert config(path, "--factor", "4", "--in-place") == 2
        assert message in capsys.readouterr().err
        if damage != "read-only folder":
            assert config(path) == 2  # --show fails the same way
            assert message in capsys.readouterr().err
    finally:
        if mode is not None:
            path.chmod(stat.S_IMODE(mode))
    assert (snapshot(path) if path.exists() else None) == before


# -- show -------------------------------------------------------------------------------------


def test_show_and_check(folder, capsys):
    path = folder("qwen2", "legacy")  # yarn factor 2 but max_position_embeddings left at L
    assert config(path, "--check") == 1
    out = capsys.readouterr().out
    assert "vLLM derives max_model_len=256" in out and "scaled for 512 tokens" in out
    assert config(path, "--factor", "4", "--in-place") == 0
    capsys.readouterr()
    assert config(path, "--check", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["spec"]["method"] == "yarn" and report["spec"]["factor"] == 4.0
    assert report["native_context"] == L and report["extended_context"] == 4 * L
    assert report["vllm"]["max_model_len"] == 4 * L
    assert report["tokenizer_model_max_length"] == 4 * L
    assert report["restorable_exactly"] and report["inconsistencies"] == []


def test_show_flags(folder):
    path = folder("llama", "v4")
    config_path = path / "config.json"
    data = json.loads(config_path.read_text())
    # linear: vLLM (and yarnlib) read max_position_embeddings as the original length
    data.update(rope_scaling={"type": "linear", "factor": 4.0}, max_position_embeddings=4 * L)
    config_path.write_text(json.dumps(data))
    report = show(path)
    assert report["vllm"]["max_model_len"] == report["extended_context"] == 16 * L
    problems = " ".join(report["inconsistencies"])
    assert "model_max_length=256" in problems and "max_length=100 is below" in problems
    data.update(rope_scaling={"type": "dynamic", "factor": 4.0}, max_position_embeddings=L)
    del data["rope_theta"]
    config_path.write_text(json.dumps(data))
    problems = " ".join(show(path, "0.21.0")["inconsistencies"])
    assert "static NTK fixed at 1024 tokens" in problems and "no rope_theta" in problems
    problems = " ".join(show(path, "0.22.0")["inconsistencies"])
    assert "as plain RoPE" in problems and "table of 256 positions" in problems


@pytest.mark.skipif(hf_format() == "v5", reason="transformers 5.x reads rope_parameters")
def test_show_flags_v5_keys_that_transformers_4_ignores(folder):
    path = folder("llama", "v4")
    assert config(path, "--factor", "4", "--format", "v5", "--in-place") == 0
    problems = " ".join(show(path)["inconsistencies"])
    assert "ignores rope_parameters" in problems and "rope_theta 10000" in problems
    loaded = AutoConfig.from_pretrained(path)  # what that problem says: default rope, 1e4
    assert torch.equal(
        LlamaRotaryEmbedding(loaded).inv_freq, RopeScaling("none", 1, L, 1e4, HEAD_DIM).inv_freq()
    )
    assert config(path, "--format", "v4", "--in-place") == 0
    assert show(path)["inconsistencies"] == []
    assert_runs(path, expected_spec("yarn"))


def test_file_without_rope_keys_gets_v4_with_explicit_theta(folder):
    path = folder("llama", "v4")
    data = json.loads((path / "config.json").read_text())
    del data["rope_theta"], data["rope_scaling"]  # transformers then uses 10000
    (path / "config.json").write_text(json.dumps(data, indent=2))
    assert config(path, "--factor", "4", "--in-place") == 0
    written = json.loads((path / "config.json").read_text())
    assert written["rope_theta"] == 10000.0 and written["rope_scaling"]["rope_type"] == "yarn"
    assert_runs(path, RopeScaling("yarn", 4, L, 10000.0, HEAD_DIM))


def test_damaged_record_exits_2(folder, capsys):
    path = folder("qwen3", "v5")
    assert config(path, "--factor", "4", "--in-place") == 0
    data = json.loads((path / "config.json").read_text())
    data["yarnlib_native"]["config.json"] = "oops"
    (path / "config.json").write_text(json.dumps(data, indent=2))
    before = snapshot(path)
    assert config(path, "--reset", "--in-place") == 2
    assert "is damaged" in capsys.readouterr().err
    assert snapshot(path) == before


def test_unknown_key_in_the_marker_is_one_line_and_exit_2(folder, capsys):
    path = folder("qwen3", "v5")
    assert config(path, "--factor", "4", "--in-place") == 0
    data = json.loads((path / "config.json").read_text())
    data[MARKER]["fctor"] = 8
    (path / "config.json").write_text(json.dumps(data, indent=2))
    capsys.readouterr()
    for command in (
        ["config", str(path)],
        ["inspect", str(path)],
        ["vllm-args", str(path), "--factor", "2"],
    ):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{MARKER}: unknown key 'fctor'" in err, command


def test_show_rope_types_yarnlib_does_not_know(folder):
    path = folder("llama", "v4")
    data = json.loads((path / "config.json").read_text())
    data["rope_scaling"] = {"rope_type": "proportional"}
    (path / "config.json").write_text(json.dumps(data, indent=2))
    report = show(path)
    assert report["spec"] is None and report["vllm"]["max_model_len"] == L
    assert ["proportional" in p for p in report["inconsistencies"]] == [True]
    before = snapshot(path)
    assert config(path, "--factor", "2", "--in-place") == 2
    assert snapshot(path) == before
