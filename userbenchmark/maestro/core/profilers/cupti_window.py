"""Adapts :class:`CuptiProfiler` (attribution by external correlation id) to WindowTimings."""

from __future__ import annotations

import numpy as np

from ..analysis.intervals import WindowTimings
from .base import Profiler
from .cupti import CuptiProfiler


class CuptiWindowProfiler(Profiler):
    """Every kernel, memcpy and memset of a window attributed to its (block, iteration)."""

    name = "cupti"

    def __init__(self, *, trace: bool = False) -> None:
        """``trace``: keep each window's named activities and API calls (``--trace``)."""
        self.cupti = CuptiProfiler(keep_activities=trace)

    def start(self) -> None:
        self.cupti.start()

    def begin_window(
        self, window_id: int, num_blocks: int, num_iters: int, present: np.ndarray
    ) -> None:
        # Flushes and discards everything captured before: warmup never reaches the numbers.
        self._present = np.asarray(present, dtype=bool).copy()
        self.cupti.begin_window(window_id, num_blocks, num_iters, self._present)

    def before(self, block: int, iteration: int) -> None:
        self.cupti.push(block, iteration)

    def after(self, block: int, iteration: int) -> None:
        self.cupti.pop()

    def gate_begin(self, iteration: int) -> None:
        self.cupti.push_gate(iteration)

    def gate_end(self, iteration: int) -> None:
        self.cupti.pop()

    def end_window(self) -> WindowTimings:
        att = self.cupti.end_window()
        return WindowTimings(
            starts_ns=att.start_ns,
            ends_ns=att.end_ns,
            present=self._present,
            clock="cupti",
            gate_open_ns=None if (att.gate_end_ns <= 0).any() else att.gate_end_ns,
            activity_counts=att.activity_count.sum(axis=1),
            kernel_ctas_max=att.kernel_ctas_max,
            activities=self.cupti.last_activities,
        )

    def close(self) -> None:
        self.cupti.stop()
