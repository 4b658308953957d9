"""Real-world config shapes (issue 26 A/D): Qwen2.5-VL's M-RoPE as transformers 4.5x re-saves
it, a top-level original_max_position_embeddings, a YaRN the checkpoint ships (mscale knobs,
DeepSeek-V3's qk_rope_head_dim), float lengths, multimodal configs with the rope under
text_config. Each shape is written by the test and read back by the installed transformers;
every command must keep it exactly or refuse it by name, never rewrite it into another RoPE."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import hand_written_rope, tiny_model
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import yarnlib
from yarnlib import RopeScaling
from yarnlib.cli import main
from yarnlib.config import show
from yarnlib.hf_compat import hf_format

THETA, HEAD_DIM, L = 50000.0, 16, 256  # tiny_models' settings


def files(path: Path) -> dict[str, str]:
    """Each file's hash (config --in-place's empty lock file left out)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.iterdir())
        if p.name != ".yarnlib.lock"
    }


def edit_config(path: Path, **keys) -> None:
    data = json.loads((path / "config.json").read_text())
    for key, value in keys.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (path / "config.json").write_text(json.dumps(data, indent=2) + "\n")


def rope_dict(params: dict) -> dict:
    """config.json keys for hand-written rope settings, as the installed transformers reads them."""
    keys = hand_written_rope(params)
    return {"rope_parameters": None, "rope_scaling": None, "rope_theta": None, **keys}


@pytest.fixture
def llama(tmp_path):
    path = tmp_path / "llama"
    tiny_model("llama").save_pretrained(path)
    return path


def runs(path: Path):
    """(inv_freq, attention factor) of the yarn the installed transformers builds from the
    folder: its own rope function, with its own reading of the config."""
    return ROPE_INIT_FUNCTIONS["yarn"](AutoConfig.from_pretrained(path), None)


def one_line_exit_2(capsys, argv, *needles):
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# -- 1. M-RoPE (Qwen2.5-VL as transformers 4.5x re-saves it) ---------------------------------


def qwen25_vl_config(path: Path) -> None:
    """Qwen2.5-VL-7B's config.json shape after a transformers 4.5x save: the text settings at
    the top level, rope_scaling with both type spellings and mrope_section (sum = head_dim/2)."""
    path.mkdir()
    config = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 1024,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "default", "rope_type": "default", "mrope_section": [2, 3, 3]},
        "vision_config": {"depth": 1, "hidden_size": 32, "out_hidden_size": 64, "num_heads": 2},
    }
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def found(value, key):
    """``key``'s value anywhere in a nested dict (the loaded config moves it between versions)."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        for child in value.values():
            hit = found(child, key)
            if hit is not None:
                return hit
    return None


def test_mrope_section_is_refused_by_every_command(tmp_path, capsys):
    path = tmp_path / "qwen25-vl"
    qwen25_vl_config(path)
    # the installed transformers reads M-RoPE from this file
    assert found(AutoConfig.from_pretrained(path).to_dict(), "mrope_section") == [2, 3, 3]
    before = files(path)
    for argv in (
        ["config", str(path), "--factor", "4", "--in-place"],
        ["config", str(path), "--factor", "4", "--dry-run"],
        ["vllm-args", str(path), "--factor", "4"],
        ["inspect", str(path)],
    ):
        one_line_exit_2(capsys, argv, "'mrope_section'")
    assert main(["config", str(path), "--check"]) == 1
    assert "'mrope_section' is not supported" in capsys.readouterr().out
    assert files(path) == before


# -- 16. multimodal configs with the rope under text_config (transformers 5.x saves) -------


@pytest.mark.parametrize("model_type", ["llama4", "qwen2_5_vl"])
def test_rope_under_text_config_is_named_not_called_absent(tmp_path, capsys, model_type):
    path = tmp_path / model_type
    path.mkdir()
    text = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "rope_theta": 500000.0,
        "max_position_embeddings": 1024,
    }
    config = {"model_type": model_type, "text_config": text}
    (path / "config.json").write_text(json.dumps(config) + "\n")
    loaded = AutoConfig.from_pretrained(path).text_config
    theta = loaded.rope_theta if hf_format() == "v4" else loaded.rope_parameters["rope_theta"]
    assert theta == 500000.0  # transformers runs this rope, from text_config
    for argv in (
        ["config", str(path)],
        ["config", str(path), "--factor", "2", "--in-place"],
        ["vllm-args", str(path), "--factor", "2"],
        ["inspect", str(path)],
    ):
        err = one_line_exit_2(capsys, argv, "under 'text_config'", "multimodal")
        assert "has no rotary embedding" not in err


# -- 2. a top-level original_max_position_embeddings ---------------------------------------


def test_top_level_original_length_is_read_where_each_reader_reads_it(llama, capsys):
    edit_config(llama, original_max_position_embeddings=L // 2, max_position_embeddings=L)
    before = files(llama)
    # transformers 5 (and vLLM) would run L=128 for yarn, transformers 4 L=256: refused
    for argv in (
        ["config", str(llama), "--factor", "4", "--in-place"],
        ["vllm-args", str(llama), "--factor", "4"],
    ):
        one_line_exit_2(
            capsys,
            argv,
            "original_max_position_embeddings",
            "L=128",
            "L=256",
            "--original-max-position-embeddings",
        )
    assert files(llama) == before
    # with L given, every reader runs it: the top-level key is written too
    argv = ["config", str(llama), "--factor", "4", "--original-max-position-embeddings", "128"]
    assert main([*argv, "--in-place"]) == 0
    inv_freq, attention = runs(llama)
    expected = RopeScaling("yarn", 4, L // 2, THETA, HEAD_DIM)
    assert torch.equal(inv_freq, expected.inv_freq()) and attention == expected.attention_factor()
    written = json.loads((llama / "config.json").read_text())
    assert written["original_max_position_embeddings"] == L // 2
    assert written["max_position_embeddings"] == 2 * L
    assert main(["config", str(llama), "--check"]) == 0
    assert main([*argv, "--in-place"]) == 0 and files(llama) != before  # idempotent, no error
    assert main(["config", str(llama), "--reset", "--in-place"]) == 0
    assert {k: v for k, v in files(llama).items() if not k.endswith(".bak")} == before


def test_reset_restores_what_an_older_yarnlib_wrote_beside_a_top_level_length(llama):
    """Older yarnlib wrote yarn with L = max_position_embeddings into the rope dict and left a
    top-level original_max_position_embeddings as it was; --reset must still restore."""

    def with_top_level(text: str) -> str:  # the key first, as a vendor's file may have it
        return text.replace("{\n", '{\n  "original_max_position_embeddings": 128,\n', 1)

    native = (llama / "config.json").read_text()
    assert main(["config", str(llama), "--factor", "4", "--in-place"]) == 0  # no top-level key
    written = (llama / "config.json").read_text()
    (llama / "config.json").write_text(with_top_level(written))  # as the older write left it
    assert "the readers take different original contexts" in " ".join(
        show(llama)["inconsistencies"]
    )
    assert main(["config", str(llama), "--reset", "--in-place"]) == 0
    assert (llama / "config.json").read_text() == with_top_level(native)


VLLM_PROBE = """
import json, sys
from vllm.config import ModelConfig
path, kwargs = sys.argv[1], json.loads(sys.argv[2])
kwargs.pop("model", None)
mc = ModelConfig(model=path, tokenizer=path, dtype="float32", **kwargs)
print("RESULT " + json.dumps(dict(mc.hf_config.rope_parameters)))
"""


def vllm_reads(path: Path, kwargs: dict) -> dict:
    """The rope parameters vLLM's own config loader ends with (a subprocess: vLLM's import)."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    argv = [sys.executable, "-c", VLLM_PROBE, str(path), json.dumps(kwargs)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vllm_runs_the_original_length_given(llama, tmp_path, capsys):
    """vLLM takes L from vllm-args' rope override as given, beside a top-level key that it
    (like transformers 5) would read first from the file: the L asked for is the L run."""
    edit_config(llama, original_max_position_embeddings=L // 2, max_position_embeddings=L)
    argv = ["vllm-args", str(llama), "--factor", "4", "--original-max-position-embeddings"]
    capsys.readouterr()
    assert main([*argv, str(L), "--json"]) == 0
    kwargs = json.loads(capsys.readouterr().out)
    assert vllm_reads(llama, kwargs)["original_max_position_embeddings"] == L  # not the 128


def test_show_reports_what_transformers_runs_when_lengths_disagree(llama):
    # what older yarnlib wrote: yarn with L=256 in the dict, a top-level 128 left beside it
    edit_config(
        llama,
        original_max_position_embeddings=L // 2,
        max_position_embeddings=4 * L,
        **rope_dict(
            {
                "rope_type": "yarn",
                "rope_theta": THETA,
                "factor": 4.0,
                "original_max_position_embeddings": L,
            }
        ),
    )
    report = show(llama)
    inv_freq, attention = runs(llama)
    spec = RopeScaling(**report["spec"])
    assert torch.equal(spec.inv_freq(), inv_freq) and spec.attention_factor() == attention
    assert report["native_context"] == spec.original_max_position_embeddings
    problems = " ".join(report["inconsistencies"])
    assert "transformers 5 and vLLM run L=128" in problems
    assert "transformers 4 run L=256" in problems


# -- 3. a YaRN the checkpoint ships ---------------------------------------------------------

SHIPPED = {
    "rope_type": "yarn",
    "rope_theta": THETA,
    "factor": 4.0,
    "original_max_position_embeddings": L,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}


@pytest.fixture
def shipped_yarn(tmp_path):
    path = tmp_path / "shipped"
    tiny_model(
        "llama", max_position_embeddings=4 * L, **hand_written_rope(SHIPPED)
    ).save_pretrained(path)
    return path


def test_a_shipped_yarn_is_kept_exactly_or_refused(shipped_yarn, capsys):
    inv_freq, attention = runs(shipped_yarn)
    assert attention == pytest.approx(1.0)  # mscale == mscale_all_dim: transformers runs 1.0
    before = files(shipped_yarn)
    assert main(["config", str(shipped_yarn), "--factor", "4", "--in-place"]) == 0
    assert files(shipped_yarn) == before  # the same method and factor: nothing to do
    for argv in (
        ["config", str(shipped_yarn), "--factor", "8", "--in-place"],
        ["config", str(shipped_yarn), "--method", "linear", "--factor", "4", "--dry-run"],
        ["vllm-args", str(shipped_yarn), "--factor", "8"],
    ):
        one_line_exit_2(capsys, argv, "already runs rope 'yarn'", "mscale=0.707")
    assert files(shipped_yarn) == before
    report = show(shipped_yarn)
    assert report["inconsistencies"] == [] and report["transformers"]["attention_factor"] == (
        pytest.approx(1.0)
    )


def test_patch_keeps_a_shipped_yarn(shipped_yarn):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(shipped_yarn, dtype=torch.float32).eval()
    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        yarnlib.patch(model, factor=4)
        after = model(ids).logits
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    assert RopeScaling.from_hf(model.config).mscale == 0.707
    with pytest.raises(ValueError, match="already runs rope 'yarn'"):
        yarnlib.patch(model, factor=8)


def deepseek_v3_folder(path: Path) -> None:
    """DeepSeek-V3's shape, scaled down: yarn ×40 with mscale 1/1, qk_rope_head_dim beside a
    hidden_size / heads that differs, and no head_dim (as on the Hub)."""
    config = AutoConfig.for_model(
        "deepseek_v3",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        vocab_size=128,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        max_position_embeddings=40 * 64,
        **hand_written_rope(
            {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 40.0,
                "original_max_position_embeddings": 64,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "beta_fast": 32,
                "beta_slow": 1,
            }
        ),
    )
    config.save_pretrained(path)
    edit_config(path, head_dim=None)


def test_deepseek_v3_rotates_qk_rope_head_dim_and_keeps_its_yarn(tmp_path, capsys):
    path = tmp_path / "deepseek"
    deepseek_v3_folder(path)
    inv_freq, attention = runs(path)
    spec = yarnlib.config.current_spec(path)
    assert spec.rotary_dim == 8 and len(inv_freq) == 4  # qk_rope_head_dim, not 64 // 4
    assert torch.equal(spec.inv_freq(), inv_freq) and spec.attention_factor() == attention
    before = files(path)
    assert main(["config", str(path), "--factor", "40", "--in-place"]) == 0
    assert files(path) == before
    one_line_exit_2(
        capsys, ["config", str(path), "--factor", "4", "--in-place"], "already runs rope 'yarn'"
    )
    assert files(path) == before
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 0
    assert "rotary_dim=8" in capsys.readouterr().out


# -- 7. float lengths -----------------------------------------------------------------------


def test_integral_float_limits_are_updated_in_their_type(llama, capsys):
    (llama / "tokenizer_config.json").write_text(json.dumps({"model_max_length": float(L)}))
    (llama / "generation_config.json").write_text(json.dumps({"max_length": float(L)}))
    assert main(["config", str(llama), "--factor", "4", "--in-place"]) == 0
    for name, key in (
        ("tokenizer_config.json", "model_max_length"),
        ("generation_config.json", "max_length"),
    ):
        value = json.loads((llama / name).read_text())[key]
        assert value == 4 * L and isinstance(value, float), (name, value)
    assert main(["config", str(llama), "--check"]) == 0
    # a limit below the new context is reported, float or not
    (llama / "tokenizer_config.json").write_text(json.dumps({"model_max_length": float(L)}))
    (llama / "generation_config.json").write_text(json.dumps({"max_length": float(L)}))
    capsys.readouterr()
    assert main(["config", str(llama), "--check"]) == 1
    out = capsys.readouterr().out
    assert "model_max_length=256.0" in out and "max_length=256.0 is below" in out
    assert math.isfinite(show(llama)["extended_context"])
