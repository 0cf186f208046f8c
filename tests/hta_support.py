"""HolisticTraceAnalysis in tests: imported without reconfiguring logging, its log captured."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Words of a warning about what HTA could not find (ranks, steps, iterations); file paths are
# taken out first, since rank<r>.json names a rank in every parsing message.
_MISSING_WORDS = re.compile(r"\brank\b|step|iteration", re.IGNORECASE)


def trace_analysis_class() -> Any:
    """``hta.trace_analysis.TraceAnalysis`` (a test requirement: requirements-test.txt).

    Importing HTA runs ``logging.config.fileConfig``, which disables every logger that exists
    and adds a handler to the root logger: both are put back as they were.
    """
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    loggers = {
        name: lg.disabled
        for name, lg in logging.Logger.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    try:
        import hta.trace_analysis as hta
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
        for name, disabled in loggers.items():
            logging.getLogger(name).disabled = disabled
    return hta.TraceAnalysis


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def hta_warnings() -> Iterator[list[logging.LogRecord]]:
    """Warnings and errors HTA logs in this process while the block runs."""
    handler = _Collect()
    logger = logging.getLogger("hta")
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


def missing_data_warnings(records: list[logging.LogRecord], trace_dir: Path) -> list[str]:
    """The messages among ``records`` that speak of ranks, steps or iterations."""
    found = []
    for record in records:
        message = record.getMessage()
        for path in sorted(trace_dir.glob("*"), key=lambda p: -len(str(p))):
            message = message.replace(str(path), "")
        message = message.replace(str(trace_dir), "")
        if _MISSING_WORDS.search(message):
            found.append(record.getMessage())
    return found


def load_traces(trace_dir: Path, **kwargs: Any) -> tuple[Any, list[str]]:
    """(TraceAnalysis of ``trace_dir``, its warnings about missing ranks or steps)."""
    trace_analysis = trace_analysis_class()
    with hta_warnings() as records:
        analysis = trace_analysis(trace_dir=str(trace_dir), **kwargs)
    return analysis, missing_data_warnings(records, trace_dir)
