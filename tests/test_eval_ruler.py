"""``yarnlib eval ruler``: lm-eval's RULER tasks offline on a tiny model, scored for real."""

import json
import random

import numpy as np
import pytest
from lm_eval.api.model import LM
from lm_eval.tasks._yaml_loader import load_yaml
from test_eval_support import corpus_text, tiny_folder

from yarnlib.cli import main
from yarnlib.eval import ruler
from yarnlib.eval.methods import check_methods, parse_methods
from yarnlib.eval.stats import wilson
from yarnlib.models import load_config
from yarnlib.spec_file import write_spec_file

LENGTH = 512  # the tiny model's original context is 256
MARKER = "Zanzibar porcupines juggle lanterns at dawn."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # sharp logits (initializer_range 0.5): a scaling applied differently changes the answers
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", initializer_range=0.5)


class Answering(LM):
    """An lm-eval model that answers every RULER prompt with ``answer(expected values)``:
    it reads the values from the document lm-eval hands it with the request."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def generate_until(self, requests, disable_tqdm: bool = False):
        return [self.answer(request.doc["outputs"]) for request in requests]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("RULER asks for generations only")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("RULER asks for generations only")


@pytest.fixture(scope="module")
def haystack_dir(tmp_path_factory):
    """A haystack whose every paragraph carries a sentence found nowhere in RULER."""
    folder = tmp_path_factory.mktemp("haystack")
    paragraphs = [MARKER + " " + corpus_text(60, seed=i) for i in range(40)]  # cut from its start
    (folder / "plays.txt").write_text("\n\n".join(paragraphs))
    return folder


def built(task, model_dir, haystack_dir=None, samples=3, length=LENGTH, qa_dir=None):
    ruler.ensure_sentence_splitter()
    haystack = ruler.Haystack.load([str(haystack_dir)]) if haystack_dir else None
    return ruler.build_task(task, length, samples, str(model_dir), 0, haystack, qa_dir)


@pytest.mark.parametrize(
    ("task", "length"),
    [
        ("niah_single_1", LENGTH),
        ("niah_multivalue", 1024),
        ("niah_multikey_2", LENGTH),
        ("ruler_fwe", 1024),  # its generator is called without num_samples
    ],
)
def test_perfect_answers_score_one_and_none_zero(task, length, model_dir, haystack_dir):
    """(essay tasks need room for 4 needles in the tiny tokenizer's long tokens: 1024)"""
    task_obj = built(task, model_dir, haystack_dir, length=length)
    perfect = ruler.evaluate_cell(Answering(" ".join), task_obj, task, length, 3)
    assert perfect["scores"] == [1.0, 1.0, 1.0] and perfect["score"] == 1.0
    assert (perfect["ci_low"], perfect["ci_high"]) == (round(wilson(3, 3)[0], 4), 1.0)
    silent = ruler.evaluate_cell(Answering(lambda values: ""), task_obj, task, length, 3)
    assert silent["scores"] == [0.0, 0.0, 0.0] and (silent["ci_low"], silent["ci_high"]) == (
        0.0,
        round(wilson(0, 3)[1], 4),
    )
    assert silent["prompts_id"] == perfect["prompts_id"]  # one task object, the same prompts
    assert max(perfect["ruler_length"]) <= length


def test_partial_answers_get_partial_credit(model_dir, haystack_dir):
    """niah_multivalue asks for 4 values: naming 2 of them scores 0.5 (string_match_all)."""
    task_obj = built("niah_multivalue", model_dir, haystack_dir, length=1024)
    expected = [len(doc["outputs"]) for doc in task_obj.dataset["test"]]
    assert expected == [4, 4, 4]
    half = ruler.evaluate_cell(Answering(lambda v: " ".join(v[:2])), task_obj, "niah_multivalue",
                               1024, 3)  # fmt: skip
    assert half["scores"] == [0.5, 0.5, 0.5]
    # the interval of a 0/1 rate with the same mean: at least as wide as the partial credit's
    assert (half["ci_low"], half["ci_high"]) == tuple(round(b, 4) for b in wilson(1.5, 3))


def test_the_prompts_are_the_first_of_lm_evals_own(model_dir):
    """Generating only the prompts answered gives exactly the first ones lm-eval's own dataset
    function generates (500 of them) from the same seed."""
    task = "niah_single_1"
    ours = built(task, model_dir, samples=2).dataset["test"]
    config = load_yaml(ruler.task_configs()[task])
    seed = ruler.cell_seed(0, task, LENGTH)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    theirs = config["custom_dataset"](tokenizer=str(model_dir), max_seq_lengths=[LENGTH])["test"]
    assert len(theirs) == 500 and len(ours) == 2
    assert [d["input"] for d in ours] == theirs[:2]["input"]
    assert [d["outputs"] for d in ours] == theirs[:2]["outputs"]


def test_the_haystack_replaces_the_essays(model_dir, haystack_dir, tmp_path):
    """RULER's essay haystack grows by 500 words: at 2048 tokens of the tiny tokenizer the
    prompts hold 500 words of the haystack, the marker sentence several times."""
    task_obj = built("niah_single_2", model_dir, haystack_dir, samples=2, length=2048)
    for doc in task_obj.dataset["test"]:
        assert doc["input"].count(MARKER) >= 5 and doc["outputs"][0] in doc["input"]
    other = tmp_path / "other.txt"
    other.write_text(corpus_text(3000, seed=99))
    docs = built("niah_single_2", model_dir, other, samples=2, length=2048).dataset["test"]
    assert all(MARKER not in d["input"] and "Zanzibar" not in d["input"] for d in docs)
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    with pytest.raises(ValueError, match="haystack: .* holds no text"):
        ruler.Haystack.load([str(empty)])


def test_qa_runs_on_the_file_in_qa_dir(model_dir, tmp_path):
    """SQuAD's layout (dev-v2.0.json), made by hand: the prompts hold its paragraphs and the
    answers are its answers."""
    paragraphs = [
        {"context": f"The river {name} flows past the castle of {city}.",
         "qas": [{"question": f"Which castle does the {name} pass?", "is_impossible": False,
                  "answers": [{"text": city}]}]}
        for name, city in [("Arno", "Pisa"), ("Tiber", "Rome"), ("Elbe", "Dresden")]
    ]  # fmt: skip
    squad = {"data": [{"paragraphs": paragraphs}]}
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(squad))
    docs = built("ruler_qa_squad", model_dir, samples=2, qa_dir=tmp_path).dataset["test"]
    assert len(docs) == 2
    for doc in docs:
        assert doc["outputs"][0] in {"Pisa", "Rome", "Dresden"}
        assert "flows past the castle of " + doc["outputs"][0] in doc["input"]


def test_effective_length_and_threshold():
    rows = [
        {"method": m, "length": n, "score": s}
        for m, scores in {"none": (0.9, 0.8, 0.2), "yarn:4": (0.85, 0.8, 0.79)}.items()
        for n, s in zip((4096, 8192, 16384), scores, strict=True)
    ]
    threshold = ruler.default_threshold(rows, 8192)
    assert threshold == 0.8  # none at its native length
    assert ruler.effective_lengths(rows, threshold) == {"none": 8192, "yarn:4": 8192}
    assert ruler.effective_lengths(rows, 0.5) == {"none": 8192, "yarn:4": 16384}
    assert ruler.effective_lengths(rows, 0.95) == {"none": None, "yarn:4": None}
    assert ruler.default_threshold(rows, 2048) is None


def ruler_cli(model_dir, out, *extra, methods="none,yarn:2", tasks="niah_single_1"):
    return main(
        ["eval", "ruler", "--model", str(model_dir), "--methods", methods, "--lengths",
         str(LENGTH), "--tasks", tasks, "--samples", "2", "--output", str(out), *extra]
    )  # fmt: skip


def cells(out):
    return [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]


def test_cli_end_to_end_resume_and_report(model_dir, haystack_dir, tmp_path, capsys):
    tasks = "niah_single_1,niah_single_2,ruler_qa_squad"
    hay = ("--haystack", str(haystack_dir), "--threshold", "0.5")
    out = tmp_path / "run"
    assert ruler_cli(model_dir, out, *hay, "--max-cells", "1", tasks=tasks) == 0
    printed = capsys.readouterr().out
    assert "ruler_qa_squad skipped: its data (dev-v2.0.json) is downloaded" in printed
    assert "rerun with --resume" in printed
    first = cells(out)
    assert ruler_cli(model_dir, out, *hay, "--resume", tasks=tasks) == 0
    assert "computed 3 cells" in capsys.readouterr().out  # only the missing ones
    resumed = cells(out)
    assert resumed[:1] == first and len(resumed) == 4
    # an uninterrupted run answers the same prompts the same way
    whole = tmp_path / "whole"
    assert ruler_cli(model_dir, whole, *hay, tasks=tasks) == 0
    key = ("method", "task", "length", "answers", "scores", "prompts_id")
    assert sorted(tuple(map(str, (c[k] for k in key))) for c in cells(whole)) == sorted(
        tuple(map(str, (c[k] for k in key))) for c in resumed
    )
    result = json.loads((out / "ruler.json").read_text())
    assert result["tasks"] == ["niah_single_1", "niah_single_2"]
    assert result["threshold"] == 0.5 and result["essay_haystack"] == str(haystack_dir)
    assert result["settings"]["haystack"] == ruler.Haystack.load([str(haystack_dir)]).content
    for cell in result["cells"]:
        assert cell["samples"] == 2 and cell["ci_low"] <= cell["score"] <= cell["ci_high"]
    averages = {(a["method"], a["length"]): a for a in result["averages"]}
    mine = [c for c in result["cells"] if c["method"] == "none"]
    assert averages["none", LENGTH]["score"] == sum(c["score"] for c in mine) / 2
    table = (out / "ruler.md").read_text()
    assert "| niah_single_2* |" in table and f"essays replaced by {haystack_dir}" in table
    assert "effective length (average ≥ 50)" in table
    assert (out / "ruler.png").stat().st_size > 0 and (out / "ruler.csv").is_file()
    # --report computes nothing and loads no weights
    assert ruler_cli(model_dir, out, *hay, "--report", tasks=tasks) == 0
    assert "computed 0 cells" in capsys.readouterr().out and cells(out) == resumed


def test_a_spec_row_equals_the_scaling_in_config_json(model_dir, tmp_path):
    native = check_methods(load_config(str(model_dir)), parse_methods("none"))
    spec = write_spec_file(tmp_path / "yarn2.json", native.replace(method="yarn", factor=2.0))
    scaled = tmp_path / "scaled"  # config.json in the form the installed transformers reads
    assert main(["config", str(model_dir), "--spec", str(spec), "--output", str(scaled)]) == 0
    assert ruler_cli(model_dir, tmp_path / "a", "--spec", str(spec), methods="") == 0
    assert ruler_cli(scaled, tmp_path / "b", methods="none") == 0
    [by_spec], [by_config] = cells(tmp_path / "a"), cells(tmp_path / "b")
    assert by_spec["method"] == "spec:yarn2" and by_config["scaling"] == "yarn"
    assert by_spec["answers"] == by_config["answers"] and by_spec["scores"] == by_config["scores"]
    # and the unscaled model answers otherwise: the comparison can fail
    assert ruler_cli(model_dir, tmp_path / "c", methods="none") == 0
    assert cells(tmp_path / "c")[0]["answers"] != by_spec["answers"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--tasks", "niah_single_9"), "tasks: niah_single_9; allowed: niah_single_1"),
        (("--threshold", "2"), "threshold: 2.0; allowed: a score in [0, 1]"),
        (("--tasks", "ruler_qa_hotpot"), "tasks: every task named was skipped"),
        (("--samples", "0"), "samples must be a positive integer"),
    ],
)
def test_bad_input_exits_2_with_one_line(model_dir, tmp_path, capsys, extra, message):
    assert ruler_cli(model_dir, tmp_path / "bad", *extra) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bad" / "cells.jsonl").exists()


def test_answers_stop_once_their_score_is_settled(model_dir):
    """RulerLM ends a greedy answer when it holds every expected string: the score is the full
    answer's, the answer a prefix of it; an answer that never finds them runs to the limit."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks.ruler.common_utils import process_results
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from yarnlib.eval.ruler_lm import RulerLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = {"until": [], "max_gen_toks": 40, "do_sample": False, "temperature": 0.0}
    prompt = corpus_text(30, seed=3)

    def answer(lm_class, expected):
        request = Instance("generate_until", {"outputs": expected}, (prompt, dict(settings)), 0)
        lm = lm_class(pretrained=model, tokenizer=tokenizer, batch_size=1, max_length=256)
        return lm.generate_until([request], disable_tqdm=True)[0]

    def score(text, expected):
        return process_results({"max_length": 4096, "outputs": expected}, [text])["4096"]

    full = answer(HFLM, [])
    words = full.split()
    expected = [words[len(words) // 3], words[len(words) // 4].upper()]  # case-insensitive
    stopped = answer(RulerLM, expected)
    assert len(stopped) < len(full) and full.startswith(stopped)
    assert score(stopped, expected) == score(full, expected) == 1.0
    assert answer(RulerLM, ["not in any answer"]) == full


def test_a_synthetic_task_alone_downloads_nothing(tmp_path):
    """lm-eval's needle module fetches nltk's punkt_tab when imported, for niah_single_1 too:
    the splitter is prepared before any task is built, whichever tasks run."""
    import os
    import subprocess
    import sys

    code = (
        "import argparse, nltk\n"
        "def refuse(*args, **kwargs): raise SystemExit('a download was attempted')\n"
        "nltk.download = refuse\n"
        "from yarnlib.eval.cli import ruler_sources\n"
        "ruler_sources(argparse.Namespace(qa_dir=None, haystack=None), ['niah_single_1'])\n"
        "import lm_eval.tasks.ruler.prepare_niah\n"
        "print('imported')\n"
    )
    env = {**os.environ, "YARNLIB_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path),
           "NLTK_DATA": str(tmp_path / "nltk_data")}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip().endswith("imported"), done.stderr[-2000:]
