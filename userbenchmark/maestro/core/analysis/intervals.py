"""What one rank measured in a window: intervals per (block, iteration) and the host's
enqueue times, on that rank's own clock."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .activities import DeviceActivities


@dataclass(kw_only=True)
class HostTimings:
    """Host-side facts about one window: what the host spent enqueueing, against the gate,
    and (CPU lanes) when the gate opened. Arrays a backend does not fill stay empty: on CPU
    lanes a block runs (not enqueues) inside ``launch``."""

    enqueue_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(iters,): host time from the gate's launch to the last block's enqueue."""
    launch_ns: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    """(blocks, iters): host time inside each block's ``launch`` (0 where not run)."""
    gate_us: float = math.nan
    """Spin of the gate kernel in this window (µs at the calibrated clock rate)."""
    gate_open_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(iters,) CPU lanes: when this rank opened its gate (``perf_counter`` ns; CUDA gates
    open on the device and come from the profiler)."""
    agree_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(iters,) CPU lanes: host time the ranks took to agree on the iteration's start."""
    start_late: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """(iters,) CPU lanes: the agreed start had passed when this rank learned it."""


def host_late(enqueue_ns: np.ndarray, gate_us: float) -> np.ndarray:
    """(iters,) bool: the host was still enqueueing when the gate could have opened. The
    gate's spin is launched first, so an iteration enqueued in less than ``gate_us`` was issued
    in full before any lane could start; a longer one may have let lanes start early."""
    return np.asarray(enqueue_ns, dtype=np.float64) > gate_us * 1e3


@dataclass(frozen=True, kw_only=True)
class WindowTimings:
    """Timings of one measured window (of a pattern or a baseline run): ``starts_ns`` and
    ``ends_ns`` are (num_blocks, num_iters) on this rank's own clock; rows of blocks this rank
    does not run (``present`` False) are zeros and never read."""

    starts_ns: np.ndarray
    ends_ns: np.ndarray
    present: np.ndarray
    clock: str
    """``perf_counter`` (host), ``cuda_event`` (CUDA events) or ``cupti`` (CLOCK_REALTIME)."""
    host_clock: bool = True
    """The clock is the host's own (CLOCK_MONOTONIC, CLOCK_REALTIME), which every process of
    one host reads; False: offsets from this rank's own reference (CUDA events)."""
    gate_open_ns: np.ndarray | None = None
    """Per iteration: when the start gate released the lanes, same clock (None: unknown)."""
    activity_counts: np.ndarray | None = None
    """Per block: device activities attributed to it in the window (CUPTI only)."""
    kernel_ctas_max: np.ndarray | None = None
    """Per block: the largest grid (CTAs, x*y*z) of its kernels in the window, 0 without a
    kernel (CUPTI only): shows what per-axis limits such as nccl max_ctas did."""
    activities: DeviceActivities | None = None
    """The window's attributed device activities, names included (CUPTI with --trace)."""
