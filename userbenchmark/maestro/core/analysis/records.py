"""Result records per (pattern, block), pattern and pair of blocks: the one schema the files'
columns and the metrics (core/output/) are read from, never written out a second time."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..config.spec import whatif_label

if TYPE_CHECKING:
    from .intervals import DeviceActivities

Direction = Literal["lower", "higher"]
Domain = Literal["positive", "non_negative", "fraction", "finite"]
Level = Literal["block", "pattern", "pair"]


@dataclass(frozen=True, kw_only=True)
class Metric:
    """What a record field means as a metric of the metrics file and of ``compare``."""

    better: Direction | None
    """None: descriptive, neither way is better."""
    domain: Domain
    """``positive`` (> 0), ``non_negative``, ``fraction`` (in [0, 1]) or ``finite``; any other
    value is invalid, never judged."""
    meaning: str
    floor: float | None
    """The smallest change that counts (drift one run cannot see), a fraction of the control
    value or in the metric's unit when ``absolute``; None: not judged (noise not measured)."""
    absolute: bool = False
    exact: bool = False
    """A count without noise (wrong elements): any change past the floor counts."""
    harness: bool = False
    """A diagnostic of maestro's own harness, not of the system under test: ``compare`` and the
    A/B detector show its verdict and never let it decide, unless ``--judge-harness``."""

    @property
    def interval(self) -> bool:
        """The record carries a 95 % interval for it (``<name>_ci_low``/``_ci_high``/``_ci_df``)."""
        return self.floor is not None and not self.exact


def metric(*, default: Any = math.nan, **info: Any) -> Any:
    """A record field that is a metric described by :class:`Metric`'s fields."""
    return field(default=default, metadata={"metric": Metric(**info)})


# Floors and the harness's metrics: why each is judged as it is, docs/torchbench.md. Latencies,
# bandwidths, rates and their ratios are > 0 whenever measured (an untimed block has no value,
# not a 0); counts and skews are >= 0.
_REQUIRED = dataclasses.MISSING
_INTERVALS = {"intervals": True}


def _latency(meaning: str, floor: float | None = 0.05, default: Any = math.nan) -> Any:
    return metric(better="lower", domain="positive", meaning=meaning, floor=floor, default=default)


def _rate(meaning: str) -> Any:
    return metric(better="higher", domain="positive", meaning=meaning, floor=0.05)


def _skew(meaning: str, floor: float | None = None, *, harness: bool = True, **info: Any) -> Any:
    info = {"domain": "non_negative", **info}
    return metric(
        better="lower", meaning=meaning, floor=floor, absolute=True, harness=harness, **info
    )


def _fraction(meaning: str, domain: Domain = "fraction") -> Any:
    return metric(better="higher", domain=domain, meaning=meaning, floor=0.05, absolute=True)


@dataclass(frozen=True, kw_only=True)
class _Record:
    """The keys every record starts with."""

    suite: str
    pattern: str
    variant: str = ""  # a what-if variant's name, its pattern step[whatif=NAME]; "" for the pattern


@dataclass(frozen=True, kw_only=True)
class BlockResult(_Record):
    """Everything measured for one block of one pattern (aggregated over ranks, iterations); the
    columns are README.md's "What the numbers mean" (replay columns: docs/replay.md)."""

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
    latency_avg_us: float = _latency(
        "mean of the per-iteration max-over-ranks latency", default=_REQUIRED
    )
    latency_min_us: float = _latency("smallest iteration latency", None, _REQUIRED)
    latency_max_us: float = _latency("largest iteration latency", None, _REQUIRED)
    latency_p50_us: float = _latency("median iteration latency (nearest rank)", 0.05, _REQUIRED)
    latency_p99_us: float = _latency(
        "99th-percentile latency (nearest rank; 100 iterations or more)", None
    )
    latency_stdev_us: float
    algbw_gbps: float = _rate("size / avg latency, GB = 1e9 bytes")
    busbw_gbps: float = _rate("algbw times the collective's bus factor")
    tflops: float = _rate("GEMM rate, 2mnk / avg latency, 1e12 FLOP/s")
    isolated_latency_avg_us: float = _latency("mean latency of the block run alone")
    isolated_latency_stdev_us: float = math.nan
    slowdown: float = _latency("overlapped avg / isolated avg latency")
    wrong_elements: int | None = metric(
        better="lower",
        domain="non_negative",
        meaning="elements that failed check mode",
        floor=0.0,
        absolute=True,
        exact=True,
        default=None,
    )
    start_skew_us: float = _skew("spread of the block's start across ranks", 5.0)
    last_to_start_rank: int | None = None
    duration_spread_us: float = _skew("spread of per-rank mean durations", harness=False)
    activities_per_iter: float = math.nan
    kernel_ctas_max: int | None = None
    enqueue_avg_us: float = _skew("host time in the block's launch per iteration")
    traced_us: float = math.nan
    kernel: str = ""
    """An imported block's kernel that took most of its time on rank 0 (CUPTI; '' unknown)."""
    traced_kernel: str = ""
    traced_overlap: float = math.nan
    replay_ratio: float = math.nan
    """latency_avg_us / traced_us."""
    replay_ratio_ci_low: float = math.nan
    replay_ratio_ci_high: float = math.nan
    profiler: str = ""
    ranks_per_gpu: int | None = None
    notes: str = ""
    """Settings behind the numbers, or why a block was not timed (``; ``-separated)."""
    intervals: dict[str, tuple[float, float, int]] = field(
        default_factory=dict, metadata=_INTERVALS
    )


@dataclass(frozen=True, kw_only=True)
class PatternResult(_Record):
    """Pattern-level figures: makespan, overlap efficiency, shared bandwidth, skews (documented
    as :class:`BlockResult`'s)."""

    iters: int
    num_blocks: int
    warmup_iters: int = 0
    sync: str = "barrier"
    graph: bool = False
    makespan_avg_us: float = _latency("mean of last end - first start", default=_REQUIRED)
    makespan_p99_us: float = _latency("99th-percentile makespan (100 iterations or more)", None)
    serial_us: float = _latency("sum of the blocks' isolated latencies")
    ideal_us: float = _latency("critical path of isolated latencies (perfect overlap)")
    # below 0: slower than serial; above 1: beat the ideal
    overlap_efficiency: float = _fraction("(serial-makespan)/(serial-ideal)", "finite")
    shared_busbw_gbps: float = _rate("all collectives' bus bytes / makespan")
    comm_compute_overlap: float = _fraction("|comm & compute| / |comm|")
    lane_skew_p50_us: float = _skew("median gap between the lanes' first kernels")
    lane_skew_p99_us: float = _skew("p99 gap between the lanes' first kernels")
    lane_skew_max_us: float = _skew("largest gap between the lanes' first kernels")
    gate_skew_p50_us: float = _skew("median spread of the ranks' gate openings")
    gate_skew_max_us: float = _skew("largest spread of the ranks' gate openings")
    gate_delay_max_us: float = _skew(
        "largest wait from the gate to a lane's first start", domain="finite"
    )
    gate_spin_us: float = math.nan
    enqueue_max_us: float = _skew("longest host enqueue of one iteration")
    host_late_iters: int | None = _skew("iterations launch-bound on some rank", default=None)
    traced_us: float = math.nan
    replay_ratio: float = math.nan
    """makespan_avg_us / traced_us."""
    replay_ratio_ci_low: float = math.nan
    replay_ratio_ci_high: float = math.nan
    replay_by_rank: str = ""
    peak_memory_bytes: int | None = None
    profiler: str = ""
    ranks_per_gpu: int | None = None
    notes: str = ""
    """Figures to read with care and why (``; ``-separated), e.g. an efficiency outside [0, 1]."""
    intervals: dict[str, tuple[float, float, int]] = field(
        default_factory=dict, metadata=_INTERVALS
    )


@dataclass(frozen=True, kw_only=True)
class PairResult(_Record):
    """Two blocks of one pattern: how much they ran at the same time."""

    blocks: tuple[str, str] = field(metadata={"columns": ("block_a", "block_b")})
    """(a, b): a comes before b in the pattern."""
    # Descriptive, not judged: two blocks on one lane are meant not to overlap, and running at
    # the same time is not sharing nothing (read their slowdown beside it).
    pairwise_overlap: float = metric(
        better=None,
        domain="fraction",
        meaning="time both blocks were running / the shorter block's time",
        floor=None,
    )


@dataclass(frozen=True, kw_only=True)
class PatternOutcome:
    """One finished pattern: its blocks' results and its own."""

    blocks: tuple[BlockResult, ...]
    pattern: PatternResult
    pairs: tuple[PairResult, ...] = ()
    warnings: tuple[str, ...] = ()
    timeline: Timeline | None = None
    """On rank 0 when a trace or plot was asked for."""
    comm_compute_overlap_by_rank: tuple[float, ...] = ()
    variant: str | None = None
    """The what-if variant measured (a pattern's ``whatif:`` key); None for the pattern itself."""

    def of_variant(self, variant: str) -> PatternOutcome:
        """This outcome as the what-if ``variant``'s: each record (and the timeline) names the
        pattern ``step[whatif=variant]`` and the variant, so it has rows and keys of its own."""
        label = whatif_label(self.pattern.pattern, variant)
        named = functools.partial(dataclasses.replace, pattern=label, variant=variant)
        timeline = self.timeline and dataclasses.replace(self.timeline, pattern=label)
        blocks, pairs = tuple(map(named, self.blocks)), tuple(map(named, self.pairs))
        parts = {"blocks": blocks, "pattern": named(self.pattern), "pairs": pairs}
        return dataclasses.replace(self, **parts, timeline=timeline, variant=variant)

    @property
    def check_failed(self) -> bool:
        """Check mode found wrong output elements in some block (the run must fail)."""
        return any(b.wrong_elements for b in self.blocks)


RECORDS: dict[Level, type] = {"block": BlockResult, "pattern": PatternResult, "pair": PairResult}
"""The record type of each level, in the order the metrics file lists them."""


def metrics_of(record_type: type) -> dict[str, Metric]:
    """The metric fields of a record type, in field order."""
    return {
        f.name: f.metadata["metric"]
        for f in dataclasses.fields(record_type)
        if "metric" in f.metadata
    }


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
    """CUPTI with ``--trace`` only."""


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """Every rank's intervals of one pattern (gathered on rank 0 for ``--trace``/``--plot``):
    exact within a rank; across ranks they compare only when ``shared_clock``."""

    pattern: str
    block_names: tuple[str, ...]
    block_lanes: tuple[str, ...]
    """The lane (stream or thread) each block runs on; blocks on one lane run in order."""
    ranks: tuple[RankTimeline, ...]
    shared_clock: bool = False
    """Ranks on one host, with a profiler on its clock (CUPTI's CLOCK_REALTIME or
    perf_counter's CLOCK_MONOTONIC; CUDA events are not)."""
    block_categories: tuple[str, ...] = ()
    """``comm``, ``compute``, ... per block (empty: unknown), as the comm/compute overlap reads."""
    backend: str = ""

    def rank_arrays(self) -> list[tuple[RankTimeline, np.ndarray, np.ndarray, np.ndarray]]:
        """(rank timeline, starts, ends, present) of each rank that ran a block at least once;
        ValueError when a rank's arrays disagree in shape."""
        rows = []
        for rt in self.ranks:
            starts = np.asarray(rt.starts_ns, dtype=np.int64)
            ends = np.asarray(rt.ends_ns, dtype=np.int64)
            present = np.asarray(rt.present, dtype=bool).reshape(-1)
            if starts.ndim != 2 or starts.shape != ends.shape or present.shape != starts.shape[:1]:
                raise ValueError(
                    f"timeline of pattern {self.pattern!r}, rank {rt.rank}: starts_ns "
                    f"{starts.shape}, ends_ns {ends.shape} and present {present.shape} do not "
                    "match (expected (blocks, iters), (blocks, iters), (blocks,))"
                )
            if starts.shape[1] == 0 or not present.any():
                continue
            rows.append((rt, starts, ends, present))
        return rows
