"""vllm-args / llm_kwargs, the serve parser round trip, and the plugin's get_rope (no engine)."""

import json
import shlex
import sys

import pytest
import torch

from yarnlib import RopeScaling, cli, convert
from yarnlib.vllm import llm_kwargs, serve_args
from yarnlib.vllm.plugin import spec_from_rope_parameters

METHODS = ["none", "linear", "ntk", "ntk_by_parts", "yarn", "dynamic_ntk", "dynamic_yarn"]


def spec(method, factor=4.0, **knobs):
    factor = 1.0 if method == "none" else factor  # none scales nothing
    return RopeScaling(method, factor, 4096, 1e6, 128, **knobs)


THETA, ORIGINAL = 1e6, 4096  # of spec()
YARN = {"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0, "rope_dim": 128}
YARN["original_max_position_embeddings"] = ORIGINAL
FIXED = {"rope_theta": THETA, "factor": 4.0, "original_max_position_embeddings": ORIGINAL}
FIXED["rope_dim"] = 128  # no head_dim given: vLLM >= 0.24 reads the rotated width here
FIXED["fixed_scale_length"] = 4 * ORIGINAL  # max_model_len
# What vLLM must receive for each method at factor 4 (none: 1), written out by hand: rope_parameters
# and max_position_embeddings as config.json has it (vLLM multiplies it by the factor for
# linear and for rope types it does not know, not for yarn).
EXPECTED = {
    "none": ({"rope_type": "default", "rope_theta": THETA, "rope_dim": 128}, ORIGINAL),
    "linear": (
        {"rope_type": "linear", "rope_theta": THETA, "factor": 4.0, "rope_dim": 128},
        ORIGINAL,
    ),
    "ntk": (
        {"rope_type": "default", "rope_theta": THETA * 4.0 ** (128 / 126), "rope_dim": 128},
        4 * ORIGINAL,
    ),
    "ntk_by_parts": ({**YARN, "attention_factor": 1.0}, 4 * ORIGINAL),
    "yarn": (YARN, 4 * ORIGINAL),
    "dynamic_ntk": ({"rope_type": "yarnlib_dynamic_ntk", **FIXED}, ORIGINAL),
    "dynamic_yarn": ({"rope_type": "yarnlib_dynamic_yarn", **FIXED}, ORIGINAL),
}


@pytest.mark.parametrize("method", METHODS)
def test_kwargs_carry_theta_and_limits(method):
    params, max_positions = EXPECTED[method]
    kwargs = llm_kwargs(spec(method))
    assert kwargs == {
        "hf_overrides": {
            "rope_parameters": params,
            "rope_theta": params["rope_theta"],
            "max_position_embeddings": max_positions,
        },
        "max_model_len": ORIGINAL if method == "none" else 4 * ORIGINAL,
    }
    if not method.startswith("dynamic"):  # the plain conversion says the same
        assert kwargs == spec(method).to_vllm()


def test_dynamic_yarn_keeps_knobs_and_config_type():
    params = llm_kwargs(spec("dynamic_yarn", beta_fast=16.0))["hf_overrides"]["rope_parameters"]
    assert params["rope_type"] == convert.HF_DYNAMIC_YARN and params["beta_fast"] == 16.0
    assert spec_from_rope_parameters(params, 128) == spec("dynamic_yarn", beta_fast=16.0)


def test_dynamic_scale_fixed_at_max_model_len():
    kwargs = llm_kwargs(spec("dynamic_ntk"), max_model_len=9000)
    assert kwargs["max_model_len"] == 9000
    assert kwargs["hf_overrides"]["rope_parameters"]["fixed_scale_length"] == 9000


@pytest.mark.parametrize("bad", [0, -5, 16385, 2.5, True])
def test_max_model_len_validated(bad):
    with pytest.raises(ValueError, match="max_model_len"):
        llm_kwargs(spec("yarn"), max_model_len=bad)


def test_plugin_refuses_missing_theta():
    params = llm_kwargs(spec("dynamic_yarn"))["hf_overrides"]["rope_parameters"]
    del params["rope_theta"]
    with pytest.raises(ValueError, match="rope_theta"):
        spec_from_rope_parameters(params, 128)


@pytest.mark.parametrize("bad", [None, 0, -1, 2048.0, True, "2048"])
def test_plugin_refuses_without_a_fixed_scale_length(plugin_get_rope, bad):
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    _, wrapped = plugin_get_rope
    params = llm_kwargs(spec("dynamic_yarn"))["hf_overrides"]["rope_parameters"]
    if bad is None:
        del params["fixed_scale_length"]  # what config.json of a dynamic_yarn checkpoint has
    else:
        params["fixed_scale_length"] = bad
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        with pytest.raises(ValueError, match="rope_parameters.fixed_scale_length") as error:
            wrapped(128, 16384, True, params, torch.float32)
    assert ("missing" if bad is None else repr(bad)) in str(error.value)


@pytest.fixture
def model_dir(tmp_path):
    from tiny_models import tiny_config

    tiny_config("qwen2", head_dim=32).save_pretrained(tmp_path)
    return tmp_path


def test_cli_prints_kwargs_and_serve_flags(model_dir, capsys):
    assert cli.main(["vllm-args", str(model_dir), "--method", "yarn", "--factor", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("LLM(model=") and "max_model_len=1024" in lines[1]
    assert lines[2].startswith("vllm serve ") and "--max-model-len 1024" in lines[2]
    assert cli.main(["vllm-args", str(model_dir), "--method", "pi", "--factor", "2", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = llm_kwargs(RopeScaling("linear", 2.0, 256, 50000.0, 32), head_dim=32)
    assert printed == {"model": str(model_dir), **expected}


def test_cli_bad_input_names_field(model_dir, capsys):
    for method, factor, message in (
        ("rope2", "4", "method"),
        ("", "4", "method: unknown RoPE scaling method ''"),
        ("none", "4", "factor: method 'none' scales nothing"),
        ("yarn", "1e300", "factor must be <= 1024"),
    ):
        args = ["vllm-args", str(model_dir), "--method", method, "--factor", factor]
        assert cli.main(args) == 2
        assert message in capsys.readouterr().err


def test_a_folder_that_records_its_scaling_needs_no_factor(model_dir, capsys):
    """An unscaled folder needs --factor; once `yarnlib config` scaled it (with an original the
    file does not say), the command without flags prints what --factor 4 with that L does."""
    assert cli.main(["vllm-args", str(model_dir), "--json"]) == 2
    assert "factor: required" in capsys.readouterr().err
    scaled = ["--factor", "4", "--original-max-position-embeddings", "128"]
    assert cli.main(["config", str(model_dir), *scaled, "--in-place"]) == 0
    capsys.readouterr()
    assert cli.main(["vllm-args", str(model_dir), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = llm_kwargs(RopeScaling("yarn", 4.0, 128, 50000.0, 32), head_dim=32)
    assert printed == {"model": str(model_dir), **expected}
    assert cli.main(["vllm-args", str(model_dir), *scaled, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == printed


@pytest.fixture(scope="module")
def serve_parser():
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())  # what `vllm serve` parses with


@pytest.mark.parametrize("method", METHODS)
def test_serve_parser_accepts_printed_flags(serve_parser, model_dir, method):
    from vllm.engine.arg_utils import EngineArgs

    kwargs = llm_kwargs(spec(method))
    args = serve_parser.parse_args(serve_args(str(model_dir), kwargs))
    args.model = args.model_tag  # as `vllm serve` does
    engine = EngineArgs.from_cli_args(args)
    assert engine.model == str(model_dir)
    assert engine.hf_overrides == kwargs["hf_overrides"]
    assert engine.max_model_len == kwargs["max_model_len"]


@pytest.fixture
def plugin_get_rope():
    """The plugin registered in this process, undone afterwards."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers import rotary_embedding

    from yarnlib.vllm import plugin

    before = rotary_embedding.get_rope
    # The installed entry point may have registered the plugin already: start unwrapped.
    original = getattr(before, "__wrapped__", before)
    rebind(before, original)
    plugin.register()
    plugin.register()  # vLLM may load plugins more than once
    wrapped = rotary_embedding.get_rope
    yield original, wrapped
    rebind(wrapped, before)


def rebind(old, new):
    """Point vLLM's get_rope, and every vllm module that imported it, from old to new."""
    from vllm.model_executor.layers import rotary_embedding

    rotary_embedding.get_rope = new
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm.") and getattr(module, "get_rope", None) is old:
            module.get_rope = new


def test_plugin_leaves_native_types_alone(plugin_get_rope):
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    original, wrapped = plugin_get_rope
    assert wrapped.__wrapped__ is original  # registered once
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        for params in (
            None,
            {"rope_type": "default", "rope_theta": 1e4},
            *(llm_kwargs(spec(m))["hf_overrides"]["rope_parameters"] for m in METHODS[1:5]),
        ):
            ours = wrapped(128, 16384, True, params, torch.float32)
            assert ours is original(128, 16384, True, params, torch.float32)


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
@pytest.mark.parametrize("max_position, scale_len", [(4096, 12000), (16384, 12000)])
def test_plugin_table_is_vllms_own_rope_at_the_fixed_length(
    plugin_get_rope, method, max_position, scale_len
):
    """Fixed at M tokens, dynamic NTK is vLLM's own 'dynamic' rope over M positions trained
    on L, and dynamic YaRN is vLLM's own yarn at factor M / L."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    original, wrapped = plugin_get_rope
    params = llm_kwargs(spec(method), max_model_len=scale_len)["hf_overrides"]["rope_parameters"]
    if method == "dynamic_ntk":
        native = {"rope_type": "dynamic", "factor": 4.0, "max_trained_positions": ORIGINAL}
    else:
        native = {"rope_type": "yarn", "factor": scale_len / ORIGINAL}
        native["original_max_position_embeddings"] = ORIGINAL
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        rope = wrapped(128, max_position, True, params, torch.float32)  # no model config
        vllm_rope = original(128, scale_len, True, {**native, "rope_theta": THETA}, torch.float32)
    ours, theirs = rope.cos_sin_cache, vllm_rope.cos_sin_cache
    # the table covers every position asked for; vLLM's, the M positions
    assert ours.shape[0] == max(max_position, scale_len) and theirs.shape[0] == scale_len
    torch.testing.assert_close(ours[:scale_len], theirs, rtol=0, atol=0)


def test_entry_point_loads_register():
    from importlib.metadata import entry_points

    from yarnlib.vllm import plugin

    found = [e for e in entry_points(group="vllm.general_plugins") if e.value.startswith("yarnlib")]
    if not found:
        pytest.skip("the yarnlib vllm.general_plugins entry point is not installed")
    assert found[0].load() is plugin.register


def test_a_folder_named_like_an_option_is_pasted_safely(
    serve_parser, tmp_path, monkeypatch, capsys
):
    from tiny_models import tiny_config

    tiny_config("qwen2", head_dim=32).save_pretrained(tmp_path / "-mdl")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["vllm-args", "--factor", "4", "--", "-mdl"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    argv = shlex.split(line)
    assert argv[:3] == ["vllm", "serve", "./-mdl"]
    assert serve_parser.parse_args(argv[2:]).model_tag == "./-mdl"  # a folder, not an option
