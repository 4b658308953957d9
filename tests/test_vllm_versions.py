"""The vLLM overrides per vLLM version, against what each version's source reads.

``READS`` transcribes the source (docs/vllm.md cites file and line of each entry); ``read``
replays what that version does with a config and ``hf_overrides``: ``config.update``, its rope
normalisation, ``get_rope``'s choice of theta, rotary dim and YaRN attention factor, and the
derived ``max_model_len``. For the installed vLLM the same is checked on vLLM itself.
"""

import json
import math
import re

import pytest
import torch

from yarnlib import RopeScaling
from yarnlib.vllm import llm_kwargs

HEAD_DIM, L, THETA, FACTOR = 32, 256, 50000.0, 4.0


def mscale(s, m=1.0):  # yarn_get_mscale of every version read
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


# What each version reads. rope: the config attribute get_rope receives; theta/partial: where
# they are read ("top": the config attribute, "dict": inside the rope dict); yarn: the keys
# passed to YaRNScalingRotaryEmbedding; yarn_len: what derives max_model_len for yarn; dynamic:
# DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache (layers/rotary_embedding/
# dynamic_ntk_scaling_rope.py): "scaled_table" up to 0.21 (@v0.11.0:50-67, @v0.21.0:51-68),
# "trained_positions" from 0.22 (@v0.22.0:53-73, @v0.24.0:53-73, @v0.32.0:53-73).
READS = {
    "0.11.0": dict(
        rope="rope_scaling",
        theta="top",
        partial="top",
        yarn={"extrapolation_factor", "attn_factor", "beta_fast", "beta_slow"},
        yarn_len="original*factor",
        dynamic="scaled_table",
        transformers=4,
    ),
    "0.24.0": dict(
        rope="rope_parameters",
        theta="dict",
        partial="dict",
        yarn={"extrapolation_factor", "attn_factor", "beta_fast", "beta_slow"}
        | {"apply_yarn_scaling", "truncate"},
        yarn_len="original*factor",
        dynamic="trained_positions",
        transformers=5,
    ),
    "0.32.0": dict(
        rope="rope_parameters",
        theta="dict",
        partial="dict",
        yarn={"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"},
        yarn_len="max_position_embeddings",
        dynamic="trained_positions",
        transformers=5,
    ),
}


def version_tuple(version: str) -> tuple[int, int]:
    return tuple(int(part) for part in version.split(".")[:2])


def checkpoint(partial: float, transformers: int) -> dict:
    """config.json of an unscaled tiny Llama as that transformers generation writes it."""
    cfg = {"model_type": "llama", "head_dim": HEAD_DIM, "max_position_embeddings": L}
    if transformers == 4:
        cfg.update(rope_theta=THETA, rope_scaling=None)
        if partial != 1:
            cfg["partial_rotary_factor"] = partial
    else:  # transformers 5 keeps partial_rotary_factor only inside rope_parameters when loaded
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": THETA}
        if partial != 1:
            cfg["rope_parameters"]["partial_rotary_factor"] = partial
    return cfg


def read(version: str, cfg: dict, overrides: dict) -> dict:
    """What ``version`` builds from ``cfg`` + ``overrides``: the facts in ``READS`` replayed."""
    facts = READS[version]
    cfg = dict(cfg)
    for key, value in overrides.items():  # config.update
        if facts["transformers"] == 5 and key == "rope_scaling":
            key = "rope_parameters"  # one attribute in transformers 5
        cfg[key] = dict(value) if isinstance(value, dict) else value
    rope = dict(cfg.get(facts["rope"]) or {"rope_type": "default"})
    if facts["theta"] == "dict":  # standardize_rope_params fills only what is missing
        rope.setdefault("rope_theta", cfg.get("rope_theta"))
        if cfg.get("partial_rotary_factor") is not None:
            rope.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
        theta = rope.get("rope_theta", 10000)
        partial = rope.get("partial_rotary_factor", 1.0)
    else:
        theta = cfg.get("rope_theta", 10000)
        partial = cfg.get("partial_rotary_factor", 1.0)
    rotary_dim = rope.get("rope_dim") if version_tuple(version) >= (0, 24) else None
    rotary_dim = rotary_dim or int(HEAD_DIM * partial)
    out = {"type": rope["rope_type"], "theta": theta, "rotary_dim": rotary_dim, "attention": 1.0}
    factor = rope.get("factor", 1.0)
    derived = cfg["max_position_embeddings"]
    if rope["rope_type"] == "yarn":
        knobs = {k: v for k, v in rope.items() if k in facts["yarn"]}
        out.update(factor=factor, original=rope["original_max_position_embeddings"])
        out.update(beta_fast=knobs.get("beta_fast", 32), beta_slow=knobs.get("beta_slow", 1))
        out["truncate"] = knobs.get("truncate", True)
        if "attention_factor" in facts["yarn"]:
            if knobs.get("attention_factor") is not None:
                out["attention"] = knobs["attention_factor"]
            elif knobs.get("mscale") and knobs.get("mscale_all_dim"):
                out["attention"] = mscale(factor, knobs["mscale"]) / mscale(
                    factor, knobs["mscale_all_dim"]
                )
            else:
                out["attention"] = mscale(factor)
        elif knobs.get("apply_yarn_scaling", True):
            out["attention"] = mscale(factor) * knobs.get("attn_factor", 1)
        else:
            out["attention"] = knobs.get("attn_factor", 1)
        if facts["yarn_len"] == "original*factor":
            derived = out["original"] * factor
    elif rope["rope_type"] != "default":
        out["factor"] = factor
        derived *= factor
    out["derived_max_model_len"] = derived
    return out


SPECS = {
    "none": RopeScaling("none", 1.0, L, THETA, 32),
    "linear": RopeScaling("linear", FACTOR, L, THETA, 32),
    "ntk": RopeScaling("ntk", FACTOR, L, THETA, 32),
    "ntk_by_parts": RopeScaling("ntk_by_parts", FACTOR, L, THETA, 32),
    "yarn": RopeScaling("yarn", FACTOR, L, THETA, 32, beta_fast=16.0),
    "yarn+mscale": RopeScaling("yarn", FACTOR, L, THETA, 32, mscale=0.8, mscale_all_dim=0.5),
    "yarn+attention_factor": RopeScaling("yarn", FACTOR, L, THETA, 32, attention_factor=1.3),
}


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("version", READS)
def test_each_version_reads_the_spec(version, name, partial):
    spec = SPECS[name].replace(rotary_dim=int(HEAD_DIM * partial))
    kwargs = llm_kwargs(spec, head_dim=HEAD_DIM, vllm_version=version)
    got = read(version, checkpoint(partial, READS[version]["transformers"]), kwargs["hf_overrides"])
    theta = THETA * FACTOR ** (spec.rotary_dim / (spec.rotary_dim - 2)) if name == "ntk" else THETA
    assert got["theta"] == pytest.approx(theta, rel=1e-15)
    assert got["rotary_dim"] == spec.rotary_dim
    assert got["attention"] == pytest.approx(spec.attention_factor(), rel=1e-12)
    if got["type"] == "yarn":
        assert (got["factor"], got["original"]) == (spec.factor, L)
        assert (got["beta_fast"], got["beta_slow"]) == (spec.beta_fast, spec.beta_slow)
    else:
        assert got["type"] == {"none": "default", "ntk": "default"}.get(name, name)
    # vLLM refuses a max_model_len above the one it derives; yarnlib asks for L × s.
    assert kwargs["max_model_len"] == spec.max_position_embeddings
    assert got["derived_max_model_len"] == kwargs["max_model_len"]


YARN_ATTENTION_KEYS = ("attention_factor", "attn_factor", "apply_yarn_scaling")
BETWEEN_0_12_AND_0_32 = {"attention_factor": 1.3, "attn_factor": 1.3, "apply_yarn_scaling": False}


@pytest.mark.parametrize(
    "version, keys",
    [
        # 0.11 reads attn_factor only, and multiplies 0.1·ln(s) + 1 by it
        ("0.11.0", {"attention_factor": 1.3, "attn_factor": 1.3 / mscale(FACTOR)}),
        ("0.12.0", BETWEEN_0_12_AND_0_32),
        ("0.31.0", BETWEEN_0_12_AND_0_32),  # not read: both spellings
        ("0.32.0", {"attention_factor": 1.3}),  # reads attention_factor, not attn_factor
    ],
)
def test_the_yarn_attention_factor_spelling_changes_at_0_12_and_0_32(version, keys):
    spec = SPECS["yarn+attention_factor"]
    overrides = llm_kwargs(spec, head_dim=HEAD_DIM, vllm_version=version)["hf_overrides"]
    params = overrides["rope_parameters"]
    assert {k: params[k] for k in YARN_ATTENTION_KEYS if k in params} == keys
    if version == "0.31.0":  # whichever of its neighbours' readings 0.31 has, it gets 1.3
        for reader in ("0.24.0", "0.32.0"):
            assert read(reader, checkpoint(1.0, 5), overrides)["attention"] == pytest.approx(1.3)


@pytest.mark.parametrize(
    "before, since, boundary",
    [("0.13.0", "0.14.0", "plugin"), ("0.23.0", "0.24.0", "rope_dim"), ("0.23.0", "0.24.0", "v4")],
)
def test_version_boundaries(before, since, boundary):
    """The first version read that has a feature, and the one before it (unread, but older
    than the change): the plugin's get_rope from 0.14, rope_dim and transformers 5 (no
    rope_scaling written) from 0.24."""
    if boundary == "plugin":
        dynamic = RopeScaling("dynamic_ntk", FACTOR, L, THETA, 32)
        with pytest.raises(ValueError, match=r"plugin needs vLLM >= 0\.14"):
            llm_kwargs(dynamic, head_dim=HEAD_DIM, vllm_version=before)
        assert llm_kwargs(dynamic, head_dim=HEAD_DIM, vllm_version=since)
    elif boundary == "rope_dim":
        spec = SPECS["yarn"].replace(rotary_dim=16)
        with pytest.raises(ValueError, match=f"head_dim: required for vLLM {before}"):
            llm_kwargs(spec, vllm_version=before)
        assert llm_kwargs(spec, vllm_version=since)["hf_overrides"]["rope_parameters"]["rope_dim"]
    else:
        assert (
            "rope_scaling"
            in llm_kwargs(SPECS["yarn"], head_dim=32, vllm_version=before)["hf_overrides"]
        )
        assert (
            "rope_scaling"
            not in llm_kwargs(SPECS["yarn"], head_dim=32, vllm_version=since)["hf_overrides"]
        )


@pytest.mark.parametrize("version", ["0.11.0", "0.12.0"])
def test_dynamic_methods_need_the_plugins_get_rope(version):
    with pytest.raises(ValueError, match=r"plugin needs vLLM >= 0\.14"):
        llm_kwargs(RopeScaling("dynamic_yarn", FACTOR, L, THETA, 32), vllm_version=version)
    assert llm_kwargs(
        RopeScaling("dynamic_yarn", FACTOR, L, THETA, 32), head_dim=32, vllm_version="0.14.0"
    )


def test_truncate_off_refused_where_not_read():
    spec = RopeScaling("yarn", FACTOR, L, THETA, 32, truncate=False)
    with pytest.raises(ValueError, match="truncate=False"):
        llm_kwargs(spec, head_dim=32, vllm_version="0.11.0")
    params = llm_kwargs(spec, head_dim=32, vllm_version="0.24.0")["hf_overrides"]
    assert params["rope_parameters"]["truncate"] is False


def test_unknown_head_dim_uses_rope_dim_or_is_refused():
    spec = SPECS["yarn"].replace(rotary_dim=16)
    params = llm_kwargs(spec, vllm_version="0.24.0")["hf_overrides"]["rope_parameters"]
    assert params["rope_dim"] == 16
    with pytest.raises(ValueError, match="head_dim: required for vLLM 0.18.0"):
        llm_kwargs(spec, vllm_version="0.18.0")


@pytest.mark.parametrize("bad", ["latest", "0", 0.24, ""])
def test_bad_version_names_the_field(bad):
    with pytest.raises(ValueError, match="vllm_version"):
        llm_kwargs(SPECS["yarn"], head_dim=32, vllm_version=bad)


def dynamic_table(version: str, rope: dict, max_position: int) -> tuple[torch.Tensor, int]:
    """inv_freq and table rows of vLLM's rope_type "dynamic", replayed from its source: get_rope
    passes max_position P (the config's max_position_embeddings); up to 0.21 the table spans
    P·s rows at base b·(s·(P·s)/P − (s−1))^(d/(d−2)); from 0.22 it spans P rows at base
    b·(s·P/T − (s−1))^(d/(d−2)), T = rope["max_trained_positions"] or P."""
    s, d = rope["factor"], HEAD_DIM
    if READS[version]["dynamic"] == "scaled_table":
        rows = int(max_position * s)
        base = THETA * ((s * rows / max_position) - (s - 1)) ** (d / (d - 2))
    else:
        rows, trained = max_position, rope.get("max_trained_positions", max_position)
        base = THETA * ((s * max_position / trained) - (s - 1)) ** (d / (d - 2))
    return 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d), rows


@pytest.mark.parametrize("version", READS)
def test_config_refuses_dynamic_ntk_where_vllm_runs_something_else(version, tmp_path, capsys):
    """What vLLM does with the rope_type "dynamic" config.json of ``yarnlib config --method
    dynamic_ntk``, against transformers' own dynamic NTK at vLLM's length L·s (the engine's
    max_model_len): up to 0.21 the same table; from 0.22 plain RoPE over L rows. config writes
    the file only where vLLM runs it as transformers does at L·s, and says what vLLM runs."""
    from tiny_models import hand_written_rope, tiny_config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from yarnlib import cli
    from yarnlib.config import show

    rope = {"rope_type": "dynamic", "rope_theta": THETA, "factor": FACTOR}
    reference = tiny_config("llama", head_dim=HEAD_DIM, **hand_written_rope(rope))
    assert reference.max_position_embeddings == L
    transformers_at_engine_length, _ = ROPE_INIT_FUNCTIONS["dynamic"](
        reference, None, seq_len=int(L * FACTOR)
    )
    inv_freq, rows = dynamic_table(version, rope, L)
    same = rows >= L * FACTOR and torch.allclose(inv_freq, transformers_at_engine_length)
    assert same == (version == "0.11.0")  # the facts themselves

    tiny_config("llama", head_dim=HEAD_DIM).save_pretrained(tmp_path)
    args = ["config", str(tmp_path), "--method", "dynamic", "--factor", "4", "--in-place"]
    code = cli.main([*args, "--vllm-version", version])
    err = capsys.readouterr().err
    assert code == (0 if same else 2), err
    if not same:
        assert f"vLLM {version} runs rope_type 'dynamic' as plain RoPE" in err
        assert f"table of {L} positions, but derives max_model_len={int(L * FACTOR)}" in err
        return
    written = json.loads((tmp_path / "config.json").read_text())
    params = written.get("rope_parameters") or {**written["rope_scaling"], "rope_theta": THETA}
    assert (params["rope_type"], written["max_position_embeddings"]) == ("dynamic", L)
    problems = " ".join(show(tmp_path, version)["inconsistencies"])
    assert f"vLLM {version} runs rope_type 'dynamic' as static NTK fixed at 1024" in problems
    later = " ".join(show(tmp_path, "0.24.0")["inconsistencies"])
    assert "vLLM 0.24.0 runs rope_type 'dynamic' as plain RoPE" in later


# -- the installed vLLM itself ----------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_dirs(tmp_path_factory):
    from tiny_models import tiny_config

    dirs = {}
    for partial in (1.0, 0.5):
        dirs[partial] = tmp_path_factory.mktemp(f"llama{partial}")
        kw = {"partial_rotary_factor": partial} if partial != 1 else {}
        tiny_config("llama", head_dim=HEAD_DIM, **kw).save_pretrained(dirs[partial])
    return dirs


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("name", SPECS)
def test_installed_vllm_builds_the_spec(llama_dirs, name, partial):
    """vLLM's own config loading, max_model_len derivation and get_rope, on the overrides."""
    pytest.importorskip("vllm")
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    spec = SPECS[name].replace(rotary_dim=int(HEAD_DIM * partial))
    kwargs = llm_kwargs(spec, head_dim=HEAD_DIM)
    config = ModelConfig(
        model=str(llama_dirs[partial]),
        hf_overrides=kwargs["hf_overrides"],
        skip_tokenizer_init=True,
        dtype="float32",
    )
    assert config.max_model_len == kwargs["max_model_len"]  # derived, not asked for
    hf = config.hf_config
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        rope = get_rope(
            HEAD_DIM, hf.max_position_embeddings, True, hf.rope_parameters, torch.float32
        )
    assert rope.rotary_dim == spec.rotary_dim
    inv_freq, factor = spec.frequencies()
    positions = torch.arange(kwargs["max_model_len"], dtype=torch.float32)[:, None]
    angles = positions * inv_freq
    expected = torch.cat((angles.cos() * factor, angles.sin() * factor), dim=-1)
    torch.testing.assert_close(rope.cos_sin_cache[: len(positions)], expected, rtol=0, atol=2e-6)


def test_installed_vllm_runs_yarnlibs_dynamic_file_as_plain_rope_over_l_rows(tmp_path, capsys):
    """vLLM itself on the rope_type "dynamic" config.json yarnlib writes for dynamic_ntk (with
    --vllm-version 0.21.0): it derives max_model_len L·s, but get_rope's table holds L rows of
    plain RoPE and position L is out of it. config refuses the method for this vLLM, and
    --check reports the written file."""
    pytest.importorskip("vllm")
    from tiny_models import tiny_config
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from yarnlib import cli
    from yarnlib.vllm import versions

    version = versions.installed()
    if versions.parse(version) < (0, 22):
        pytest.skip(f"vLLM {version} runs rope_type dynamic as NTK over L·s rows")
    tiny_config("llama", head_dim=HEAD_DIM).save_pretrained(tmp_path)
    args = ["config", str(tmp_path), "--method", "dynamic", "--factor", "4", "--in-place"]
    assert cli.main(args) == 2
    assert f"vLLM {version} runs rope_type 'dynamic' as plain RoPE" in capsys.readouterr().err
    assert cli.main([*args, "--vllm-version", "0.21.0"]) == 0
    config = ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, dtype="float32")
    assert config.max_model_len == L * FACTOR
    hf = config.hf_config
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        rope = get_rope(
            HEAD_DIM, hf.max_position_embeddings, True, hf.rope_parameters, torch.float32
        )
    inv_freq = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.int64).float() / HEAD_DIM)
    angles = torch.arange(L, dtype=torch.float32)[:, None] * inv_freq
    plain = torch.cat((angles.cos(), angles.sin()), dim=-1)
    torch.testing.assert_close(rope.cos_sin_cache, plain, rtol=0, atol=2e-6)  # all L rows
    query = torch.zeros(1, HEAD_DIM)
    with pytest.raises(IndexError):
        rope.forward_native(torch.tensor([L]), query, query.clone())
    capsys.readouterr()
    assert cli.main(["config", str(tmp_path), "--check"]) == 1
    assert f"table of {L} positions, but derives max_model_len=1024" in capsys.readouterr().out


def test_show_reports_where_transformers_and_vllm_rotate_different_dims(llama_dirs):
    """A Llama with partial_rotary_factor and default RoPE: transformers' own rotary embedding
    rotates the whole head, vLLM's get_rope a part; config --show says so (and not when both
    agree)."""
    pytest.importorskip("vllm")
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from yarnlib.config import show

    for partial, path in llama_dirs.items():
        hf_dims = 2 * LlamaRotaryEmbedding(AutoConfig.from_pretrained(path)).inv_freq.numel()
        hf = ModelConfig(model=str(path), skip_tokenizer_init=True, dtype="float32").hf_config
        with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
            rope = get_rope(
                HEAD_DIM, hf.max_position_embeddings, True, hf.rope_parameters, torch.float32
            )
        assert (hf_dims, rope.rotary_dim) == (HEAD_DIM, int(HEAD_DIM * partial))
        problems = " ".join(show(path)["inconsistencies"])
        said = f"rotates {HEAD_DIM} dims of each head, vLLM {rope.rotary_dim} "
        assert (said in problems) == (partial != 1), problems


def test_easyr1_refuses_attention_knobs_its_vllm_cannot_read(tmp_path):
    from tiny_models import tiny_config

    from yarnlib.integrations import easyr1

    tiny_config("llama", head_dim=HEAD_DIM).save_pretrained(tmp_path / "model")
    cfg = {"worker": {"actor": {"model": {"model_path": str(tmp_path / "model")}}}}
    with pytest.raises(ValueError, match=r"vLLM 0\.11\.0 reads the YaRN attention factor"):
        easyr1.apply(cfg, SPECS["ntk_by_parts"], output=tmp_path / "out", vllm_version="0.11.0")
    assert not (tmp_path / "out").exists()
    easyr1.apply(cfg, SPECS["ntk_by_parts"], output=tmp_path / "out", vllm_version="0.32.0")


def test_cli_targets_the_version_asked(tmp_path, capsys):
    from tiny_models import tiny_config

    from yarnlib import cli

    tiny_config("llama", head_dim=HEAD_DIM).save_pretrained(tmp_path)
    args = ["vllm-args", str(tmp_path), "--method", "ntk_by_parts", "--factor", "4"]
    assert cli.main([*args, "--vllm-version", "0.11.0", "--json"]) == 0
    overrides = json.loads(capsys.readouterr().out)["hf_overrides"]
    got = read("0.11.0", checkpoint(1.0, 4), overrides)
    assert got["attention"] == pytest.approx(1.0) and got["theta"] == THETA
    assert cli.main([*args, "--vllm-version", "0.28.0"]) == 0
    assert "vLLM 0.28.0: its source was not read" in capsys.readouterr().out
    assert cli.main([*args, "--vllm-version", "latest"]) == 2
    assert "vllm_version: 'latest'" in capsys.readouterr().err


def test_partial_qwen_refused_where_vllm_ignores_it(tmp_path):
    from tiny_models import tiny_config

    from yarnlib.vllm.args_cli import model_kwargs, spec_for_model

    tiny_config("qwen3", head_dim=HEAD_DIM, partial_rotary_factor=0.5).save_pretrained(tmp_path)
    spec = spec_for_model(tmp_path, "yarn", FACTOR)
    with pytest.raises(ValueError, match="partial_rotary_factor: vLLM 0.12.0 reads it for Llama"):
        model_kwargs(tmp_path, spec, vllm_version="0.12.0")
    params = model_kwargs(tmp_path, spec, vllm_version="0.14.0")["hf_overrides"]["rope_parameters"]
    assert params["partial_rotary_factor"] == 0.5


@pytest.mark.parametrize(
    "version, scaled_table",
    [("0.21.0", True), ("0.21.9", True), ("0.22.0", False), ("0.22.1+cpu", False), ("0.23", False)],
)
def test_dynamic_ntk_in_config_json_refused_from_0_22_on(version, scaled_table):
    """The boundary itself (issue 52): 0.21 still builds NTK over L·s rows (base multiplier
    s·s − (s−1)), 0.22 is the first that builds plain RoPE over L rows, and is refused."""
    from yarnlib.vllm.versions import check_config_file, native_dynamic

    spec = RopeScaling("dynamic_ntk", FACTOR, L, THETA, 32)
    built = native_dynamic({"factor": FACTOR}, L, version)
    if scaled_table:
        assert built == (FACTOR * FACTOR - (FACTOR - 1), L * FACTOR)
        check_config_file(spec, version)  # what transformers runs at L·s: written
        return
    assert built == (1.0, L)
    with pytest.raises(ValueError, match=rf"vLLM {re.escape(version)} runs rope_type 'dynamic' as "
                       rf"plain RoPE .* table of {L} positions"):  # fmt: skip
        check_config_file(spec, version)


def test_truncate_off_is_read_from_0_12_on():
    """The boundary itself: 0.12 is the first version with the truncate key (0.11 rounds the
    correction range always), so truncate=False goes to 0.12 as written."""
    spec = RopeScaling("yarn", FACTOR, L, THETA, 32, truncate=False)
    with pytest.raises(ValueError, match=r"truncate=False: vLLM 0\.11\.9 always rounds"):
        llm_kwargs(spec, head_dim=32, vllm_version="0.11.9")
    params = llm_kwargs(spec, head_dim=32, vllm_version="0.12.0")["hf_overrides"]
    assert params["rope_parameters"]["truncate"] is False
