"""A one-line progress reporter for rank 0, drawn only on an interactive terminal (not under
``CI`` nor with ``MAESTRO_NO_PROGRESS`` set) unless forced."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO


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
