"""Adapts :class:`CuptiProfiler` (attribution by external correlation id) to WindowTimings."""

from __future__ import annotations

import numpy as np

from ..analysis.intervals import WindowTimings
from .base import Profiler
from .cupti import CuptiProfiler


class CuptiWindowProfiler(Profiler):
    """Every kernel, memcpy and memset of a window attributed to its (block, iteration)."""

    name = "cupti"
    description = "CUPTI activity records attributed by external correlation id"

    def __init__(self, *, trace: bool = False) -> None:
        """``trace``: keep each window's named activities and API calls (``--trace``)."""
        self.cupti = CuptiProfiler(keep_activities=trace)
        self.last_attribution = None

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
        self.last_attribution = att
        present = self._present
        gate = att.gate_end_ns
        if gate is not None and (np.asarray(gate) <= 0).any():
            gate = None
        return WindowTimings(
            starts_ns=att.start_ns,
            ends_ns=att.end_ns,
            present=present,
            clock="cupti",
            gate_open_ns=gate,
            activity_counts=att.activity_count.sum(axis=1),
            kernel_ctas_max=np.array([max(g, default=0) for g in att.grid_ctas], dtype=np.int64),
            extra={
                "kernel_count": att.kernel_count,
                "memcpy_count": att.memcpy_count,
                "memset_count": att.memset_count,
                "grid_ctas": att.grid_ctas,
                "stream_ids": att.stream_ids,
            },
            activities=self.cupti.last_activities,
        )

    def close(self) -> None:
        self.cupti.stop()
