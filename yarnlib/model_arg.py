"""The model argument, the same in every subcommand: a local folder, a hub id already in the
local Hugging Face cache (offline), or ``smollm2``; given as the first positional argument or as
``--model`` (each command keeps the spelling it had, so old scripts still run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from yarnlib.models import SMOLLM2, smollm2_dir

MODEL_HELP = "a model folder, a hub id in the local Hugging Face cache, or 'smollm2'"


class _Model(argparse.Action):
    """Positional and ``--model`` write one field; an absent positional leaves it alone, and
    two different models are refused."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            return
        given = getattr(namespace, self.dest, None)
        if given is not None and given != values:  # said after parsing, so that an unknown
            namespace.model_conflict = (given, values)  # option before it is named instead
        setattr(namespace, self.dest, values)


def add_model_argument(
    parser: argparse.ArgumentParser, dest: str, required: bool = True, folder: bool = False
) -> None:
    """MODEL positionally or ``--model MODEL``, into ``args.<dest>``; ``folder``: the command
    reads the folder's files itself, so a name is turned into its folder (``model_folder``)."""
    parser.add_argument(dest, nargs="?", action=_Model, metavar="MODEL", help=MODEL_HELP)
    parser.add_argument(
        "--model", dest=dest, action=_Model, metavar="MODEL", help="the same as MODEL"
    )
    parser.set_defaults(
        model_field=dest, model_required=required, model_is_folder=folder, model_parser=parser
    )


def check_model_given(args: argparse.Namespace) -> None:
    field = getattr(args, "model_field", None)
    if getattr(args, "model_conflict", None):
        given, again = args.model_conflict
        args.model_parser.error(f"model: given twice ({given!r} and {again!r}); give one")
    if field and args.model_required and getattr(args, field) is None:
        args.model_parser.error(
            "model: missing; give MODEL (a folder, a cached hub id or 'smollm2')"
        )


def resolve_model_folder(args: argparse.Namespace) -> None:
    """For a command that reads the folder's files: its name becomes that folder."""
    field = getattr(args, "model_field", None)
    if field and args.model_is_folder and getattr(args, field) is not None:
        setattr(args, field, str(model_folder(getattr(args, field))))


def model_folder(name: str | Path) -> Path:
    """The folder of ``name`` on this machine: the folder itself, the cached conversion of the
    packaged SmolLM2, or a hub id's snapshot in the local cache (never the network)."""
    path = Path(name)
    if str(name) == SMOLLM2:  # as eval, tune and finetune read it; a folder so named: ./smollm2
        return smollm2_dir()
    if path.is_dir():
        return path
    if path.exists() or str(name).count("/") != 1:
        raise ValueError(f"model: {str(name)!r} is not a folder; allowed: {MODEL_HELP}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(str(name), local_files_only=True))
    except (LocalEntryNotFoundError, ValueError):
        raise ValueError(
            f"model: {str(name)!r} is not a folder and not in the local Hugging Face cache "
            "(HF_HOME); download it first (huggingface-cli download) or give its folder"
        ) from None
