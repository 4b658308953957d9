"""The lm-eval model ``yarnlib`` and the packaged passkey task, end to end on a tiny model."""

import json
import sys

import pytest
from test_eval_support import tiny_folder

from yarnlib.cli import main
from yarnlib.eval.cli import PASSKEY_YAML, TASKS_DIR

TASK = """\
task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
PASSKEY = {"max_seq_lengths": [200], "depths": [0.5], "trials": 2}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    """A local task and its data file: nothing is downloaded."""
    folder = tmp_path_factory.mktemp("tasks")
    rows = [
        {"question": "the king", "choices": [" hath", " rose"], "answer": i % 2} for i in range(4)
    ]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "tiny_choice.yaml").write_text(TASK.format(data=folder / "data.jsonl"))
    return folder


def test_wrapper_runs_a_local_task_and_passkey(model_dir, task_dir):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import yarnlib.eval.lm_eval_model  # noqa: F401  (registers "yarnlib")

    args = {"pretrained": str(model_dir), "method": "yarn", "factor": 2, "device": "cpu"}
    results = simple_evaluate(
        model="yarnlib",
        model_args=args,
        tasks=["tiny_choice", "yarnlib_passkey"],
        # the task manager hands the metadata (the tokenizer's name, the lengths) to the task
        task_manager=TaskManager(
            include_path=[str(task_dir), str(TASKS_DIR)],
            include_defaults=False,  # indexing lm-eval's 14k tasks takes a minute or more
            metadata={**args, **PASSKEY},
        ),
    )
    assert 0 <= results["results"]["tiny_choice"]["acc,none"] <= 1
    assert 0 <= results["results"]["yarnlib_passkey"]["acc,none"] <= 1
    assert results["n-samples"]["yarnlib_passkey"]["effective"] == 2
    assert results["config"]["yarnlib_method"] == "yarn:2"


def test_yarnlib_eval_lm_eval_command_forwards_to_lm_eval(monkeypatch, task_dir):
    """The argv lm_eval's own CLI receives (running it indexes all of lm-eval's 14k tasks)."""
    import lm_eval.__main__

    seen = []
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: seen.append(sys.argv[1:]))
    code = main(
        ["eval", "lm-eval", "--model_args", "pretrained=smollm2,method=yarn,factor=2",
         "--tasks", "hellaswag,yarnlib_passkey", "--include_path", str(task_dir),
         "--limit", "5", "--", "--log_samples"]
    )  # fmt: skip
    assert code == 0
    argv = seen[0]
    assert argv[:4] == ["--model", "yarnlib", "--tasks", f"hellaswag,{PASSKEY_YAML}"]
    assert ["--include_path", str(task_dir)] == argv[4:6]
    assert "--limit" in argv and "--device" in argv and argv[-1] == "--log_samples"


def test_wrapper_refuses_a_bad_method(model_dir):
    from yarnlib.eval.lm_eval_model import YarnlibLM

    with pytest.raises(ValueError, match="method: unknown RoPE scaling method 'rope9'"):
        YarnlibLM(pretrained=str(model_dir), method="rope9", device="cpu")
