"""One CLI a newcomer can guess: --version, defaults shown in every --help."""

import os
import re
from argparse import SUPPRESS
from pathlib import Path

import pytest

from yarnlib import __version__
from yarnlib.cli import build_parser, main
from yarnlib.config import current_spec


def subcommand_parsers(parser=None, prefix=()):
    """(words, parser) for every subcommand, nested ones (eval perplexity) included."""
    parser = parser or build_parser()
    for action in parser._actions:
        for name, sub in getattr(action, "choices", None).items() if action.nargs == "A..." else ():
            yield (*prefix, name), sub
            yield from subcommand_parsers(sub, (*prefix, name))


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"yarnlib {__version__}"


def test_every_help_shows_the_defaults_it_does_not_say():
    parsers = dict(subcommand_parsers())
    assert {("eval", "perplexity"), ("config",), ("plan",), ("finetune",)} <= set(parsers)
    for words, parser in parsers.items():
        text = "".join(parser.format_help().split())  # help wraps long words too
        for action in parser._actions:
            default = action.default
            if not action.option_strings or default in (None, False, SUPPRESS):
                continue
            if not action.help or "default" in action.help:  # says its default in its own words
                continue
            if isinstance(default, str | int | float) and default is not True:
                assert "".join(f"{default}".split()) in text, (words, action.dest, default)
    # a default the help text did not state before
    assert "(default: 2.0)" in parsers["eval", "perplexity"].format_help()  # --factor


def test_a_crash_from_a_shell_is_not_a_verdict(monkeypatch, capsys):
    """check-rollout's exit 1 means 'above tolerance' and 2 'bad input': from a shell an
    unexpected error exits 70 with its traceback; called from Python it raises."""
    import yarnlib.inspect_cli as inspect_cli

    def crash(args):
        raise RuntimeError("engine died")

    monkeypatch.setattr(inspect_cli, "run", crash)
    with pytest.raises(RuntimeError, match="engine died"):
        main(["inspect", "--factor", "4"])
    monkeypatch.setattr("sys.argv", ["yarnlib", "inspect", "--factor", "4"])
    assert main() == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: engine died" in err
    assert err.strip().splitlines()[-1] == "yarnlib inspect: internal error (exit 70)"


# -- the model argument: one grammar ------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from test_eval_support import tiny_folder

    return tiny_folder(tmp_path_factory.mktemp("grammar") / "model")


def hub_cache(root, repo_id: str, source) -> None:
    """A hub id's snapshot laid out as huggingface_hub's cache keeps it (refs/main names the
    revision; snapshots/<revision>/ holds links to blobs), read back by snapshot_download."""
    import shutil

    repo = root / "hub" / f"models--{repo_id.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    (repo / "blobs").mkdir()
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for path in source.iterdir():
        blob = repo / "blobs" / path.name
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(blob)


@pytest.mark.parametrize(
    "command", [["config"], ["inspect"], ["vllm-args", "--factor", "2", "--json"]]
)
def test_the_model_positionally_or_by_option_gives_the_same(folder, capsys, command):
    outputs = []
    for model in ([str(folder)], ["--model", str(folder)]):
        assert main([*command[:1], *model, *command[1:]]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0]
    assert main([*command[:1], str(folder), "--model", str(folder), *command[1:]]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main([*command[:1], str(folder), "--model", str(folder.parent), *command[1:]])
    assert refused.value.code == 2
    assert "model: given twice" in capsys.readouterr().err


def test_a_missing_model_names_what_is_allowed(capsys):
    for command in (["config"], ["vllm-args", "--factor", "2"]):
        with pytest.raises(SystemExit) as refused:
            main(command)
        assert refused.value.code == 2
        err = capsys.readouterr().err
        assert f"yarnlib {command[0]}: error: model: missing" in err and "'smollm2'" in err


def test_a_hub_id_is_read_from_the_local_cache_only(folder, tmp_path, monkeypatch, capsys):
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "yarnlib", "config", "acme/tiny-llama"]
    missing = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert missing.returncode == 2
    assert "'acme/tiny-llama' is not a folder and not in the local Hugging Face cache" in (
        missing.stderr
    )
    hub_cache(tmp_path, "acme/tiny-llama", folder)
    found = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert found.returncode == 0 and "acme--tiny-llama/snapshots/" in found.stdout
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    for command in (["config"], ["vllm-args", "--factor", "2", "--json"]):
        assert main([command[0], "acme/tiny-llama", *command[1:]]) == 0
        by_id = capsys.readouterr().out
        assert main([command[0], str(folder), *command[1:]]) == 0
        by_folder = capsys.readouterr().out
        snapshot = next((tmp_path / "hub").glob("models--acme--tiny-llama/snapshots/*"))
        assert by_id.replace(str(snapshot), "F") == by_folder.replace(str(folder), "F")


def test_smollm2_names_its_cached_folder_which_config_never_rewrites_in_place(
    folder, tmp_path, monkeypatch, capsys
):
    import shutil

    monkeypatch.setenv("YARNLIB_CACHE", str(tmp_path))
    cached = tmp_path / "smollm2-135m-instruct"  # where the GGUF's conversion is kept
    shutil.copytree(folder, cached)
    before = (cached / "config.json").read_bytes()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").mkdir()  # a folder of that name here: the name still means the model
    assert main(["config", "smollm2"]) == 0
    assert capsys.readouterr().out.startswith(f"{cached}: llama")
    assert main(["config", "smollm2", "--factor", "4", "--in-place"]) == 2
    assert "--output DIR" in capsys.readouterr().err
    assert (cached / "config.json").read_bytes() == before
    assert main(["config", "smollm2", "--factor", "4", "--output", str(tmp_path / "x4")]) == 0
    assert current_spec(tmp_path / "x4").factor == 4.0


def test_eval_tune_and_finetune_take_the_model_the_same_way():
    from yarnlib.finetune.cli import parse_args as finetune_args

    rest = {
        "eval perplexity": ["--lengths", "512"],
        "eval passkey": ["--lengths", "512"],
        "eval ruler": ["--lengths", "512"],
        "tune": ["--target-length", "512", "--dataset", "d", "--output", "o"],
        "finetune": ["--dataset", "d", "--seq-len", "64", "--steps", "1", "--output", "o"],
    }
    for command, options in rest.items():
        for model in (["M"], ["--model", "M"]):
            argv = [*command.split(), *model, *options]
            assert build_parser().parse_args(argv).model == "M"
    # `accelerate launch -m yarnlib.finetune` parses the same arguments
    assert finetune_args(["M", *rest["finetune"]]).model == "M"
    with pytest.raises(SystemExit):
        finetune_args(rest["finetune"])


def test_plan_takes_the_model_the_same_way_and_counts_its_nouns(folder, capsys):
    outputs = []
    for model in ([str(folder)], ["--model", str(folder)], [str(folder / "config.json")]):
        assert (
            main(["plan", *model, "--context", "512", "--gpus", "1", "--gpu-memory", "80GiB"]) == 0
        )
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2]
    assert "1 GPU × 1 node," in outputs[0]


def test_the_docs_table_lists_every_subcommands_arguments():
    """docs/cli.md's table is the parsers' own: a flag added or renamed shows here."""
    text = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0] != "`--method`":
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    leaves = {
        " ".join(words): parser
        for words, parser in subcommand_parsers()
        if not any(a.nargs == "A..." for a in parser._actions)
    }
    assert set(leaves) <= set(rows), set(leaves) - set(rows)
    for name, parser in leaves.items():
        positional, options = rows[name]
        flags = {o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")}
        assert flags == set(re.findall(r"`(--?[\w-]+)`", options)), name
        names = [a.metavar or a.dest for a in parser._actions if not a.option_strings]
        assert positional == (", ".join(names) or "–"), name


def test_a_librarys_warning_is_one_line_without_a_source_path(tmp_path):
    """What a library warns about reaches the user as `warning: Category: text`."""
    import subprocess
    import sys

    code = (
        "import sys, warnings, yarnlib.inspect_cli as i\n"
        "run = i.run\n"
        "def warn_then_run(args):\n"
        "    warnings.warn('the weights are tied', UserWarning)\n"
        "    return run(args)\n"
        "i.run = warn_then_run\n"
        "from yarnlib.cli import main\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "inspect", "--factor", "2", "--rotary-dim", "8",
         "--original-max-position-embeddings", "64"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "warning: UserWarning: the weights are tied"
