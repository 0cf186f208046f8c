"""Rank 0's side of a run: the sink the command line hands the ranks (the runtime's ``Sink``): the
progress line, the tables, the writer, the closing lines, and the metrics file's ``environ``,
written and read back (compare). A closed standard output costs later tables, never a file."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Final, TextIO

from ...blocks.registry import resolve_op
from ...errors import (
    EXIT_INTERRUPTED,
    STREAM_GONE,
    OptionError,
    RunError,
    cause_of,
    detach_stream,
    interrupted_message,
    printable,
    say,
)
from ..analysis.records import PatternOutcome
from ..analysis.whatif import WhatIfResult
from ..config.options import RunOptions
from ..config.spec import PatternSpec, SuiteSpec
from .table import Tables, format_whatif
from .writer import OutputWriter

log = logging.getLogger("maestro")

RUN_SETTINGS: Final = ("backend", "profiler", "world_size", "num_hosts", "ranks_per_gpu",
                       "max_size_bytes", "iters_override", "warmup_iters_override",
                       "graph_override")  # fmt: skip
SETTING_PREFIXES: Final = ("pattern.", "block.")
STACK: Final = {"maestro_version": "maestro", "pytorch_version": "torch", "cuda_version": "CUDA",
                "nccl_version": "NCCL", "cupti_python_version": "cupti-python",
                "device": "device"}  # fmt: skip
"""What the runs ran on (environ key: label): shown beside a comparison, never refused."""


def suite_settings(suite: SuiteSpec) -> dict[str, str]:
    """What each pattern (``pattern.<name>``) and block (``block.<pattern>/<block>``) measures,
    after command-line overrides and --max-size."""
    out = {}
    for p in (q for pattern in suite.patterns for q in (pattern, *pattern.variants)):
        out[f"pattern.{p.label}"] = (
            f"iters={p.num_iters} warmup_iters={p.warmup_iters} sync={p.sync} "
            f"graph={str(p.graph).lower()}"
        )
        for b in p.blocks:
            team = suite.axes[b.axis].team_size
            out[f"block.{p.label}/{b.name}"] = (
                f"op={b.op} dtype={b.dtype} team_size={team} {b.work}"
            )
    return out


def _text(value: object) -> str:
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def run_environ(
    suite: SuiteSpec,
    options: RunOptions,
    dist: Any,
    profiler: str,
    calibration: Mapping[str, float],
) -> dict[str, str]:
    """The metrics file's ``environ`` from the rank's ``dist`` (backend, hosts, ranks per GPU,
    device): the settings (:data:`RUN_SETTINGS`, ``pattern.*``, ``block.*``), the :data:`STACK`,
    the host, ``calibration`` (``sleep_cycles_per_us``...) and the file's ``env.<NAME>``."""
    import torch

    from ... import __version__

    hosts, device = dist.hosts, dist.device
    info = {
        "maestro_version": __version__,
        "pytorch_version": torch.__version__,
        "pytorch_git_version": str(getattr(torch.version, "git_version", "")),
        "backend": dist.backend,
        "profiler": profiler,
        "world_size": str(len(hosts)),
        "num_hosts": str(len(set(hosts)) or 1),
        "ranks_per_gpu": _text(dist.ranks_per_gpu),
        "max_size_bytes": _text(options.max_size_bytes),
        "iters_override": _text(options.iters),
        "warmup_iters_override": _text(options.warmup_iters),
        "graph_override": _text(options.graph),
        "config": suite.source,
        "suite": suite.name,
        "hostname": os.uname().nodename if hasattr(os, "uname") else "",
    }
    if device.type == "cuda":
        info["cuda_version"] = str(torch.version.cuda)
        info["device"] = torch.cuda.get_device_name(device)
        with contextlib.suppress(Exception):  # NCCL may be absent from a CUDA build
            info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    info.update({key: repr(float(value)) for key, value in calibration.items()})
    info.update(suite_settings(suite))
    info.update({f"env.{key}": value for key, value in suite.env.items()})
    # What kind of work each block is (comm, compute, other): the floor compare judges a
    # one-process run with (metric_keys.noise_of) depends on it, custom ops included.
    info.update(
        (f"category.{p.name}/{b.name}", resolve_op(b.op).category)
        for p in suite.patterns
        for b in p.blocks
    )
    return info


def measurement_settings(environ: Mapping[str, object]) -> dict[str, str]:
    """The entries of ``environ`` that decide what was measured."""
    return {
        key: str(value)
        for key, value in environ.items()
        if key in RUN_SETTINGS or key.startswith(SETTING_PREFIXES)
    }


def setting_differences(
    a: Mapping[str, object], b: Mapping[str, object], *, skip: Collection[str] = ()
) -> list[str]:
    """One line per measurement setting both runs record with different values, but ``skip``'s (a
    pattern or block only one run has is not a difference: compare reports it as only in A or B)."""
    sa, sb = measurement_settings(a), measurement_settings(b)
    return [
        f"{key}: A {sa[key]!r}, B {sb[key]!r}"
        for key in sorted(sa.keys() & sb.keys() - set(skip))
        if sa[key] != sb[key]
    ]


def stack_line(environ: Mapping[str, object]) -> str:
    """``torch 2.11.0+cu130, CUDA 13.0, NCCL 2.28.9, ...`` (what the run ran on)."""
    parts = [f"{label} {environ[key]}" for key, label in STACK.items() if environ.get(key)]
    return ", ".join(parts) or "unknown"


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
        self.stream.write("\r" + line + " " * max(0, self._printed_width - len(line)))
        self.stream.flush()
        self._printed_width = len(line)

    def clear(self) -> None:
        """Erase the drawn line, so a table printed next starts at column 0 on a clean line."""
        if self._printed_width and not self._closed:
            self.stream.write("\r" + " " * self._printed_width + "\r")
            self.stream.flush()
            self._printed_width = 0

    def close(self) -> None:
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
        self.progress = Progress(total=sum(1 + len(p.variants) for p in suite.patterns))
        self.progress.start()
        self.note = self.progress.note  # the runtime's Sink.note: on the progress line
        self.saved = False  # some pattern (finished or failed) is in a file
        self._has_files = bool(options.output_dir or options.metrics_path)
        self._guard = guard
        self._stdout_lost = ""  # why standard output stopped taking the tables (| head), or ""

    @staticmethod
    def check(options: RunOptions) -> None:
        """OptionError for a file this machine cannot write (``--plot`` without matplotlib)."""
        from .writer import MISSING_MATPLOTLIB, matplotlib_available

        if options.plot and not matplotlib_available():
            raise OptionError(MISSING_MATPLOTLIB)

    def start(self, place: Any, profiler: Any, calibration: Mapping[str, float]) -> None:
        """Open the writer with the metrics file's ``environ``: the run's settings on ``place``
        (run_environ), the ``profiler``'s and the gate's ``calibration``."""
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
        """A pattern (or a what-if variant) was measured: its warnings and table, then every file
        rewritten with ``run_info`` (the profiler's figures so far) in the ``environ``."""
        if pattern.variant is not None and outcome.variant is None:
            outcome = outcome.of_variant(pattern.variant)
        with self._saving():
            self.progress.clear()
            for warning in outcome.warnings:
                log.warning("%s", warning)
            self._print(self.tables.pattern(pattern, outcome) + "\n")
            assert self.writer is not None, "start() first"
            self.writer.environ.update(run_info)
            self.writer.add(outcome)
            self.saved = self._has_files
            self.progress.advance(f"pattern {pattern.label}")

    def whatif_finished(self, pattern: PatternSpec, results: tuple[WhatIfResult, ...]) -> None:
        """``pattern``'s variants were measured against it (after ``finished`` for it and for
        each variant): their table, then every file rewritten, whatif.* and a plot included."""
        with self._saving():
            self.progress.clear()
            named = tuple(dataclasses.replace(r, suite=self.suite.name) for r in results)
            if named:
                self._print(format_whatif(named, precision=self.options.precision) + "\n")
            assert self.writer is not None, "start() first"
            self.writer.add_whatif(pattern.name, named)
            self.saved = self._has_files

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
            count, path = self.writer.num_metrics, self.writer.metrics_path
            shown = printable(str(path))  # the user's paths, as every message shows them
            if path is not None and count:
                self._print(f"maestro: {count} metrics written to {shown}")
            elif path is not None:
                self._print(f"maestro: {shown} holds no metric: no pattern finished")
            if self.writer.output_dir is not None:
                self._print(f"maestro: results written to {printable(str(self.writer.output_dir))}")
        if self._stdout_lost:
            say(
                f"maestro: standard output was closed ({self._stdout_lost}); tables were not "
                "printed from then on, and the files hold every pattern"
            )
