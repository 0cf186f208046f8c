"""What one rank measured in a window, on its own clock: intervals per (block, iteration), the
host's enqueue times and (CUPTI with ``--trace``) the device activities of each."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KIND_KERNEL = 1
KIND_MEMCPY = 2
KIND_MEMSET = 3
KIND_NAMES = {KIND_KERNEL: "kernel", KIND_MEMCPY: "memcpy", KIND_MEMSET: "memset"}

API_RUNTIME = 1
"""``LaunchCalls.api``: a CUDA runtime API call (``cudaLaunchKernel``, ``cudaMemcpyAsync``)."""
API_DRIVER = 2
"""``LaunchCalls.api``: a CUDA driver API call (``cuLaunchKernelEx``: NCCL launches so)."""


def check_lengths(obj: Any, names: Sequence[str] = (), rows: int | None = None) -> int:
    """The one length of ``obj``'s 1-D arrays ``names`` (default: all fields) and ``rows``."""
    lengths = set() if rows is None else {rows}
    for name in names or [f.name for f in dataclasses.fields(obj)]:
        arr = getattr(obj, name)
        if not isinstance(arr, np.ndarray) or arr.ndim != 1:
            raise ValueError(f"{type(obj).__name__}.{name} must be a 1-D numpy array")
        lengths.add(arr.shape[0])
    if len(lengths) > 1:
        raise ValueError(f"{type(obj).__name__} arrays differ in length: {sorted(lengths)}")
    return lengths.pop() if lengths else 0


class Columns:
    """A dataclass of arrays with one entry per record (its first field's length)."""

    def __post_init__(self) -> None:
        check_lengths(self)

    def __len__(self) -> int:
        return int(getattr(self, dataclasses.fields(self)[0].name).shape[0])


@dataclass(frozen=True, kw_only=True)
class ApiRecords(Columns):
    """CUDA runtime/driver API calls (CUPTI RUNTIME and DRIVER records), one per call."""

    correlation_id: np.ndarray
    """int64: CUPTI's correlation id, shared with the activities the call launched."""
    start_ns: np.ndarray  # int64, the rank's clock (CUPTI: CLOCK_REALTIME), as the activities
    end_ns: np.ndarray
    api: np.ndarray  # uint8: API_RUNTIME or API_DRIVER
    cbid: np.ndarray  # int32: CUPTI's callback id of the function
    thread_id: np.ndarray  # int64: the calling thread (CUPTI's threadId)


@dataclass(frozen=True, kw_only=True)
class LaunchCalls(ApiRecords):
    """The API calls that launched a window's block activities, one per correlation id."""

    name_index: np.ndarray
    """int32 into ``DeviceActivities.names`` (the function's name, e.g. ``cudaLaunchKernel``)."""


@dataclass(frozen=True, kw_only=True)
class DeviceActivities(Columns):
    """Every kernel, memcpy and memset of one rank's window that belongs to a block. Harness work
    (the gate's spin kernel, its alignment all_reduce, barriers) is left out: it belongs to no
    block. ``launches`` holds at most one API call per correlation id."""

    block: np.ndarray  # int32: the block's index in the pattern
    iteration: np.ndarray  # int32: the measured iteration (0-based)
    kind: np.ndarray  # uint8: KIND_KERNEL, KIND_MEMCPY or KIND_MEMSET
    start_ns: np.ndarray  # int64, the rank's own clock (CUPTI: CLOCK_REALTIME)
    end_ns: np.ndarray
    stream_id: np.ndarray  # int64: CUPTI's stream id
    device_id: np.ndarray  # int32
    correlation_id: np.ndarray  # int64: CUPTI's correlation id of the launching API call
    grid: np.ndarray  # int32 (n, 3): kernel grid dims (zeros for memcpy/memset)
    block_dims: np.ndarray  # int32 (n, 3): kernel thread-block dims (zeros for memcpy/memset)
    size_bytes: np.ndarray  # int64: bytes of a memcpy/memset (0 for kernels)
    name_index: np.ndarray
    """int32 into ``names``: the kernel's, or a ``Memcpy DtoD (Device -> Device)``-style name."""
    names: tuple[str, ...]
    launches: LaunchCalls

    def __post_init__(self) -> None:
        not_per_activity = ("grid", "block_dims", "names", "launches")
        fields = [f.name for f in dataclasses.fields(self) if f.name not in not_per_activity]
        n = check_lengths(self, fields, self.grid.shape[0])
        if self.grid.shape != (n, 3) or self.block_dims.shape != (n, 3):
            raise ValueError(f"grid and block_dims must have shape ({n}, 3)")
        for index in (self.name_index, self.launches.name_index):
            if index.size and (int(index.min()) < 0 or int(index.max()) >= len(self.names)):
                raise ValueError("a name index lies outside the names table")


def main_kernel_names(activities: DeviceActivities | None, num_blocks: int) -> tuple[str, ...]:
    """Per block, the kernel that took most of its device time in the window ('' unknown)."""
    if activities is None:
        return ("",) * num_blocks
    kernels = activities.kind == KIND_KERNEL
    block = activities.block[kernels].astype(np.int64)
    name = activities.name_index[kernels].astype(np.int64)
    time_ns = (activities.end_ns - activities.start_ns)[kernels].astype(np.float64)
    width = max(len(activities.names), 1)
    total = np.bincount(block * width + name, weights=time_ns, minlength=num_blocks * width)
    per_block = total[: num_blocks * width].reshape(num_blocks, width)
    best = per_block.argmax(axis=1)
    return tuple(
        activities.names[best[b]] if per_block[b, best[b]] > 0 else "" for b in range(num_blocks)
    )


@dataclass(frozen=True, kw_only=True)
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
