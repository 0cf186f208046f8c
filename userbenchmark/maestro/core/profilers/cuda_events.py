"""The CUDA profiler without cupti-python: start and end CUDA events per (block, iteration),
all relative to one reference event. Coarser than CUPTI: an event marks when the stream reached
that point, not when a kernel started, and has about 0.5 µs resolution."""

from __future__ import annotations

import numpy as np

from ..analysis.intervals import WindowTimings
from .profiler import Profiler


class EventProfiler(Profiler):
    name = "events"
    times = "cuda"
    described = "CUDA events"

    def begin_window(
        self, window_id: int, num_blocks: int, num_iters: int, present: np.ndarray
    ) -> None:
        import torch

        self._present = np.asarray(present, dtype=bool).copy()
        self._shape = (num_blocks, num_iters)
        make = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        self._start_ev = [[make() for _ in range(num_iters)] if p else None for p in self._present]
        self._end_ev = [[make() for _ in range(num_iters)] if p else None for p in self._present]
        self._gate_ev = [make() for _ in range(num_iters)]
        torch.cuda.synchronize()
        self._ref = make()
        self._ref.record()
        self._gate_seen = np.zeros(num_iters, dtype=bool)

    def before(self, block: int, iteration: int) -> None:
        events = self._start_ev[block]
        if events is not None:  # a block that runs but is not timed has no events
            events[iteration].record()

    def after(self, block: int, iteration: int) -> None:
        events = self._end_ev[block]
        if events is not None:
            events[iteration].record()

    def gate_end(self, iteration: int) -> None:
        # Called with the gate stream current, right after the spin kernel.
        self._gate_ev[iteration].record()
        self._gate_seen[iteration] = True

    def end_window(self) -> WindowTimings:
        import torch

        torch.cuda.synchronize()
        ns = lambda event: round(self._ref.elapsed_time(event) * 1e6)  # noqa: E731
        starts = np.zeros(self._shape, dtype=np.int64)
        ends = np.zeros(self._shape, dtype=np.int64)
        for b in np.flatnonzero(self._present):
            starts[b] = [ns(e) for e in self._start_ev[b]]
            ends[b] = [ns(e) for e in self._end_ev[b]]
        gate = None
        if self._gate_seen.all():
            gate = np.array([ns(e) for e in self._gate_ev], dtype=np.int64)
        return WindowTimings(
            starts_ns=starts,
            ends_ns=ends,
            present=self._present,
            clock="cuda_event",
            host_clock=False,
            gate_open_ns=gate,
        )
