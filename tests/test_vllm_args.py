"""vllm-args / llm_kwargs, the serve parser round trip, and the plugin's get_rope (no engine)."""

import json
import sys

import pytest
import torch

from yarnlib import RopeScaling, cli, convert
from yarnlib.vllm import PLUGIN_TYPES, llm_kwargs, serve_args
from yarnlib.vllm.plugin import spec_from_rope_parameters

METHODS = ["none", "linear", "ntk", "ntk_by_parts", "yarn", "dynamic_ntk", "dynamic_yarn"]


def spec(method, factor=4.0, **knobs):
    factor = 1.0 if method == "none" else factor  # none scales nothing
    return RopeScaling(method, factor, 4096, 1e6, 128, **knobs)


@pytest.mark.parametrize("method", METHODS)
def test_kwargs_carry_theta_and_limits(method):
    kwargs = llm_kwargs(spec(method))
    overrides = kwargs["hf_overrides"]
    assert overrides["rope_parameters"]["rope_theta"] == overrides["rope_theta"]
    assert kwargs["max_model_len"] == 4096 * spec(method).factor
    if method.startswith("dynamic"):
        assert overrides["rope_parameters"]["rope_type"] == PLUGIN_TYPES[method]
        # as in config.json: vLLM multiplies L by factor for types it does not know
        assert overrides["max_position_embeddings"] == 4096
        assert overrides["rope_parameters"]["fixed_scale_length"] == 4096 * 4
    else:
        assert kwargs == convert.to_vllm(spec(method))


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
def test_plugin_table_is_the_spec_at_the_fixed_length(
    plugin_get_rope, method, max_position, scale_len
):
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    _, wrapped = plugin_get_rope
    params = llm_kwargs(spec(method), max_model_len=scale_len)["hf_overrides"]["rope_parameters"]
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        rope = wrapped(128, max_position, True, params, torch.float32)  # no model config
    inv_freq, factor = spec(method).frequencies(scale_len)  # float32, no table code involved
    positions = max(max_position, scale_len)  # the table covers every position asked for
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq
    expected = torch.cat((angles.cos() * factor, angles.sin() * factor), dim=-1)
    assert torch.equal(rope.cos_sin_cache, expected)


def test_entry_point_loads_register():
    from importlib.metadata import entry_points

    from yarnlib.vllm import plugin

    found = [e for e in entry_points(group="vllm.general_plugins") if e.value.startswith("yarnlib")]
    if not found:
        pytest.skip("the yarnlib vllm.general_plugins entry point is not installed")
    assert found[0].load() is plugin.register
