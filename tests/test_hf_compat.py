"""The installed transformers: tested range, the warning outside it, the patch-time check."""

import warnings

import pytest
from packaging.version import Version
from tiny_models import native_rope_keys, tiny_config, tiny_model

import yarnlib
from yarnlib import hf_compat
from yarnlib.patches.patch import check_config_runs


@pytest.mark.parametrize(
    "version,tested",
    [("4.56.2", False), ("4.57.0", True), ("4.57.6", True), ("5.5.2", False), ("5.5.3", True),
     ("5.9.0", True), ("5.19.0", True), ("5.20.0", False), ("5.20.0.dev0", False)],
)  # fmt: skip
def test_tested_versions(version, tested):
    assert hf_compat.is_tested(Version(version)) is tested


def test_installed_transformers_is_tested_and_patch_is_silent():
    assert hf_compat.is_tested(hf_compat.transformers_version())
    hf_compat.warn_if_untested.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yarnlib.patch(tiny_model(), "yarn", 4.0)


def test_patch_warns_once_on_an_untested_transformers(monkeypatch):
    untested = Version(f"{hf_compat.transformers_version().major}.99.0")  # same config keys
    monkeypatch.setattr(hf_compat, "transformers_version", lambda: untested)
    hf_compat.warn_if_untested.cache_clear()
    with pytest.warns(UserWarning, match=rf"transformers {untested} is outside .*4\.57\.x"):
        yarnlib.patch(tiny_model(), "yarn", 4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yarnlib.patch(tiny_model(), "yarn", 2.0)
    hf_compat.warn_if_untested.cache_clear()


@pytest.mark.parametrize("method", ["linear", "dynamic_ntk", "yarn", "dynamic_yarn"])
def test_config_check_asks_transformers_own_rope_functions(method):
    spec = yarnlib.RopeScaling(method, 4.0, 256, 50000.0, 16)
    config = tiny_model(**native_rope_keys(spec)).config
    check_config_runs(config, spec)
    wrong = [spec.replace(rope_theta=10000.0)]  # theta dropped
    if method != "dynamic_yarn":  # its frequencies follow the length alone, not the factor
        wrong.append(spec.replace(factor=2.0))
    for other in wrong:
        with pytest.raises(ValueError, match=r"config: transformers .* reads the rope settings"):
            check_config_runs(config, other)


def test_transformers_validates_yarnlib_dynamic_yarn_through_the_spec():
    keys = native_rope_keys(yarnlib.RopeScaling("dynamic_yarn", 4.0, 256, 50000.0, 16))
    rope = keys.get("rope_parameters") or keys["rope_scaling"]
    rope["factor"] = 0.5  # registered validation: the spec's error, not a log line
    # 5.x wraps it in huggingface_hub's StrictDataclassClassValidationError
    with pytest.raises(Exception, match=r"factor must be >= 1 .* got 0\.5"):
        tiny_config(**keys)
