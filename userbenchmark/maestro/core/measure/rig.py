"""What one rank measures with, made once per run: its place in the job, the communicators (the
cluster shell makes them), its profiler, its lanes and their gate, and the gloo group of its
cross-rank figures."""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from ..config.options import RunOptions
from ..config.spec import SuiteSpec
from ..profilers.profiler import Profiler
from ..profilers.profiler_registry import make_profiler
from .gate import calibrate_sleep_cycles_per_us
from .lanes import CpuLanes, CudaLanes
from .windows import reducer

log = logging.getLogger("maestro")


@dataclass(kw_only=True)
class RankPlace:
    """Where this rank runs."""

    rank: int
    world_size: int
    backend: str
    device: Any
    """torch.device of this rank (cuda:LOCAL_RANK or cpu)."""
    hosts: tuple[str, ...] = ()
    """Host name of every rank, by rank."""
    devices: tuple[int, ...] = ()
    """CUDA device index of every rank, by rank (-1 for CPU ranks)."""

    @property
    def one_host(self) -> bool:
        """Every rank runs on this host, so they read one CLOCK_MONOTONIC / CLOCK_REALTIME."""
        return len(set(self.hosts)) <= 1

    @property
    def ranks_per_gpu(self) -> int | None:
        """Most ranks sharing one GPU (over 1 only in NCCL's multi-rank test mode); None on CPU."""
        if not self.is_cuda:
            return None
        return max(Counter(zip(self.hosts, self.devices, strict=True)).values(), default=1)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


@dataclass(kw_only=True)
class Rig:
    """Run-wide state shared by every pattern of a suite on this rank."""

    suite: SuiteSpec
    place: RankPlace
    comms: Any
    """This rank's process group on each axis (``team``, ``group``, ``axis``)."""
    profiler: Profiler
    lanes: CpuLanes | CudaLanes
    sync_group: Any
    """gloo group of the iteration barriers and the cross-rank figures (the agreement goes
    through the store, so a failed rank's agreement never meets a peer's barrier)."""
    seed: int = 0
    calibration: dict[str, float] = field(default_factory=dict)
    streams: dict[str, Any] = field(default_factory=dict)
    window_id: int = 0
    collect_timeline: bool = False
    """Gather every rank's intervals on rank 0 (for ``--trace`` and ``--plot``)."""
    note: Callable[..., None] | None = None
    """Rank 0's progress line: what a pattern is doing now (None on other ranks)."""
    wedged: bool = False
    """Device work outlived an abort (NCCL kernels that cannot end): nothing may be freed or
    torn down any more; the rank leaves once the failure is saved and printed."""

    def lane_stream(self, name: str, priority: str) -> Any:
        if not self.place.is_cuda:
            return None
        key = f"{name}:{priority}"
        if key not in self.streams:
            self.streams[key] = self.lanes.make_stream(priority)
        return self.streams[key]


def make_rig(
    suite: SuiteSpec, options: RunOptions, place: RankPlace, comms: Any, sync_group: Any
) -> Rig:
    """This rank's rig for ``suite``: its lanes and their gate (the alignment of every rank's
    CUDA gate, or the agreed start of CPU lanes), then its profiler (started: CUPTI records
    from here on, the gate's calibration left out)."""
    registered = sorted({b.name for p in suite.patterns for b in p.blocks if b.register_buffers})
    if registered and place.is_cuda:
        from .registration import require_support

        require_support(place.device.index or 0)
    elif registered and place.rank == 0:
        log.warning(
            "register_buffers has no effect on the %s backend (blocks %s)",
            place.backend,
            ", ".join(registered),
        )
    barrier = functools.partial(tdist.barrier, group=sync_group)
    calibration: dict[str, float] = {}
    lanes: CpuLanes | CudaLanes
    if place.is_cuda:
        calibration["sleep_cycles_per_us"] = calibrate_sleep_cycles_per_us(place.device)
        align = None
        if place.world_size > 1:  # a one-element all_reduce on a communicator of its own
            group, one = comms.gate_group(), torch.zeros(1, device=place.device)
            align = functools.partial(tdist.all_reduce, one, group=group)
        lanes = CudaLanes(
            barrier=barrier,
            device=place.device,
            sleep_cycles_per_us=calibration["sleep_cycles_per_us"],
            timeout_s=suite.timeout_s,
            align=align,
        )
    else:
        agree_start = None  # the ranks share no clock (several hosts), or nobody to agree with
        if place.world_size > 1 and place.one_host:
            reduce = reducer(sync_group)
            agree_start = lambda ns: int(reduce(np.array([ns], dtype=np.int64), "max")[0])  # noqa: E731
        lanes = CpuLanes(barrier=barrier, agree_start=agree_start, timeout_s=suite.timeout_s)
    # Kernel names are kept for a trace, and for an imported step's kernels against its trace's.
    names = options.trace or any(p.traced for p in suite.patterns)
    profiler = make_profiler(
        options.profiler,
        on_cuda=place.is_cuda,
        backend=place.backend,
        trace=names,
        warn=place.rank == 0,
    )
    return Rig(
        suite=suite,
        place=place,
        comms=comms,
        profiler=profiler,
        lanes=lanes,
        sync_group=sync_group,
        seed=options.seed,
        calibration=calibration,
        collect_timeline=options.trace or options.plot,
    )
