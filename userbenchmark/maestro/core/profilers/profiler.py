"""The profiler interface: what the lanes call around each block and the gate, and the window's
timings every profiler returns (``WindowTimings``, core/analysis/intervals.py)."""

from __future__ import annotations

import numpy as np

from ..analysis.intervals import WindowTimings


class Profiler:
    """Records when each (block, iteration) ran; the hooks do nothing here (an untimed window).

    ``before``/``after`` bracket one block's enqueue: on CPU they run on the lane thread and
    the block runs synchronously between them; on CUDA they run on the host thread with the
    lane's stream current, and the device activity enqueued between them is what counts.
    A registered profiler (profiler_registry.py) names itself, the lanes it times (``cpu`` or
    ``cuda``) and how a fallback to it is told (``described``).
    """

    name = "none"
    times = ""
    described = ""

    def __init__(self, *, trace: bool = False) -> None:
        """``trace``: keep each window's named activities (``--trace``), where it can."""

    @classmethod
    def unusable(cls) -> str:
        """Why this profiler cannot run on this machine ("": it can)."""
        return ""

    def start(self) -> None:
        pass

    def begin_window(
        self, window_id: int, num_blocks: int, num_iters: int, present: np.ndarray
    ) -> None:
        pass

    def before(self, block: int, iteration: int) -> None:
        pass

    def after(self, block: int, iteration: int) -> None:
        pass

    def gate_begin(self, iteration: int) -> None:
        """Harness work (the gate's spin kernel) follows until ``gate_end``."""

    def gate_end(self, iteration: int) -> None:
        pass

    def end_window(self) -> WindowTimings:
        raise TypeError(f"{type(self).__name__} records no timings")

    def run_info(self) -> dict[str, str]:
        """What the profiler says of the run so far, for ``run.json`` (strings)."""
        return {}

    def close(self) -> None:
        pass
