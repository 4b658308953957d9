"""The ``yarnlib`` command: one entry point, one module per subcommand.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed args, returning the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
import warnings

from yarnlib import __version__, model_arg

# module path of each subcommand, in the order `yarnlib --help` lists them
SUBCOMMANDS = [
    "yarnlib.inspect_cli",
    "yarnlib.config.cli",
    "yarnlib.vllm.args_cli",
    "yarnlib.vllm.check_rollout",
    "yarnlib.eval.cli",
    "yarnlib.finetune.cli",
    "yarnlib.tune.cli",
    "yarnlib.plan.cli",
    "yarnlib.demo",
]


class DefaultsFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default, where it has one the help does not say."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, argparse.SUPPRESS)
            or not action.option_strings
            or isinstance(action, argparse._VersionAction)
        ):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else default
        return f"{text} (default: {str(shown).replace('%', '%%')})".lstrip()


class Parser(argparse.ArgumentParser):
    """Every yarnlib parser, subcommands' too, shows defaults in --help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="yarnlib", description="RoPE context extension, consistent everywhere.")
    parser.add_argument("--version", action="version", version=f"yarnlib {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        importlib.import_module(module).register(subparsers)
    return parser


# what a shell reports for a process that SIGPIPE ended, as `yes | head` does
BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE
CRASH_EXIT = 70  # sysexits' EX_SOFTWARE: an unexpected error, never a command's own verdict


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A library's warning as one line for the person at the terminal, not a source path."""
    print(f"warning: {category.__name__}: {message}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = show_warning
    args = build_parser().parse_args(argv)
    model_arg.check_model_given(args)
    try:
        model_arg.resolve_model_folder(args)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except ValueError as error:  # bad input: the message names the field and what is allowed
        print(f"yarnlib {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader stopped early (`| head`): nothing left to say
        # stdout to /dev/null, so that the exit flush of what is still buffered does not raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT
    except Exception:
        if argv is not None:  # called from Python: the caller sees the exception
            raise
        # from a shell: a crash must not read as a verdict (check-rollout's 1 = above tolerance)
        traceback.print_exc()
        print(f"yarnlib {args.command}: internal error (exit {CRASH_EXIT})", file=sys.stderr)
        return CRASH_EXIT


if __name__ == "__main__":
    sys.exit(main())
