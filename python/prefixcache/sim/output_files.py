"""Output files (``--json``, ``--csv``): checked before a run, written whole after it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["check_writable", "write_text"]


def _in_place(path: Path) -> bool:
    """Whether ``path`` is written in place, not replaced: a symlink (the link stays and
    its target is written, ``/dev/stdout`` too) or an existing file that is not a regular
    one (a pipe, a device)."""
    return path.is_symlink() or (path.exists() and not path.is_file())


def _named(path: str | Path, e: OSError) -> OSError:
    """``e``'s reason in an error whose message names ``path``."""
    return OSError(f"{path}: {e.strerror or e}")


def check_writable(path: str | Path) -> None:
    """Raise OSError (naming ``path``) unless a file can be written there: a new file can
    be made in its directory (which a permission check alone does not show on a read-only
    or special file system), or it is a link or a special file (a pipe,
    ``/dev/stdout``) that can be opened for writing."""
    p = Path(path)
    target = Path(os.path.realpath(p))
    if target.is_dir():
        raise OSError(f"{path}: is a directory")
    if not target.parent.is_dir():
        raise OSError(f"{path}: directory {target.parent} does not exist")
    if target.exists() and not os.access(target, os.W_OK):
        raise OSError(f"{path}: not writable")
    if _in_place(p):
        return
    try:
        with tempfile.TemporaryFile(dir=target.parent):
            pass
    except OSError as e:
        raise _named(path, e) from None


def write_text(path: str | Path, text: str) -> None:
    """Writes ``text`` (UTF-8, line ends as given) to ``path`` whole: a regular or new file
    is written under a temporary name beside it and renamed over it, so that a failure
    (a full disk, an interrupt) leaves the old file or none, never a part; a link or a
    special file is written in place. Errors name ``path``."""
    p = Path(path)
    try:
        if _in_place(p):
            with p.open("w", encoding="utf-8", newline="") as f:
                f.write(text)
            return
        mode = p.stat().st_mode & 0o777 if p.exists() else _new_file_mode()
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            os.chmod(tmp, mode)
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise _named(path, e) from None


def _new_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0o666 less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask
