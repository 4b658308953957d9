"""The ``yarnlib eval`` commands end to end on a tiny model: outputs, resume, bad input."""

import json
import shutil
import signal
from itertools import pairwise

import pytest
from test_eval_support import corpus_text, text_dataset, tiny_folder

import yarnlib.eval.cli as eval_cli
from yarnlib.cli import main
from yarnlib.eval.methods import check_methods, parse_methods
from yarnlib.eval.store import CellStore, settings_id
from yarnlib.models import load_config
from yarnlib.spec_file import write_spec_file


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # sharp logits (initializer_range 0.5): the methods' perplexities differ by far more
    # than rounding, so a method that is never applied shows
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", initializer_range=0.5)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return text_dataset(tmp_path_factory.mktemp("data"), {"a": 600, "b": 500, "c": 60})


def ppl(model_dir, data_dir, out, *extra):
    return main(
        ["eval", "perplexity", "--model", str(model_dir), "--dataset", str(data_dir),
         "--methods", "none,yarn:2,dynamic_yarn:2", "--lengths", "128,384",
         "--samples", "2", "--output", str(out), *extra]
    )  # fmt: skip


def cells(out):
    return [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]


def test_perplexity_outputs_and_resume(model_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "ppl"
    assert ppl(model_dir, data_dir, out, "--max-cells", "2") == 0  # "killed" after 2 cells
    first = cells(out)
    # none's two lengths share a forward, so the run stops after that group
    assert [(c["method"], c["length"]) for c in first] == [("none", 128), ("none", 384)]
    assert "rerun with --resume" in capsys.readouterr().out
    assert ppl(model_dir, data_dir, out, "--resume") == 0
    assert "computed 4 cells" in capsys.readouterr().out  # only the missing ones
    final = cells(out)
    assert final[:2] == first and len(final) == 6
    result = json.loads((out / "perplexity.json").read_text())
    assert len(result["cells"]) == 6
    for cell in result["cells"]:
        assert cell["tokens_per_s"] > 0 and cell["peak_memory_mb"] > 0
        # the 60-word document is shorter than 384 tokens: skipped and counted
        assert cell["samples"] == 2
    assert {c["skipped_short_documents"] for c in result["cells"] if c["length"] == 384} == {1}
    assert (out / "perplexity.csv").read_text().count("\n") == 7
    assert (out / "perplexity.png").stat().st_size > 0
    value = {(c["method"], c["length"]): c["perplexity"] for c in result["cells"]}
    beyond = sorted(value[m, 384] for m in ("none", "yarn:2", "dynamic_yarn:2"))
    assert min(b / a - 1 for a, b in pairwise(beyond)) > 1e-3, beyond
    # within L, dynamic YaRN is plain RoPE
    assert value["dynamic_yarn:2", 128] == pytest.approx(value["none", 128], rel=1e-6)
    assert value["yarn:2", 128] != pytest.approx(value["none", 128], rel=1e-3)
    # a resumed run with everything done computes nothing; without --resume it starts over
    assert ppl(model_dir, data_dir, out, "--resume") == 0
    assert "computed 0 cells" in capsys.readouterr().out


def test_a_run_killed_inside_a_cell_resumes_from_its_last_document(
    model_dir, data_dir, tmp_path, monkeypatch
):
    import yarnlib.eval.perplexity as perplexity

    forward = perplexity.token_nlls
    calls = []

    def killed_at_the_second(model, ids, *args):
        calls.append(len(ids))
        if len(calls) == 2:
            raise KeyboardInterrupt  # a kill after the first document of the first cell
        return forward(model, ids, *args)

    monkeypatch.setattr(perplexity, "token_nlls", killed_at_the_second)
    assert ppl(model_dir, data_dir, tmp_path / "cut", "--methods", "yarn:2") == 130
    assert cells(tmp_path / "cut") == []  # no cell finished
    calls.clear()
    assert ppl(model_dir, data_dir, tmp_path / "cut", "--methods", "yarn:2", "--resume") == 0
    assert calls == [384]  # only the second document: the first came from the document store
    monkeypatch.setattr(perplexity, "token_nlls", forward)
    assert ppl(model_dir, data_dir, tmp_path / "whole", "--methods", "yarn:2") == 0
    resumed, whole = cells(tmp_path / "cut"), cells(tmp_path / "whole")
    for cut, full in zip(resumed, whole, strict=True):
        assert cut["nll"] == full["nll"] and cut["tokens"] == full["tokens"]
    assert [c["resumed_tokens"] for c in resumed] == [384, 384] and whole[0]["resumed_tokens"] == 0


def test_passkey_outputs_and_resume(model_dir, tmp_path, capsys):
    out = tmp_path / "pk"
    args = ["eval", "passkey", "--model", str(model_dir), "--methods", "none,yarn:2",
            "--lengths", "200,300", "--depths", "0.2,0.8", "--trials", "2",
            "--max-new-tokens", "3", "--layout", "classic", "--output", str(out)]  # fmt: skip
    assert main([*args, "--max-cells", "3"]) == 0
    assert len(cells(out)) == 3
    assert main([*args, "--resume"]) == 0
    assert "computed 5 cells" in capsys.readouterr().out
    result = json.loads((out / "passkey.json").read_text())
    assert len(result["cells"]) == 8
    trials = (out / "passkey_trials.jsonl").read_text().splitlines()  # every trial, once
    assert sorted(json.loads(t)["trial"] for t in trials) == [0] * 8 + [1] * 8
    cell = result["cells"][0]
    assert cell["trials"] == 2 and 0 <= cell["accuracy"] <= 1 and len(cell["answers"]) == 2
    assert (out / "passkey.png").stat().st_size > 0


def test_an_edited_spec_file_recomputes_its_own_row_only(model_dir, data_dir, tmp_path, capsys):
    native = check_methods(load_config(str(model_dir)), parse_methods("none"))
    yarn = native.replace(method="yarn", factor=2.0)
    kept = write_spec_file(tmp_path / "kept.json", yarn.replace(beta_fast=16.0))
    edited = write_spec_file(tmp_path / "edited.json", yarn.replace(attention_factor=1.1))
    out = tmp_path / "ppl"
    args = ["eval", "perplexity", "--model", str(model_dir), "--dataset", str(data_dir),
            "--methods", "yarn:2", "--spec", str(kept), str(edited), "--lengths", "384",
            "--samples", "1", "--output", str(out), "--resume"]  # fmt: skip
    assert main(args) == 0
    before = {c["method"]: c for c in cells(out)}
    write_spec_file(edited, yarn.replace(attention_factor=1.3))
    capsys.readouterr()
    assert main(args) == 0
    assert "computed 1 cell;" in capsys.readouterr().out
    after = json.loads((out / "perplexity.json").read_text())
    nll = {c["method"]: c["nll"] for c in after["cells"]}
    for row in ("yarn:2", "spec:kept"):  # taken from disk
        assert nll[row] == before[row]["nll"]
    assert abs(nll["spec:edited"] - before["spec:edited"]["nll"]) > 1e-3  # attention 1.3, not 1.1
    assert after["row_settings"]["spec:edited"]["attention_factor"] == 1.3


def test_a_changed_document_is_measured_again(model_dir, tmp_path, capsys):
    data = text_dataset(tmp_path / "data", {"a": 600})
    args = ["eval", "perplexity", "--model", str(model_dir), "--dataset", str(data),
            "--methods", "none", "--lengths", "128", "--samples", "1", "--resume"]  # fmt: skip
    assert main([*args, "--output", str(tmp_path / "out")]) == 0
    (data / "a.txt").write_text(corpus_text(600, seed=5))  # same path, other text
    capsys.readouterr()
    assert main([*args, "--output", str(tmp_path / "out")]) == 0
    assert "computed 1 cell;" in capsys.readouterr().out  # not the stale cell
    assert main([*args, "--output", str(tmp_path / "fresh")]) == 0
    resumed, fresh = (cells(tmp_path / d)[-1]["nll"] for d in ("out", "fresh"))
    assert resumed == fresh


def test_the_same_text_under_another_path_is_not_measured_again(model_dir, tmp_path, capsys):
    """Cells are keyed on the tokens: a clone elsewhere resumes its folder. Cells (and finished
    documents) written while the dataset's paths were in the key (an alias) still count."""
    data = text_dataset(tmp_path / "data", {"a": 600, "b": 500})
    moved = shutil.copytree(data, tmp_path / "elsewhere")
    out = tmp_path / "out"

    def run(folder, *extra):
        capsys.readouterr()
        assert main(["eval", "perplexity", "--model", str(model_dir), "--dataset", str(folder),
                     "--methods", "none,yarn:2", "--lengths", "128,384", "--samples", "2",
                     "--output", str(out), "--resume", *extra]) == 0  # fmt: skip
        return capsys.readouterr().out

    assert "computed 4 cells" in run(data)
    assert "computed 0 cells" in run(moved)
    result = json.loads((out / "perplexity.json").read_text())
    assert result["dataset"] == [str(moved)] and "dataset" not in result["settings"]
    keyed = result["settings"]
    old_id = settings_id({**keyed, "dataset": [str(data)]})
    for name in ("cells.jsonl", "perplexity_documents.jsonl"):
        lines = [json.loads(x) for x in (out / name).read_text().splitlines()]
        assert {r["settings_id"] for r in lines} == {settings_id(keyed)}
        (out / name).write_text("".join(json.dumps({**r, "settings_id": old_id}) + "\n"
                                        for r in lines))  # fmt: skip
    assert "computed 0 cells" in run(data)
    assert "computed 4 cells" in run(moved)  # the old key names `data`'s paths


def test_fewer_long_documents_than_samples_are_said(model_dir, tmp_path, capsys):
    data = text_dataset(tmp_path / "data", {"a": 600, "b": 200})  # one of them reaches 384
    args = ["eval", "perplexity", "--model", str(model_dir), "--dataset", str(data),
            "--methods", "none", "--lengths", "128,384", "--samples", "2",
            "--output", str(tmp_path / "out")]  # fmt: skip
    capsys.readouterr()
    assert main(args) == 0
    out, err = capsys.readouterr()
    warning = "warning: samples: 2 requested, but too few documents are that long: 1 at 384 tokens;"
    assert warning in err
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert rows["samples"] == ["2", "1"]  # the table says how many each length used


@pytest.fixture
def no_weights(monkeypatch):
    """Bad input must fail before any weights load."""

    def refuse(*args, **kwargs):
        raise AssertionError("weights loaded before the input was validated")

    monkeypatch.setattr(eval_cli, "load_model", refuse)


@pytest.mark.parametrize(
    "change,message",
    [
        (["--lengths", "128,100000"], "lengths: 100000 tokens is longer than every document"),
        (["--methods", "none,yarn:0.5"], "factor must be >= 1"),
        (["--methods", "none,rope9"], "method: unknown RoPE scaling method 'rope9'"),
        (["--methods", "yarn:x"], "methods: factor 'x'"),
        (["--samples", "0"], "samples must be a positive integer"),
        (["--dtype", "int8"], "dtype: 'int8'; allowed: float32"),
    ],
)
def test_bad_perplexity_input(model_dir, data_dir, tmp_path, no_weights, capsys, change, message):
    args = ["eval", "perplexity", "--model", str(model_dir), "--dataset", str(data_dir),
            "--output", str(tmp_path), "--lengths", "128", *change]  # fmt: skip
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_unknown_dataset_column(model_dir, tmp_path, no_weights, capsys):
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"content": "the king"}) + "\n")
    args = ["eval", "perplexity", "--model", str(model_dir), "--dataset", str(data),
            "--text-column", "body", "--output", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "text_column: 'body' not in" in err and "['content']" in err


def test_model_without_rope_is_refused(tmp_path, no_weights, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2)).save_pretrained(tmp_path / "gpt2")
    args = ["eval", "passkey", "--model", str(tmp_path / "gpt2"), "--methods", "yarn:2",
            "--output", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    assert "model_type 'gpt2' cannot be patched; supported: llama" in capsys.readouterr().err


def test_passkey_length_shorter_than_the_prompt(model_dir, tmp_path, no_weights, capsys):
    args = ["eval", "passkey", "--model", str(model_dir), "--lengths", "20",
            "--output", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    assert "lengths: 20 is shorter than the prompt's" in capsys.readouterr().err


def test_output_naming_a_file_or_cells_being_a_folder(
    model_dir, data_dir, tmp_path, no_weights, capsys
):
    taken = tmp_path / "results.txt"
    taken.write_text("keep me")
    assert ppl(model_dir, data_dir, taken) == 2
    assert f"output: {taken} cannot be a results folder" in capsys.readouterr().err
    assert taken.read_text() == "keep me"
    (tmp_path / "out" / "cells.jsonl").mkdir(parents=True)
    for extra in ([], ["--resume"]):
        assert ppl(model_dir, data_dir, tmp_path / "out", *extra) == 2
        assert (
            "cells.jsonl is not a file; allowed: cells.jsonl as a file" in capsys.readouterr().err
        )


@pytest.mark.parametrize("line", ["[1, 2]", "null", '{"method": "none", "length": 128}'])
def test_resume_refuses_a_line_that_is_no_cell(
    model_dir, data_dir, tmp_path, no_weights, capsys, line
):
    (tmp_path / "cells.jsonl").write_text('{"method": "none", "len\n' + line + "\n")
    assert ppl(model_dir, data_dir, tmp_path, "--resume") == 2
    err = capsys.readouterr().err
    assert f"resume: {tmp_path / 'cells.jsonl'}:2 is not a cell record (missing " in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_cell_after_a_cut_short_line_starts_a_new_line(tmp_path):
    store = CellStore(tmp_path, ("method", "length"), {"model": "m"}, resume=False)
    store.add({"method": "none", "length": 128, "ppl": 9.5})
    with (tmp_path / "cells.jsonl").open("a") as f:
        f.write('{"method": "yarn:2", "length": 128, "pp')  # killed during this append
    resumed = CellStore(tmp_path, ("method", "length"), {"model": "m"}, resume=True)
    resumed.add({"method": "yarn:2", "length": 128, "ppl": 8.25})
    again = CellStore(tmp_path, ("method", "length"), {"model": "m"}, resume=True)
    assert again.done == resumed.done and len(again.done) == 2  # none recomputed next time


def test_ctrl_c_says_where_the_cells_are_and_how_to_resume(
    model_dir, data_dir, tmp_path, monkeypatch, capsys, ctrl_c
):
    add = CellStore.add

    def add_then_interrupt(self, record):  # Ctrl-C right after the first cell is stored
        add(self, record)
        if self.path.name == "cells.jsonl":  # not a document of it (perplexity_documents)
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(CellStore, "add", add_then_interrupt)
    try:
        code = ppl(model_dir, data_dir, tmp_path, "--lengths", "128")
    except KeyboardInterrupt:  # escaping, it would also stop this pytest session
        pytest.fail("Ctrl-C escaped as a KeyboardInterrupt traceback")
    assert code == 130
    err = capsys.readouterr().err
    assert f"interrupted: finished cells are in {tmp_path / 'cells.jsonl'}; rerun" in err
    assert "--resume" in err and "Traceback" not in err
    assert [c["method"] for c in cells(tmp_path)] == ["none"]


def test_negative_distractors_name_the_option(model_dir, tmp_path, no_weights, capsys):
    args = ["eval", "passkey", "--model", str(model_dir), "--distractors", "-3",
            "--output", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    assert "distractors must be an integer in [0, " in capsys.readouterr().err


def test_report_writes_every_finished_row_and_computes_nothing(
    model_dir, data_dir, tmp_path, capsys, monkeypatch
):
    """Spec rows run one per invocation (benchmarks/passkey_smollm2.sh) leave passkey.json with
    the last invocation's spec row only; ``--report`` naming them all writes all their finished
    cells, loads no weights and leaves the cells files as they were (no --resume needed)."""
    native = check_methods(load_config(str(model_dir)), parse_methods("none"))
    yarn = native.replace(method="yarn", factor=2.0)
    specs = [write_spec_file(tmp_path / f"{name}.json", yarn.replace(beta_fast=b))
             for name, b in (("a", 16.0), ("b", 64.0))]  # fmt: skip
    ppl_out = tmp_path / "ppl"
    assert ppl(model_dir, data_dir, ppl_out, "--max-cells", "1") == 0
    before = (ppl_out / "cells.jsonl").read_bytes()
    out = tmp_path / "pk"
    common = ["eval", "passkey", "--model", str(model_dir), "--lengths", "200", "--depths",
              "0.2,0.8", "--trials", "1", "--max-new-tokens", "3", "--layout", "classic",
              "--output", str(out)]  # fmt: skip
    for spec in specs:
        assert main([*common, "--methods", "yarn:2", "--spec", str(spec), "--resume"]) == 0
    last = {c["method"] for c in json.loads((out / "passkey.json").read_text())["cells"]}
    assert last == {"yarn:2", "spec:b"}
    # the results name the rows asked for, method rows as spec rows (yarn:2 is in the folder)
    assert main([*common, "--methods", "", "--spec", str(specs[0]), "--resume"]) == 0
    assert {c["method"] for c in json.loads((out / "passkey.json").read_text())["cells"]} == {
        "spec:a"
    }
    kept = {f: (out / f).read_bytes() for f in ("cells.jsonl", "passkey_trials.jsonl")}

    def refuse(*args, **kwargs):
        raise AssertionError("--report loaded weights")

    monkeypatch.setattr(eval_cli, "load_model", refuse)
    report = [*common, "--methods", "yarn:2", "--spec", *map(str, specs), "--report"]
    report[report.index("200")] = "200,300"  # 300 was never run
    capsys.readouterr()
    assert main(report) == 0
    said = capsys.readouterr().out
    assert "computed 0 cells" in said and "stopped with 6 of 12 cells done" in said
    result = json.loads((out / "passkey.json").read_text())["cells"]
    assert sorted((c["method"], c["depth"]) for c in result) == [
        (m, d) for m in ("spec:a", "spec:b", "yarn:2") for d in (0.2, 0.8)
    ]
    assert {f: (out / f).read_bytes() for f in kept} == kept

    assert ppl(model_dir, data_dir, ppl_out, "--report") == 0
    done = json.loads((ppl_out / "perplexity.json").read_text())["cells"]
    assert [(c["method"], c["length"]) for c in done] == [("none", 128), ("none", 384)]
    assert (ppl_out / "cells.jsonl").read_bytes() == before
    args = ["eval", "perplexity", "--model", str(model_dir), "--dataset", str(data_dir),
            "--methods", "yarn:2", "--lengths", "128", "--samples", "2", "--output", str(ppl_out),
            "--report"]  # fmt: skip
    assert main(args) == 0  # none is finished in the folder, not asked for
    assert json.loads((ppl_out / "perplexity.json").read_text())["cells"] == []
