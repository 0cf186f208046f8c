"""Logging set-up: inside a run every line carries the rank, ``[maestro r1] WARNING ...``;
outside one (validate, compare, list-blocks, the local launcher) there is no rank to show:
``maestro: warning: ...``."""

from __future__ import annotations

import logging
import os
import sys


class _PlainFormatter(logging.Formatter):
    """``maestro: warning: message``, as the command line prints its own messages."""

    def format(self, record: logging.LogRecord) -> str:
        return f"maestro: {record.levelname.lower()}: {super().format(record)}"


def configure_logging(level: str = "INFO", *, ranked: bool = True) -> None:
    """Log to stderr at ``level``; ``ranked`` lines carry the rank (``[maestro r1] WARNING``),
    the others read ``maestro: warning: ...`` (a process that is no rank)."""
    handler = logging.StreamHandler(sys.stderr)
    if ranked:  # the launcher set RANK (or SLURM_PROCID) before this process configured logging
        rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        fmt = "[maestro r%(rank)s] %(levelname)s %(message)s"
        handler.setFormatter(logging.Formatter(fmt, defaults={"rank": rank}))
    else:
        handler.setFormatter(_PlainFormatter("%(message)s"))
    root = logging.getLogger("maestro")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
