"""Logging set-up: inside a run every line carries the rank, ``[maestro r1] WARNING ...``;
outside one (validate, compare, list-blocks, the local launcher) there is no rank to show:
``maestro: warning: ...``."""

from __future__ import annotations

import logging
import os
import sys


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        return True


class _PlainFormatter(logging.Formatter):
    """``maestro: warning: message``, as the command line prints its own messages."""

    def format(self, record: logging.LogRecord) -> str:
        return f"maestro: {record.levelname.lower()}: {super().format(record)}"


def configure_logging(level: str = "INFO", *, ranked: bool = True) -> None:
    """Log to stderr at ``level``; ``ranked`` lines carry the rank (``[maestro r1] WARNING``),
    the others read ``maestro: warning: ...`` (a process that is no rank)."""
    handler = logging.StreamHandler(sys.stderr)
    if ranked:
        handler.addFilter(_RankFilter())
        handler.setFormatter(logging.Formatter("[maestro r%(rank)s] %(levelname)s %(message)s"))
    else:
        handler.setFormatter(_PlainFormatter("%(message)s"))
    root = logging.getLogger("maestro")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
