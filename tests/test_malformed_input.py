"""Damaged or missing input files end a command with one line naming the file (exit 2), never a
traceback (issue 26, items 12-14)."""

import json

import pytest
from test_eval_support import text_dataset, tiny_folder

from yarnlib.cli import main

L, N = 128, 192
DEEP = 5000  # nesting depth beyond the JSON decoder's recursion limit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", max_position_embeddings=L)


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(f"yarnlib {command}: error: "), err
    assert not any("Traceback" in line for line in err)
    return err[-1]


def test_a_trial_without_its_objective_is_refused_by_line(model_dir, tmp_path, capsys):
    data = text_dataset(tmp_path / "data", {"a": 400})
    out = tmp_path / "tune"
    argv = ["tune", "--model", str(model_dir), "--target-length", str(N), "--dataset", str(data),
            "--samples", "1", "--budget", "2", "--space", "yarn", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    lines = (out / "trials.jsonl").read_text().splitlines()
    record = json.loads(lines[1])
    del record["objective"]
    lines[1] = json.dumps(record)
    (out / "trials.jsonl").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(argv) == 2
    line = one_line_error(capsys, "tune")
    assert "trials.jsonl:2" in line and "objective" in line


def deep_json() -> str:
    return "[" * DEEP + "]" * DEEP


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("command", ["config", "inspect", "vllm-args"])
def test_deeply_nested_model_files_are_malformed(model_dir, tmp_path, capsys, command, where):
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        (folder / name).write_bytes((model_dir / name).read_bytes())
    text = (folder / where).read_text()
    (folder / where).write_text(text.rstrip()[:-1] + f', "deep": {deep_json()}}}')
    extra = ["--factor", "2"] if command == "vllm-args" else []
    assert main([command, str(folder), *extra]) == 2
    line = one_line_error(capsys, command)
    assert where in line and "malformed" in line and "nested" in line


def test_a_deeply_nested_spec_file_is_malformed(model_dir, tmp_path, capsys):
    spec = tmp_path / "best.json"
    spec.write_text('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["config", str(model_dir), "--spec", str(spec), "--dry-run"]) == 2
    line = one_line_error(capsys, "config")
    assert "best.json" in line and "malformed" in line


def test_eval_reads_a_deeply_nested_config_as_malformed(model_dir, tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        (model_dir / "config.json").read_text().rstrip()[:-1] + f', "deep": {deep_json()}}}'
    )
    argv = ["eval", "perplexity", "--model", str(folder), "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    line = one_line_error(capsys, "eval")
    assert "config.json" in line and "malformed" in line


def test_a_missing_prompt_file_is_refused_before_any_engine_starts(model_dir, tmp_path, capsys):
    missing = tmp_path / "no-such-prompt.txt"
    argv = ["check-rollout", str(model_dir), "--factor", "2", "--length", "200",
            "--prompt-file", str(missing)]  # fmt: skip
    assert main(argv) == 2
    line = one_line_error(capsys, "check-rollout")
    assert "prompt_file" in line and str(missing) in line and "No such file" in line


def test_a_folder_without_weights_is_one_line(model_dir, tmp_path, capsys):
    folder = tmp_path / "no-weights"
    folder.mkdir()
    for path in model_dir.iterdir():
        if not path.name.endswith(".safetensors"):
            (folder / path.name).write_bytes(path.read_bytes())
    commands = {
        "eval": ["eval", "perplexity", "--model", str(folder), "--lengths", "128",
                 "--output", str(tmp_path / "out")],
        "check-rollout": ["check-rollout", str(folder), "--factor", "2", "--length", "200"],
    }  # fmt: skip
    for command, argv in commands.items():
        assert main(argv) == 2
        line = one_line_error(capsys, command)
        assert "no weights" in line and str(folder) in line and "model.safetensors" in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_check_rollout_refuses_a_head_size_the_cpu_attention_cannot_run(model_dir, capsys):
    pytest.importorskip("vllm")
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    assert head_dim == 16  # tiny_models' heads: below vLLM's CPU attention sizes
    assert main(["check-rollout", str(model_dir), "--factor", "2", "--length", "200"]) == 2
    line = one_line_error(capsys, "check-rollout")
    assert "head_dim: 16" in line and "allowed on CPU: 32, 64" in line


def test_a_tokenizer_that_encodes_nothing_is_named(model_dir, tmp_path, capsys):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "model"
    folder.mkdir()
    for path in model_dir.iterdir():
        if not path.name.startswith(("tokenizer", "special_tokens")):
            (folder / path.name).write_bytes(path.read_bytes())
    # a BPE without an unknown token drops every character it lacks: the plays become no tokens
    empty = Tokenizer(models.BPE({"\u2603": 0, "<eos>": 1}, []))
    PreTrainedTokenizerFast(tokenizer_object=empty, eos_token="<eos>").save_pretrained(folder)
    data = text_dataset(tmp_path / "data", {"a": 400, "b": 300})
    argv = ["eval", "perplexity", "--model", str(folder), "--dataset", str(data),
            "--lengths", "128", "--output", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    line = one_line_error(capsys, "eval")
    assert "tokenizer: it encodes none of the 2 documents" in line
