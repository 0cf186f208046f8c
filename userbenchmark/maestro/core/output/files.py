"""Atomic file writes: readers see a file's old contents or its new ones, never a part. New
files get the mode ``open(path, "w")`` gives (``mkstemp``'s 0600 would hide them from
dashboards); existing ones keep theirs."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE_MODE = 0o666  # what open(path, "w") asks: the kernel takes the umask (or ACL) off
_NAME_ATTEMPTS = 100
TEMPORARY_SUFFIX = ".tmp"


def unlink_quietly(path: str | os.PathLike[str]) -> None:
    """Remove ``path``; one already gone (or not removable) is no error."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _create_temporary(path: Path) -> tuple[int, str]:
    """An exclusive new ``.NAME.<random>.tmp`` next to ``path``: (descriptor, its path)."""
    for _ in range(_NAME_ATTEMPTS):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")
        with contextlib.suppress(FileExistsError):
            return os.open(tmp, _CREATE_FLAGS, _NEW_FILE_MODE), tmp
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(path.parent))


def _write_temporary(path: Path, data: bytes) -> str:
    """``data`` in a fsynced temporary file next to ``path`` (whose folder must exist: a
    folder removed during a run is never created again); returns the temporary's path."""
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            try:
                st: os.stat_result | None = os.stat(path)
            except OSError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode):  # a rewritten file keeps its mode
                os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode) & 0o777)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        unlink_quietly(tmp)
        raise
    return tmp


def atomic_write_files(files: Mapping[Path, bytes]) -> None:
    """Write every file so readers see old or new contents, never a part, all together (every
    temporary is complete before the first rename); a failure leaves no temporary behind."""
    written: dict[Path, str] = {}
    try:
        for path, data in files.items():
            written[path] = _write_temporary(path, data)
        for path in list(written):
            os.replace(written[path], path)
            del written[path]  # only once renamed: a failed rename still cleans its temporary
    except BaseException:
        for tmp in written.values():
            unlink_quietly(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part."""
    atomic_write_files({path: data})
