"""One CLI a newcomer can guess: --version, defaults shown in every --help."""

from argparse import SUPPRESS

import pytest

from yarnlib import __version__
from yarnlib.cli import build_parser, main


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
