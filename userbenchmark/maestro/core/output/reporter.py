"""Rank 0's side of a run: the sink the command line hands the ranks (the runtime's ``Sink``): the
progress line, the tables, the writer, the metrics file's ``environ`` (settings.py), the closing
lines. A closed standard output (``| head -1``) costs the tables printed after it, never a file."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TextIO

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
from .settings import run_environ
from .table import Tables
from .writer import OutputWriter

log = logging.getLogger("maestro")


def estimate_left_s(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds left if the remaining items take as long as the finished ones did on average
    (None before the first finished; 0.0 once ``done >= total``)."""
    if done == 0:
        return None
    if done >= total:
        return 0.0
    return elapsed_s / done * (total - done)


def format_line(done: int, total: int, label: str, elapsed_s: float) -> str:
    """``[3/10] pattern ag_rs@4M  elapsed 12.3 s  left ~28.7 s`` (no estimate before item 1)."""
    left_s = estimate_left_s(done, total, elapsed_s)
    left = "" if left_s is None else f"  left ~{left_s:.1f} s"
    return f"[{done}/{total}] {label}  elapsed {elapsed_s:.1f} s{left}"


def progress_wanted(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """True when ``stream`` is a terminal and neither ``CI`` nor ``MAESTRO_NO_PROGRESS`` is set."""
    env = os.environ if environ is None else environ
    if env.get("CI") or env.get("MAESTRO_NO_PROGRESS"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # no isatty, or a closed or detached stream
        return False


class Progress:
    """Counts finished items and redraws one line (carriage return) after each of them;
    ``enabled=None`` decides from the stream and the environment (``progress_wanted``)."""

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        # Resolved at call time, not import time, so redirected stderr (pytest, tools) counts.
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress_wanted(self.stream) if enabled is None else enabled
        self.done = 0
        self._clock = clock
        self._started_s: float | None = None
        self._steps_started_s = 0.0
        self._printed_width = 0
        self._closed = False

    def start(self) -> None:
        if self._started_s is None:
            self._started_s = self._clock()

    def elapsed_s(self) -> float:
        return 0.0 if self._started_s is None else max(0.0, self._clock() - self._started_s)

    def advance(self, label: str) -> None:
        self.start()
        self.done += 1
        self._draw(format_line(self.done, self.total, label, self.elapsed_s()))

    def note(self, doing: str, step: int = 0, steps: int = 0) -> None:
        """Redraw the line with what the next item is doing; counts nothing. With ``steps``:
        block ``step`` of them, and the time left if the rest take as long as those since
        block 0 (``ag_rs: baseline, block 3 of 55, left ~12.0 s``)."""
        self.start()
        if steps:
            now = self._clock()
            if step == 0:
                self._steps_started_s = now
            left_s = estimate_left_s(step, steps, now - self._steps_started_s)
            left = "" if left_s is None else f", left ~{left_s:.1f} s"
            doing = f"{doing}, block {step + 1} of {steps}{left}"
        self._draw(f"[{self.done}/{self.total}] {doing}  elapsed {self.elapsed_s():.1f} s")

    def _draw(self, line: str) -> None:
        if not self.enabled or self._closed:
            return
        # Pad with spaces so a shorter line fully covers the longer one before it.
        pad = " " * max(0, self._printed_width - len(line))
        self.stream.write("\r" + line + pad)
        self.stream.flush()
        self._printed_width = len(line)

    def clear(self) -> None:
        """Erase the drawn line, so a table printed next starts at column 0 on a clean line."""
        if self._printed_width and not self._closed:
            self.stream.write("\r" + " " * self._printed_width + "\r")
            self.stream.flush()
            self._printed_width = 0

    def close(self) -> None:
        """End the line with a newline if anything was drawn; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        if self._printed_width:
            self.stream.write("\n")
            self.stream.flush()


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
