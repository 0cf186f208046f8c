"""Result records: one per (pattern, block) and one per pattern (core/output/results.py holds
the columns and dtypes of the files made from them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .activities import DeviceActivities


@dataclass(frozen=True, kw_only=True)
class BlockResult:
    """Everything measured for one block of one pattern (aggregated over ranks, iterations)."""

    suite: str
    pattern: str
    block: str
    op: str
    axis: str
    lane: str
    team_size: int
    dtype: str
    size_bytes: int | None
    iters: int
    work: str = ""
    """The block's parameters as measured (after any --max-size cap): ``m=4096 n=4096 k=4096``."""
    latency_avg_us: float
    latency_min_us: float
    latency_max_us: float
    latency_p50_us: float
    latency_p99_us: float
    latency_stdev_us: float
    algbw_gbps: float = math.nan
    busbw_gbps: float = math.nan
    tflops: float = math.nan
    isolated_latency_avg_us: float = math.nan
    isolated_latency_stdev_us: float = math.nan
    slowdown: float = math.nan
    wrong_elements: int | None = None
    start_skew_us: float = math.nan
    """Mean over iterations of the latest minus the earliest start of this block over the
    ranks that run it (the ranks must share a clock: one host; NaN otherwise)."""
    last_to_start_rank: int | None = None
    """The rank that started this block last in the most iterations: for a collective, the
    one the others waited for (None where start skew is unknown)."""
    duration_spread_us: float = math.nan
    """Largest minus smallest per-rank mean duration (a collective's early rank waits longest)."""
    activities_per_iter: float = math.nan
    kernel_ctas_max: int | None = None
    """Largest grid (CTAs) of the block's kernels, max over ranks (CUPTI only): a per-axis
    ``nccl: {max_ctas: N}`` shows here as at most N for the axis's NCCL kernels."""
    enqueue_avg_us: float = math.nan
    """Host time in the block's ``launch`` per iteration (CUDA; max over ranks)."""
    profiler: str = ""
    ranks_per_gpu: int | None = None
    """Ranks sharing one GPU (1 normally; more only in NCCL's multi-rank test mode, whose
    timings describe nothing real); None on CPU."""
    notes: str = ""
    """Settings behind the numbers, or why a block was not timed (``; ``-separated)."""


@dataclass(frozen=True, kw_only=True)
class PatternResult:
    """Pattern-level figures: makespan, overlap efficiency, shared bandwidth, skews."""

    suite: str
    pattern: str
    iters: int
    num_blocks: int
    warmup_iters: int = 0
    sync: str = "barrier"
    """How iterations were separated and started (``barrier``, ``barrier-only``, ``none``)."""
    graph: bool = False
    """CUDA-graph mode: each block's launch captured once and replayed."""
    makespan_avg_us: float
    makespan_p99_us: float
    serial_us: float = math.nan
    ideal_us: float = math.nan
    overlap_efficiency: float = math.nan
    shared_busbw_gbps: float = math.nan
    comm_compute_overlap: float = math.nan
    lane_skew_p50_us: float = math.nan
    lane_skew_p99_us: float = math.nan
    lane_skew_max_us: float = math.nan
    gate_skew_p50_us: float = math.nan
    """Median over iterations of the spread across ranks of the instant their gates opened
    (ranks on one host, with a profiler on the host clock; NaN otherwise)."""
    gate_skew_max_us: float = math.nan
    gate_delay_max_us: float = math.nan
    """Largest wait from the gate opening to a lane's first activity (GPU-side: a lane
    waiting for SMs or copy engines held by another lane shows here)."""
    gate_spin_us: float = math.nan
    """The gate kernel's spin per iteration, calibrated from the warmup (CUDA)."""
    enqueue_max_us: float = math.nan
    """Longest host enqueue of one iteration, gate included (CUDA; max over ranks)."""
    host_late_iters: int | None = None
    """Iterations whose enqueue outlasted the gate spin on some rank (launch-bound)."""
    peak_memory_bytes: int | None = None
    profiler: str = ""
    ranks_per_gpu: int | None = None
    """Ranks sharing one GPU (see BlockResult.ranks_per_gpu)."""
    notes: str = ""
    """Figures to read with care and why (``; ``-separated), e.g. an efficiency outside [0, 1]."""
    pairwise_overlap: dict[str, float] = field(default_factory=dict)
    """``"a|b"`` -> mean |A∩B| / min(|A|,|B|) over ranks and iterations."""


@dataclass(frozen=True, kw_only=True)
class PatternOutcome:
    """One finished pattern: its blocks' results and its own."""

    blocks: tuple[BlockResult, ...]
    pattern: PatternResult
    warnings: tuple[str, ...] = ()
    timeline: Timeline | None = None
    """Every rank's intervals; present on rank 0 when a trace or plot was asked for."""
    comm_compute_overlap_by_rank: tuple[float, ...] = ()
    """Per rank, communication time hidden under compute / communication time (NaN: none)."""

    @property
    def check_failed(self) -> bool:
        """Check mode found wrong output elements in some block (the run must fail)."""
        return any(b.wrong_elements for b in self.blocks)


@dataclass(frozen=True, kw_only=True)
class RankTimeline:
    """One rank's intervals of a pattern's measured window, on that rank's own clock."""

    rank: int
    starts_ns: Any
    """int64 array (blocks, iters); rows of blocks the rank does not run are never read."""
    ends_ns: Any
    present: Any
    """bool array (blocks,): the rank runs this block."""
    clock: str
    """``perf_counter``, ``cuda_event`` or ``cupti`` (see ``WindowTimings.clock``)."""
    activities: DeviceActivities | None = None
    """The window's device activities with their names and launching API calls (CUPTI with
    ``--trace`` only; None otherwise)."""


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """Every rank's intervals of one pattern (gathered on rank 0 for ``--trace``/``--plot``).

    Within a rank, times are exact. Across ranks they compare only when ``shared_clock``.
    """

    pattern: str
    block_names: tuple[str, ...]
    block_lanes: tuple[str, ...]
    """The lane (stream or thread) each block runs on; blocks on one lane run in order."""
    ranks: tuple[RankTimeline, ...]
    shared_clock: bool = False
    """Every rank's timestamps are one clock (ranks on one host, and a profiler clock of that
    host: CUPTI's CLOCK_REALTIME or perf_counter's CLOCK_MONOTONIC; CUDA events are not)."""
    block_categories: tuple[str, ...] = ()
    """Each block's category (``comm``, ``compute``, ...; empty: unknown): what maestro's
    comm/compute overlap counts as communication and as computation."""
    backend: str = ""
    """The process-group backend of the run (``nccl``, ``gloo``)."""

    def rank_arrays(self) -> list[tuple[RankTimeline, np.ndarray, np.ndarray, np.ndarray]]:
        """(rank timeline, starts, ends, present) as numpy arrays, for each rank that ran a
        block for at least one iteration; ValueError when a rank's arrays disagree in shape."""
        rows = []
        for rt in self.ranks:
            starts = np.asarray(rt.starts_ns, dtype=np.int64)
            ends = np.asarray(rt.ends_ns, dtype=np.int64)
            present = np.asarray(rt.present, dtype=bool).reshape(-1)
            if (
                starts.ndim != 2
                or starts.shape != ends.shape
                or present.shape[0] != starts.shape[0]
            ):
                raise ValueError(
                    f"timeline of pattern {self.pattern!r}, rank {rt.rank}: starts_ns "
                    f"{starts.shape}, ends_ns {ends.shape} and present {present.shape} do not "
                    "match (expected (blocks, iters), (blocks, iters), (blocks,))"
                )
            if starts.shape[1] == 0 or not present.any():
                continue
            rows.append((rt, starts, ends, present))
        return rows
