"""Negative controls of the vLLM parity check: vLLM configured wrongly in ways a user can hit
(YaRN's attention factor dropped, the wrong factor, a dynamic method fixed at the wrong length)
must fail ``check_rollout.compare``, and ``yarnlib check-rollout`` must then exit 1.

``controls`` runs inside test_vllm_parity.py's worker (one vLLM process, after its engines) on
that worker's tiny Llama; the tests are in test_vllm_parity.py, so that pytest-xdist's
``--dist loadfile`` keeps them on the worker that holds the findings.
"""

import json
import sys
from pathlib import Path

ORIGINAL = 256  # L of tests/tiny_models.py
LENGTH = 3 * ORIGINAL  # the prompt
FACTOR = 4.0  # max_model_len = L × s = 1024
TOLERANCE = 1e-4  # as in test_vllm_parity.py
MARGIN = 10 * TOLERANCE  # what each wrong setting must move some log-probability by
CONTROLS = ("attention_factor", "factor", "fixed_scale_length")
# longer than the prompt: a check that declared this length on the transformers side (instead
# of max_model_len) would see both engines agree
WRONG_FIXED_LENGTH = 2048


def assert_sharp(model_dir: Path) -> None:
    """The tiny model must stay sharp enough for the controls to show: on the transformers side
    alone, each wrong setting moves some log-probability by more than ``MARGIN``."""
    from yarnlib.vllm.args_cli import spec_for_model
    from yarnlib.vllm.check_rollout import prompt_ids, transformers_logprobs

    ids = prompt_ids(model_dir, LENGTH, 0, None)
    yarn = spec_for_model(model_dir, "yarn", FACTOR)
    dynamic = spec_for_model(model_dir, "dynamic_yarn", FACTOR)
    right = transformers_logprobs(model_dir, yarn, ids, 1024)
    wrong = {
        "attention_factor": transformers_logprobs(
            model_dir, yarn.replace(attention_factor=1.0), ids, 1024
        ),
        "factor": transformers_logprobs(model_dir, yarn.replace(factor=FACTOR * FACTOR), ids, 1024),
    }
    dynamic_right = transformers_logprobs(model_dir, dynamic, ids, 1024)
    dynamic_wrong = transformers_logprobs(model_dir, dynamic, ids, WRONG_FIXED_LENGTH)
    moved = {name: (right - values).abs().max().item() for name, values in wrong.items()}
    moved["fixed_scale_length"] = (dynamic_right - dynamic_wrong).abs().max().item()
    for name, delta in moved.items():
        assert delta > MARGIN, f"tiny model too flat for the {name} control: moves {delta:.1e}"


# -- run in test_vllm_parity.py's worker -----------------------------------------------------


def controls(model_dir: Path, out: Path) -> dict:
    """Each wrong setting through ``check_rollout.compare``; files go to ``out``."""
    from yarnlib import cli
    from yarnlib.config import apply, plan
    from yarnlib.vllm import check_rollout, llm_kwargs
    from yarnlib.vllm.args_cli import spec_for_model

    out.mkdir(parents=True)
    reports = {}
    yarn = spec_for_model(model_dir, "yarn", FACTOR)
    # the factor compounded (a config scaled twice): vLLM runs yarn ×16 where the actor runs ×4
    kwargs = llm_kwargs(yarn)
    kwargs["hf_overrides"]["rope_parameters"]["factor"] = FACTOR * FACTOR
    reports["factor"] = check_rollout.compare(
        model_dir, yarn, LENGTH, kwargs=kwargs, tolerance=TOLERANCE
    )
    # dynamic YaRN with the overrides printed for max_model_len 2048 in an engine of 1024
    dynamic = spec_for_model(model_dir, "dynamic_yarn", FACTOR)
    kwargs = llm_kwargs(dynamic)
    kwargs["hf_overrides"]["rope_parameters"]["fixed_scale_length"] = WRONG_FIXED_LENGTH
    reports["fixed_scale_length"] = check_rollout.compare(
        model_dir, dynamic, LENGTH, kwargs=kwargs, tolerance=TOLERANCE
    )
    # A folder rewritten for yarn ×4 whose config.json then lost YaRN's attention factor
    # (attention_factor 1: yarn's frequencies at plain RoPE's magnitude), checked with the
    # command as EasyR1's rollout loads it (no overrides).
    rewritten = out / "llama-yarn"
    apply(model_dir, plan(model_dir, yarn), output=rewritten)
    config = json.loads((rewritten / "config.json").read_text())
    config["rope_parameters"]["attention_factor"] = 1.0
    (rewritten / "config.json").write_text(json.dumps(config))
    args = ["check-rollout", str(rewritten), "--method", "yarn", "--factor", str(FACTOR),
            "--config-as-is", "--length", str(LENGTH), "--tolerance", str(TOLERANCE),
            "--json", str(out / "cli.json")]  # fmt: skip
    sys.stdout.flush()
    with open(out / "cli.out", "w") as captured:  # vLLM logs to stdout as well
        saved, sys.stdout = sys.stdout, captured
        try:
            rc = cli.main(args)
        finally:
            sys.stdout = saved
    reports["attention_factor"] = json.loads((out / "cli.json").read_text())
    cli_stdout = (out / "cli.out").read_text()
    return {"model_dir": str(model_dir), "reports": reports, "cli_rc": rc, "cli_stdout": cli_stdout}
