"""The profiler interface: what the lanes call around each block and the gate, and the window's
timings every profiler returns (``WindowTimings``, core/analysis/intervals.py)."""

from __future__ import annotations

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
