"""The profiler interface: what the lanes call around each block and the gate, and the window's
timings every profiler returns (``WindowTimings``); the host's clock and CUDA events profilers."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ..analysis.intervals import WindowTimings


class Profiler:
    """Records when each (block, iteration) ran; here the hooks do nothing (an untimed window).
    ``before``/``after`` bracket one block's enqueue: on CPU the block runs between them on its
    lane thread; on CUDA the device work enqueued between them, on the lane's stream, counts."""

    name = "none"
    times = ""  # the lanes it times: cpu or cuda (profiler_registry.py)
    described = ""  # how a fallback to it is told

    def __init__(self, *, trace: bool = False) -> None:
        """``trace``: keep each window's named activities (``--trace``), where it can."""

    @classmethod
    def unusable(cls) -> str:
        """Why this profiler cannot run on this machine ("": it can)."""
        return ""

    def start(self) -> None:
        """Begin recording (``close``: end it, safe twice)."""

    def begin_window(
        self, window_id: int, num_blocks: int, num_iters: int, present: np.ndarray
    ) -> None:
        pass

    def before(self, block: int, iteration: int) -> None:
        """A block's enqueue follows until ``after``."""

    def gate_begin(self, iteration: int) -> None:
        """Harness work (the gate's spin kernel) follows until ``gate_end``."""

    after, gate_end, close = before, gate_begin, start

    def end_window(self) -> WindowTimings:
        raise TypeError(f"{type(self).__name__} records no timings")

    def run_info(self) -> dict[str, str]:
        """What the profiler says of the run so far, for ``run.json`` (strings)."""
        return {}


class HostProfiler(Profiler):
    """``time.perf_counter_ns()`` around each block on its lane thread: a CPU block runs there
    synchronously, so host time is the block's time."""

    name = "host"
    times = "cpu"
    described = "the host's clock"

    def begin_window(
        self, window_id: int, num_blocks: int, num_iters: int, present: np.ndarray
    ) -> None:
        self._starts = np.zeros((num_blocks, num_iters), dtype=np.int64)
        self._ends = np.zeros_like(self._starts)
        self._present = np.asarray(present, dtype=bool).copy()

    def before(self, block: int, iteration: int) -> None:
        self._starts[block, iteration] = time.perf_counter_ns()

    def after(self, block: int, iteration: int) -> None:
        self._ends[block, iteration] = time.perf_counter_ns()

    def end_window(self) -> WindowTimings:
        return WindowTimings(
            starts_ns=self._starts, ends_ns=self._ends, present=self._present, clock="perf_counter"
        )


class EventProfiler(HostProfiler):
    """Start and end CUDA events per (block, iteration), relative to one reference event, without
    cupti-python; their times fill the host profiler's arrays. Coarser than CUPTI: an event marks
    when the stream reached that point, not when a kernel started, and has about 0.5 µs resolution."""

    name = "events"
    times = "cuda"
    described = "CUDA events"
    _origin = None  # the first window's reference: every window on one time line

    def begin_window(
        self, window_id: int, num_blocks: int, num_iters: int, present: np.ndarray
    ) -> None:
        import torch

        super().begin_window(window_id, num_blocks, num_iters, present)
        make = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        self._start_ev = [[make() for _ in range(num_iters)] if p else None for p in self._present]
        self._end_ev = [[make() for _ in range(num_iters)] if p else None for p in self._present]
        self._gate_ev = [make() for _ in range(num_iters)]
        torch.cuda.synchronize()
        self._ref = make()
        self._ref.record()
        if self._origin is None:
            self._origin = self._ref
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
        # Rounds joined as one window follow one another (float32 ms: enough to place a window).
        base_ms = self._origin.elapsed_time(self._ref)
        ns = lambda event: round((base_ms + self._ref.elapsed_time(event)) * 1e6)  # noqa: E731
        for b in np.flatnonzero(self._present):
            self._starts[b] = [ns(e) for e in self._start_ev[b]]
            self._ends[b] = [ns(e) for e in self._end_ev[b]]
        gate = None
        if self._gate_seen.all():
            gate = np.array([ns(e) for e in self._gate_ev], dtype=np.int64)
        timings = super().end_window()
        return replace(timings, clock="cuda_event", host_clock=False, gate_open_ns=gate)
