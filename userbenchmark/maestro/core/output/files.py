"""Atomic file writes: readers see a file's old contents or its new ones, never a part."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_temporary(path: Path, data: bytes) -> str:
    """``data`` in a fsynced temporary file next to ``path``; returns the temporary's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


def atomic_write_files(files: Mapping[Path, bytes]) -> None:
    """Write every file so readers see old or new contents, never a part; all temporaries
    are complete before the first rename, so the files change together."""
    written: dict[Path, str] = {}
    try:
        for path, data in files.items():
            written[path] = _write_temporary(path, data)
        for path in list(written):
            os.replace(written.pop(path), path)
    except BaseException:
        for tmp in written.values():
            _unlink_quietly(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part."""
    atomic_write_files({path: data})


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))
