"""What every profiler returns: per (block, iteration) start and end on one rank's clock."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True)
class WindowTimings:
    """Timings of one measured window (the iterations of one pattern or baseline run).

    ``starts_ns``/``ends_ns`` have shape (num_blocks, num_iters) on this rank's own clock;
    rows of blocks this rank does not run (``present`` False) are zeros and never read.
    """

    starts_ns: np.ndarray
    ends_ns: np.ndarray
    present: np.ndarray
    clock: str
    """``perf_counter`` (host), ``cuda_event`` (CUDA events) or ``cupti`` (CLOCK_REALTIME)."""
    gate_open_ns: np.ndarray | None = None
    """Per iteration: when the start gate released the lanes, same clock (GPU only)."""
    activity_counts: np.ndarray | None = None
    """Per block: device activities attributed to it in the window (CUPTI only)."""
    extra: dict | None = None


class Profiler:
    """Records when each (block, iteration) ran; subclasses per backend.

    ``before``/``after`` bracket one block's enqueue: on CPU they run on the lane thread and
    the block runs synchronously between them; on CUDA they run on the host thread with the
    lane's stream current, and the device activity enqueued between them is what counts.
    """

    name = "base"
    description = ""

    def begin_window(
        self, window_id: int, num_blocks: int, num_iters: int, present: np.ndarray
    ) -> None:
        raise NotImplementedError

    def before(self, block: int, iteration: int) -> None:
        raise NotImplementedError

    def after(self, block: int, iteration: int) -> None:
        raise NotImplementedError

    def gate_begin(self, iteration: int) -> None:
        """Harness work (the gate's spin kernel) follows until ``gate_end``."""

    def gate_end(self, iteration: int) -> None:
        pass

    def end_window(self) -> WindowTimings:
        raise NotImplementedError

    def close(self) -> None:
        pass
