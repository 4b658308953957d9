"""Writing files in folders other people may share, so that a failed run leaves them as they were.

A file is first written to a fresh name beside it (``tempfile.mkstemp``: unpredictable, created
with O_EXCL, so never opened through a symlink someone planted), flushed to disk, then renamed
over its final name. A reader sees the old file or the new one, never half of one; a full disk or
a read-only folder leaves the final name untouched and no temporary file behind. The rename
replaces a symlink at the final name instead of writing into whatever it points to.

Every failure to write is a ``ValueError`` naming the field, the file and the reason, which the
command line prints as one line (exit 2).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


def cannot_write(field: str, path: Path, error: OSError) -> ValueError:
    reason = error.strerror or str(error)
    return ValueError(f"{field}: cannot write {path} ({reason}); it was left as it was")


# read once, at import: setting the umask to read it would, for that instant, give files other
# threads create meanwhile the wrong mode
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _default_mode(path: Path) -> int:
    """The mode a plain ``open(path, "w")`` would give: an existing file's own, else the umask's
    (mkstemp makes files private, but a result file is shared like any other)."""
    if path.is_file() and not path.is_symlink():
        return path.stat().st_mode & 0o7777
    return 0o666 & ~_UMASK


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def stage(path: Path, fill: Callable[[int], None], mode: int | None = None) -> Path:
    """A temporary file beside ``path`` that ``fill(fd)`` wrote, flushed to disk; removed again
    if anything fails. Raises the OSError."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            fill(fd)
            os.fchmod(fd, _default_mode(path) if mode is None else mode)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def _replace(path: Path, fill: Callable[[int], None], field: str) -> Path:
    path = Path(path)
    tmp = None
    try:
        tmp = stage(path, fill)
        os.replace(tmp, path)
    except OSError as error:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise cannot_write(field, path, error) from None
    return path


def write_bytes(path: str | Path, data: bytes, field: str = "output") -> Path:
    """Replace ``path`` by a file holding ``data`` (see the module's docstring)."""
    return _replace(Path(path), lambda fd: write_all(fd, data), field)


def write_text(path: str | Path, text: str, field: str = "output") -> Path:
    return write_bytes(path, text.encode("utf-8"), field)


def write_with(path: str | Path, save: Callable[[BinaryIO], None], field: str = "output") -> Path:
    """Replace ``path`` by what ``save(binary file)`` writes (``torch.save``): for data too large
    to hold twice in memory."""

    def fill(fd: int) -> None:
        with os.fdopen(fd, "wb", closefd=False) as f:
            save(f)

    return _replace(Path(path), fill, field)


def write_figure(path: str | Path, fig, field: str = "plot", **savefig_kwargs) -> Path:
    """A matplotlib figure as ``path`` (its format from the suffix), replaced atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix[1:].lower() or "png", **savefig_kwargs)
    return write_bytes(path, buffer.getvalue(), field)


def refuse_symlink(path: Path, field: str = "output") -> None:
    """A file yarnlib appends to must be a plain file: appending through a link would write into
    whatever file it points to."""
    if Path(path).is_symlink():
        raise ValueError(
            f"{field}: {path} is a symlink; allowed: a plain file (yarnlib never writes through a "
            "link). Remove the link, or choose another folder"
        )


def append_text(path: str | Path, text: str, field: str = "output") -> None:
    """Append ``text`` to ``path`` (created if absent, never through a symlink), flushed to disk.
    A failed append (a full disk) is cut off again: no half line stays behind."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as error:
        refuse_symlink(path, field)  # O_NOFOLLOW's error (ELOOP) names no link
        raise cannot_write(field, path, error) from None
    try:
        size = os.fstat(fd).st_size
        try:
            write_all(fd, text.encode("utf-8"))
            os.fsync(fd)
        except OSError as error:
            os.ftruncate(fd, size)
            raise cannot_write(field, path, error) from None
    finally:
        os.close(fd)


def remove(path: Path) -> None:
    """Remove a file, a symlink (not what it points to) or a folder tree, if there is one."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def fresh_folder(path: Path) -> Path:
    """An empty folder made now at ``path``: whatever a killed run (or anyone) left under that
    name, a symlink included, is removed, never written into."""
    remove(path)
    Path(path).mkdir()
    return Path(path)


@contextlib.contextmanager
def lock_folder(folder: str | Path, field: str = "model_dir") -> Iterator[None]:
    """Hold an exclusive ``flock`` on the folder itself while rewriting it in place: another
    rewrite of the same folder meanwhile (``yarnlib config --in-place``, an integration's
    ``apply(in_place=True)``, in any process) is refused as busy rather than racing on its
    temporary files. No lock file is made, so a refused or failed run leaves the folder exactly
    as it was. A folder that cannot be opened is left to the caller's own checks; where the file
    system cannot lock a folder (NFS refuses flock on a read-only descriptor), it runs unlocked."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        if not _try_lock(fd):
            raise ValueError(
                f"{field}: {folder} is busy: another process is rewriting it in place (yarnlib "
                "config --in-place, or a recipe's apply with in_place=True); allowed: one rewrite "
                "at a time (run this one again once that one has ended)"
            )
        yield  # the lock ends with the descriptor
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    """False only when another process holds the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        return error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN)
    return True
