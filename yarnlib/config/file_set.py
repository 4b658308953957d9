"""Rewriting several files of one folder as a set.

Each file is replaced atomically (a flushed temporary file renamed over it), and before the
first rename a journal holding every file's text before and after is renamed into the folder.
A kill between two renames therefore leaves the journal, and ``complete`` finishes the set from
it; it also removes the temporary files that a kill during staging leaves behind.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from yarnlib import atomic

JOURNAL = ".yarnlib_journal.json"


@dataclass(frozen=True)
class Write:
    """One file of the set: its name in the folder, its text now (None: absent) and after."""

    name: str
    before: str | None
    after: str
    mode: int


def _stage(path: Path, data: bytes, mode: int) -> Path:
    """Write ``data`` to a temporary file beside ``path``, flushed to disk."""
    return atomic.stage(path, lambda fd: atomic.write_all(fd, data), mode)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(folder: Path, writes: list[Write]) -> list[Path]:
    """Replace the files of ``writes`` in ``folder``; returns their paths. An OSError before the
    first rename (a full disk) leaves the folder as it was."""
    journal = json.dumps({"files": [asdict(w) for w in writes]}, ensure_ascii=False)
    staged: list[tuple[Path, Path]] = []
    try:
        for w in writes:
            staged.append((_stage(folder / w.name, w.after.encode(), w.mode), folder / w.name))
        staged_journal = _stage(folder / JOURNAL, journal.encode(), 0o644)
    except OSError as error:
        for tmp, _ in staged:
            tmp.unlink()
        raise ValueError(f"model_dir: cannot write in {folder}: {error.strerror}") from None
    os.replace(staged_journal, folder / JOURNAL)
    _fsync_dir(folder)  # the journal is on disk before any file changes
    # os.replace swaps a symlink (an HF cache snapshot entry) for the new file: the shared
    # blob it pointed to is never written.
    for tmp, path in staged:
        os.replace(tmp, path)
    _fsync_dir(folder)
    os.unlink(folder / JOURNAL)
    return [path for _, path in staged]


def check_complete(folder: Path, command: str) -> None:
    """Refuse to read a folder whose rewrite was interrupted: its files are half old, half new."""
    if (folder / JOURNAL).exists():
        raise ValueError(
            f"model_dir: a rewrite of {folder} was interrupted ({JOURNAL} records it); run "
            f"{command} again to complete it"
        )


def complete(folder: Path, names: tuple[str, ...]) -> list[Path]:
    """Finish a set a kill interrupted and remove the temporary files of ``names`` that killed
    writes left; returns the files written."""
    if not folder.is_dir():
        return []  # the command's own checks name the problem
    prefixes = tuple(f".{name}." for name in (*names, JOURNAL))
    for path in folder.iterdir():
        if path.name.startswith(prefixes) and path.name.endswith(".tmp"):
            path.unlink()
    journal = folder / JOURNAL
    if not journal.exists():
        return []
    try:
        writes = [Write(**entry) for entry in json.loads(journal.read_bytes())["files"]]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{journal}: damaged; delete it to keep the files as they are") from None
    pending = []
    for w in writes:
        path = folder / w.name
        now = path.read_bytes() if path.exists() else None
        if now == w.after.encode():
            continue
        if now != (None if w.before is None else w.before.encode()):
            raise ValueError(
                f"{path} changed after the rewrite that {journal} records was interrupted; "
                "delete the journal to keep the files as they are now"
            )
        pending.append(w)
    if not pending:
        os.unlink(journal)
        return []
    return write(folder, pending)
