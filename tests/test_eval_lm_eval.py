"""The lm-eval model ``yarnlib`` and the packaged passkey task, end to end on a tiny model."""

import json

import pytest
import torch
from lm_eval.tasks import TaskManager
from test_eval_support import corpus_text, tiny_folder
from tiny_models import hand_written_rope
from transformers import AutoModelForCausalLM, AutoTokenizer

from yarnlib.cli import main
from yarnlib.eval.cli import TASKS_DIR

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
    # sharp logits (initializer_range 0.5): yarn and plain RoPE differ by far more than rounding
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", initializer_range=0.5)


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


def test_loglikelihood_is_the_yarn_model_of_the_folder(model_dir):
    """YarnlibLM's log-likelihoods against plain transformers loading the same folder with
    yarn ×2 configured natively: a context beyond the original 256 tokens."""
    from lm_eval.api.instance import Instance

    from yarnlib.eval.lm_eval_model import YarnlibLM

    context, continuations = corpus_text(250), [" the king hath", " night"]
    lm = YarnlibLM(pretrained=str(model_dir), method="yarn", factor=2, device="cpu")
    requests = [Instance("loglikelihood", {}, (context, c), i) for i, c in enumerate(continuations)]
    got = [logp for logp, _ in lm.loglikelihood(requests)]
    tok = AutoTokenizer.from_pretrained(model_dir)
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256}
    native = AutoModelForCausalLM.from_pretrained(
        model_dir, **hand_written_rope({**yarn, "rope_theta": 50000.0}), max_position_embeddings=512
    )
    plain = AutoModelForCausalLM.from_pretrained(model_dir, max_position_embeddings=512)
    context_ids = tok(context)["input_ids"]
    assert 256 < len(context_ids) < 500
    for continuation, value in zip(continuations, got, strict=True):
        ids = tok(context + continuation)["input_ids"]
        assert ids[: len(context_ids)] == context_ids
        expected, unscaled = (
            continuation_logprob(model, ids, len(context_ids)) for model in (native, plain)
        )
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert abs(unscaled - expected) > 0.01  # the method matters here


def continuation_logprob(model, ids: list[int], start: int) -> float:
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits[0].double().log_softmax(-1)
    return sum(float(logp[t - 1, ids[t]]) for t in range(start, len(ids)))


class LocalTaskManager(TaskManager):
    """lm-eval's TaskManager without its 14k built-in tasks (indexing them takes 25 s or more);
    the task folder and our passkey YAML are found as in any run."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "include_defaults": False})


def test_yarnlib_eval_lm_eval_command_runs_lm_eval(monkeypatch, model_dir, task_dir, tmp_path):
    """`yarnlib eval lm-eval` through lm-eval's own parser, config and evaluator."""
    import lm_eval.tasks

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalTaskManager)
    out = tmp_path / "results"
    code = main(
        ["eval", "lm-eval", "--model_args", f"pretrained={model_dir},method=yarn,factor=2",
         "--tasks", "tiny_choice,yarnlib_passkey", "--include_path", str(task_dir),
         "--limit", "2", "--output_path", str(out), "--metadata", json.dumps(PASSKEY),
         "--", "--log_samples"]
    )  # fmt: skip
    assert code == 0
    [saved] = out.rglob("results_*.json")
    result = json.loads(saved.read_text())
    assert result["config"]["model"] == "yarnlib"
    assert result["config"]["yarnlib_method"] == "yarn:2"
    assert result["n-samples"]["tiny_choice"]["effective"] == 2
    assert result["n-samples"]["yarnlib_passkey"]["effective"] == 2
    assert 0 <= result["results"]["tiny_choice"]["acc,none"] <= 1
    assert len(list(out.rglob("samples_tiny_choice_*.jsonl"))) == 1  # the option after `--`


def test_wrapper_refuses_a_bad_method(model_dir):
    from yarnlib.eval.lm_eval_model import YarnlibLM

    with pytest.raises(ValueError, match="method: unknown RoPE scaling method 'rope9'"):
        YarnlibLM(pretrained=str(model_dir), method="rope9", device="cpu")
