"""What every profiler returns: per (block, iteration) start and end on one rank's clock."""

from __future__ import annotations

import numpy as np

from ..analysis.intervals import WindowTimings


class Profiler:
    """Records when each (block, iteration) ran; subclasses per backend. The hooks do nothing
    here (what an untimed window needs).

    ``before``/``after`` bracket one block's enqueue: on CPU they run on the lane thread and
    the block runs synchronously between them; on CUDA they run on the host thread with the
    lane's stream current, and the device activity enqueued between them is what counts.
    """

    name = "base"

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
        raise NotImplementedError(f"{type(self).__name__} has no timings")

    def close(self) -> None:
        pass


class NullProfiler(Profiler):
    """Records nothing (check-mode runs, which are not timed)."""

    name = "none"
