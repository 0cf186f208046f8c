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
    """Host-side facts about one window: enqueue times against the gate, and (CPU lanes) when the
    gate opened. Arrays a backend does not fill stay empty."""

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
    """(iters,) bool: the host was still enqueueing when the gate (launched first) could have
    opened, so lanes may have started before every block was issued."""
    return np.asarray(enqueue_ns, dtype=np.float64) > gate_us * 1e3


@dataclass(frozen=True, kw_only=True)
class WindowTimings:
    """Timings of one measured window: ``starts_ns`` and ``ends_ns`` (num_blocks, num_iters) on
    this rank's own clock; rows of blocks it does not run (``present`` False) are never read."""

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
    """Per block: the largest grid (CTAs, x*y*z) of its kernels, 0 without one (CUPTI only)."""
    activities: DeviceActivities | None = None
    """Named, attributed device activities (CUPTI with --trace)."""
