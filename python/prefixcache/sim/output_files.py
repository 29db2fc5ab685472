"""Output files (``--json``, ``--csv``): checked before a run, written after it."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

__all__ = ["check_writable", "write_pieces", "write_text"]


def _named(path: str | Path, e: OSError) -> OSError:
    """``e``'s reason in an error whose message names ``path``."""
    return OSError(f"{path}: {e.strerror or e}")


def check_writable(path: str | Path) -> None:
    """Raise OSError (naming ``path``) unless ``path`` can be written: an existing file
    (through a link too) that is writable, or a new file that can be made in its
    directory (tried: a permission check alone does not show a read-only or special file
    system such as ``/proc``)."""
    p = Path(path)
    if p.is_dir():
        raise OSError(f"{path}: is a directory")
    if p.exists():  # through links too (``/dev/stdout`` to a pipe)
        if not os.access(p, os.W_OK):
            raise OSError(f"{path}: not writable")
        return
    target = Path(os.path.realpath(p))  # a dangling link: where its file would go
    if not target.parent.is_dir():
        raise OSError(f"{path}: directory {target.parent} does not exist")
    try:
        fd, tmp = _new_temporary(target)
    except OSError as e:
        raise _named(path, e) from None
    os.close(fd)
    os.unlink(tmp)


def write_text(path: str | Path, text: str) -> None:
    """Writes ``text`` (UTF-8, line ends as given) to ``path``. A new file is written under
    a temporary name beside it and renamed once complete, so a failure (a full disk, an
    interrupt) leaves no part of it; an existing file (or what a link names: a file, a
    pipe, ``/dev/stdout``) is written in place, keeping its owner, mode and links. Errors
    name ``path``."""
    write_pieces(path, [text])


def write_pieces(path: str | Path, pieces: Iterable[str]) -> None:
    """Writes the concatenation of ``pieces`` as :func:`write_text` writes a text, one
    piece at a time: no copy of the whole text is made, in characters or in bytes. The
    pieces are all taken, and checked to be UTF-8 encodable, before any file is
    touched."""
    parts = list(pieces)
    for part in parts:
        if not part.isascii():
            part.encode("utf-8")  # raises here, before any file is touched
    p = Path(path)
    try:
        if p.exists() or p.is_symlink():
            with p.open("wb") as f:
                _write_all(f, parts)
            return
        fd, tmp = _new_temporary(p)
        try:
            with os.fdopen(fd, "wb") as f:
                _write_all(f, parts)
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise _named(path, e) from None


def _write_all(f: BinaryIO, parts: Sequence[str]) -> None:
    for part in parts:
        f.write(part.encode("utf-8"))


def _new_temporary(path: Path) -> tuple[int, str]:
    """A new file beside ``path`` (open for writing, with the mode ``open`` gives a new
    file: 0o666 less the umask): its descriptor and name."""
    tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp"))
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
