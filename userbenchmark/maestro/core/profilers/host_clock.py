"""The CPU lanes' profiler: ``time.perf_counter_ns()`` around each block on its lane thread."""

from __future__ import annotations

import time

import numpy as np

from ..analysis.intervals import WindowTimings
from .profiler import Profiler


class HostProfiler(Profiler):
    """A CPU block runs synchronously in its lane thread, so host time is the block's time."""

    name = "host"
    times = "cpu"
    described = "the host's clock"

    def begin_window(
        self, window_id: int, num_blocks: int, num_iters: int, present: np.ndarray
    ) -> None:
        self._starts = np.zeros((num_blocks, num_iters), dtype=np.int64)
        self._ends = np.zeros((num_blocks, num_iters), dtype=np.int64)
        self._present = np.asarray(present, dtype=bool).copy()

    def before(self, block: int, iteration: int) -> None:
        self._starts[block, iteration] = time.perf_counter_ns()

    def after(self, block: int, iteration: int) -> None:
        self._ends[block, iteration] = time.perf_counter_ns()

    def end_window(self) -> WindowTimings:
        return WindowTimings(
            starts_ns=self._starts, ends_ns=self._ends, present=self._present, clock="perf_counter"
        )
