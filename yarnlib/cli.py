"""The ``yarnlib`` command: one entry point, one module per subcommand.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed args, returning the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module path of each subcommand, in the order `yarnlib --help` lists them
SUBCOMMANDS = [
    "yarnlib.inspect_cli",
    "yarnlib.config_cli",
    "yarnlib.vllm.args_cli",
    "yarnlib.vllm.check_rollout",
    "yarnlib.eval.cli",
    "yarnlib.finetune.cli",
    "yarnlib.tune.cli",
    "yarnlib.demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="yarnlib", description="RoPE context extension, consistent everywhere."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as error:  # bad input: the message names the field and what is allowed
        print(f"yarnlib {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
