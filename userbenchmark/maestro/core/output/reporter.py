"""Rank 0's side of a run, in one place: the sink the command line hands the ranks (the
runtime's ``Sink``): the progress line, the tables, the writer, where the metrics file goes and
its ``environ`` (settings.py), the closing lines. A closed standard output (``| head -1``)
costs the tables printed after it, never a file."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from ...errors import (
    EXIT_INTERRUPTED,
    STREAM_GONE,
    OptionError,
    RunError,
    cause_of,
    detach_stream,
    interrupted_message,
    say,
)
from ..analysis.records import PatternOutcome
from ..config.options import RunOptions
from ..config.spec import PatternSpec, SuiteSpec
from .progress import Progress
from .settings import run_environ
from .table import Tables
from .writer import OutputWriter

log = logging.getLogger("maestro")


class Reporter:
    """Prints each pattern's table and rewrites every output file after it; ``guard()`` wraps
    each update (the runtime holds SIGINT/SIGTERM meanwhile). Files start with :meth:`start`,
    once the rank's place and profiler are known."""

    def __init__(
        self,
        suite: SuiteSpec,
        options: RunOptions,
        *,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self.suite, self.options = suite, options
        self.writer: OutputWriter | None = None
        self.tables = Tables(precision=options.precision)
        self.progress = Progress(total=len(suite.patterns))
        self.progress.start()
        self.note = self.progress.note  # the runtime's Sink.note: on the progress line
        self.saved = False  # some pattern (finished or failed) is in a file
        self._has_files = bool(options.output_dir or options.metrics_path)
        self._guard = guard
        self._stdout_lost = ""  # why standard output stopped taking the tables (| head), or ""

    @staticmethod
    def check(options: RunOptions) -> None:
        """OptionError for a file this machine cannot write (``--plot`` without matplotlib)."""
        from .plot import MISSING_MATPLOTLIB, matplotlib_available

        if options.plot and not matplotlib_available():
            raise OptionError(MISSING_MATPLOTLIB)

    def start(self, place: Any, profiler: Any, calibration: Mapping[str, float]) -> None:
        """Open the writer with the metrics file's ``environ``: the run's settings on ``place``
        (settings.run_environ), the ``profiler``'s and the gate's ``calibration``."""
        environ = run_environ(self.suite, self.options, place, profiler.name, calibration)
        self.writer = OutputWriter(
            output_dir=Path(self.options.output_dir) if self.options.output_dir else None,
            metrics_path=Path(self.options.metrics_path) if self.options.metrics_path else None,
            environ={**environ, **profiler.run_info()},
            trace=self.options.trace,
            plot=self.options.plot,
            guard=self._guard,
        )

    @contextmanager
    def _saving(self) -> Iterator[None]:
        """Any error of the report as the RunError every rank agrees on (phase ``output``)."""
        try:
            yield
        except Exception as exc:
            folder = self.options.output_dir
            if folder and not os.path.isdir(folder):
                why = f"the output folder {folder} was removed during the run ({cause_of(exc)})"
                raise RunError(why) from exc
            raise RunError(f"cannot write the results: {cause_of(exc)}") from exc

    def _print(self, text: str) -> None:
        if self._stdout_lost:
            return
        try:
            print(text, flush=True)
        except STREAM_GONE as exc:  # the reader went away (| head): the files still get everything
            self._stdout_lost = f"{type(exc).__name__}: {exc}"
            detach_stream(sys.stdout)

    def finished(
        self, pattern: PatternSpec, outcome: PatternOutcome, run_info: Mapping[str, str]
    ) -> None:
        """A pattern was measured: its warnings and table, then every file rewritten with
        ``run_info`` (the profiler's figures so far) in the ``environ``."""
        with self._saving():
            self.progress.clear()
            for warning in outcome.warnings:
                log.warning("%s", warning)
            self._print(self.tables.pattern(pattern, outcome) + "\n")
            assert self.writer is not None, "start() first"
            self.writer.environ.update(run_info)
            self.writer.add(outcome)
            self.saved = self._has_files
            self.progress.advance(f"pattern {pattern.name}")

    def failed(self, pattern: str, message: str) -> None:
        """A pattern failed on some rank: the message, and failures.json."""
        with self._saving():
            say(f"maestro: pattern {pattern} failed: {message}")
            self.progress.advance(f"pattern {pattern} (failed)")
            if self.writer is not None:
                self.writer.add_failure(pattern, message)
                self.saved = self._has_files

    def close(self, status: int) -> None:
        """The run ended with ``status``: the sweep summaries, then where the files are and,
        when interrupted, one line saying so."""
        self.progress.close()
        for summary in self.tables.closing():
            self._print(summary + "\n")
        if status == EXIT_INTERRUPTED:
            say(interrupted_message(saved=self.saved))
        if self.saved and self.writer is not None:
            if self.writer.metrics_path is not None:
                self._print(f"maestro: metrics written to {self.writer.metrics_path}")
            if self.writer.output_dir is not None:
                self._print(f"maestro: results written to {self.writer.output_dir}")
        if self._stdout_lost:
            say(
                f"maestro: standard output was closed ({self._stdout_lost}); tables were not "
                "printed from then on, and the files hold every pattern"
            )
