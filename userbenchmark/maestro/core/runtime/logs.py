"""Logging set-up: every line carries the rank, ``[maestro r1] WARNING ...``."""

from __future__ import annotations

import logging
import os
import sys


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        return True


def configure_logging(level: str = "INFO") -> None:
    """Log lines carry the rank: ``[maestro r1] WARNING ...``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RankFilter())
    handler.setFormatter(logging.Formatter("[maestro r%(rank)s] %(levelname)s %(message)s"))
    root = logging.getLogger("maestro")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
