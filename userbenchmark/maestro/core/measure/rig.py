"""What one rank measures with, made once per run: its place, communicators, profiler, lanes,
gate and cross-rank reducer; whether this torch and NCCL can back ``register_buffers``' pools
with NCCL's ``mem_allocator`` (probed in a child process: touching an unsupported allocator
killed a process later)."""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from ...errors import RunError
from ..analysis.aggregate import Reducer
from ..config.options import DEFAULT_ROUNDS, RunOptions
from ..config.spec import SuiteSpec
from ..profilers.profiler import Profiler
from ..profilers.profiler_registry import make_profiler
from .lanes import CpuLanes, CudaLanes, calibrate_sleep_cycles_per_us

log = logging.getLogger("maestro")


def reducer(group: Any) -> Reducer:
    """A :data:`Reducer` over a (gloo) process group."""
    ops = {"max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN, "sum": tdist.ReduceOp.SUM}

    def reduce(values: np.ndarray, op: str) -> np.ndarray:
        array = np.asarray(values)  # float64 or int64 (exact instants): the dtype is kept
        dtype = np.int64 if np.issubdtype(array.dtype, np.integer) else np.float64
        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=dtype)).clone()
        tdist.all_reduce(tensor, op=ops[op], group=group)
        return tensor.numpy()

    return reduce


@dataclass(kw_only=True)
class RankPlace:
    """Where this rank runs."""

    rank: int
    world_size: int
    backend: str
    device: Any  # torch.device of this rank (cuda:LOCAL_RANK or cpu)
    hosts: tuple[str, ...] = ()  # host name of every rank, by rank
    devices: tuple[int, ...] = ()  # CUDA device index of every rank, by rank (-1 for CPU ranks)

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
    comms: Any  # this rank's process group on each axis (team, group, axis)
    profiler: Profiler
    lanes: CpuLanes | CudaLanes
    # gloo group of the iteration barriers and the cross-rank figures (the agreement goes
    # through the store, so a failed rank's agreement never meets a peer's barrier).
    sync_group: Any
    seed: int = 0
    calibration: dict[str, float] = field(default_factory=dict)
    window_id: int = 0
    collect_timeline: bool = False  # every rank's intervals on rank 0 (--trace, --plot)
    rounds: int = DEFAULT_ROUNDS  # of a pattern with what-if variants
    note: Callable[..., None] | None = None  # rank 0's progress line (None on other ranks)
    # Device work outlived an abort (NCCL kernels that cannot end): nothing may be freed or
    # torn down any more; the rank leaves once the failure is saved and printed.
    wedged: bool = False


def make_rig(
    suite: SuiteSpec, options: RunOptions, place: RankPlace, comms: Any, sync_group: Any
) -> Rig:
    """This rank's rig for ``suite``: its lanes and their gate, then its profiler (started: CUPTI
    records from here on, the gate's calibration left out)."""
    sides = [v for p in suite.patterns for v in (p, *p.variants)]
    registered = sorted({b.name for p in sides for b in p.blocks if b.register_buffers})
    if registered and place.is_cuda:
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
        rounds=options.rounds,
    )


PROBE_TIMEOUT_S = 120.0

# Runs in a fresh interpreter on the parent's device: a 1-rank NCCL group (in-process store,
# no port), a pool over its allocator, a registered all_reduce on a pool tensor.
_PROBE = """
import sys, torch, torch.distributed as dist
device = torch.device("cuda", int(sys.argv[1]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
try:
    backend = dist.group.WORLD._get_backend(device)
    pool = torch.cuda.MemPool(backend.mem_allocator)
    with torch.cuda.use_mem_pool(pool):
        t = torch.ones(1 << 16, device=device)
    backend.register_mem_pool(pool)
    dist.all_reduce(t)
    torch.cuda.synchronize(device)
    backend.deregister_mem_pool(pool)
    print("ok" if t[0].item() == 1.0 else "wrong result")
finally:
    dist.destroy_process_group()
"""


def require_support(device_index: int) -> None:
    """Raise a RunError naming torch and NCCL unless this torch/NCCL can back a MemPool with
    NCCL memory (:data:`_PROBE`)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, str(device_index)],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        detail = f"the probe did not finish in {PROBE_TIMEOUT_S:.0f} s"
    else:
        out = proc.stdout.strip().splitlines()
        if proc.returncode == 0 and out and out[-1] == "ok":
            return
        detail = _last_error_line(proc.stderr) or f"probe exited with {proc.returncode}"
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # a CUDA torch without NCCL
        nccl = "unknown"
    raise RunError(
        f"register_buffers: torch {torch.__version__} with NCCL {nccl} cannot allocate "
        f"buffers from NCCL's memory allocator ({detail}); set register_buffers: false, or "
        "use a torch build whose ProcessGroupNCCL supports mem_allocator",
        phase="setup",
    )


def _last_error_line(stderr: str) -> str:
    """The exception line of a traceback (``RuntimeError: ...``), without rank prefixes."""
    lines = [ln.split("]: ", 1)[-1].strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error:" in ln or "error:" in ln]
    return (errors or lines or [""])[-1]
