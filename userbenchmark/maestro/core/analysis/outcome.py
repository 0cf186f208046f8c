"""Result records of one pattern from its aggregated window (pure: no ranks, no torch), each interval
from one bootstrap per measured window (stats.py)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...blocks.base import Block
from ...blocks.compute import Busy, Sleep
from ..config.spec import PatternSpec, SuiteSpec
from . import overlap
from .aggregate import MAX_PAIR_BLOCKS, WindowAggregate
from .records import BlockResult, PairResult, PatternOutcome, PatternResult
from .stats import (
    LatencyStats,
    Phase,
    degrees_of_freedom,
    interval,
    latency_stats,
    measurable,
    percentile_nearest_rank,
    unmeasurable_note,
)

MIN_ITERS_FOR_P99 = 100
"""Below this many iterations p99 is left out: the nearest-rank p99 would be the max again."""


@dataclass(frozen=True, kw_only=True)
class Isolated:
    """Each block run alone: its latency per iteration (ns, NaN rows: not measured)."""

    latency_ns: np.ndarray  # (blocks, iters)

    @classmethod
    def unmeasured(cls, num_blocks: int) -> Isolated:
        return cls(latency_ns=np.full((num_blocks, 0), np.nan))


_NAN_STATS = LatencyStats(count=0)


def _stats(durations_ns: np.ndarray) -> LatencyStats:
    """All NaN for an idle block; a row with some iterations missing is a bug and raises."""
    if np.isnan(durations_ns).all():
        return _NAN_STATS
    stats = latency_stats(durations_ns)
    if stats.count < MIN_ITERS_FOR_P99:
        stats = dataclasses.replace(stats, p99_us=math.nan)
    return stats


def _us(values_ns: np.ndarray, how: str) -> float:
    finite = values_ns[np.isfinite(values_ns)]
    if not finite.size or (how == "p99" and finite.size < MIN_ITERS_FOR_P99):
        return math.nan
    if how[0] == "p":
        return percentile_nearest_rank(finite, float(how[1:])) / 1e3
    return float(getattr(finite, how)()) / 1e3


class _Figures:
    """One pattern's records in the making: its windows (aggregated, and each block's alone), their
    bootstraps and the intervals made from them, and what the pattern's figures take from its
    blocks' (each one's isolated latency's replicates and bus bytes)."""

    def __init__(
        self, pattern: PatternSpec, agg: WindowAggregate, isolated: Isolated, head: dict[str, Any]
    ) -> None:
        self.pattern = pattern
        self.agg = agg
        self.isolated = isolated
        self.head = head
        self.over = Phase(seed=0)
        self.alone = [Phase(seed=b + 1) for b in range(len(pattern.blocks))]
        self.intervals: dict[str, tuple[float, float, int]] = {}
        self.iso_reps: list[np.ndarray] = []  # µs, one per block figured (empty: not measured)
        self.bus_bytes = 0.0  # per iteration, over the blocks figured

    def add(
        self,
        name: str,
        estimate: float,
        replicates: np.ndarray,
        df: int,
        *,
        limits: tuple[float, float] = (0.0, math.inf),
    ) -> np.ndarray:
        """Record ``name``'s interval from replicates of ``df`` + 1 independent blocks, within
        ``limits`` (the values it can take); returns the replicates."""
        if replicates.size:
            with np.errstate(invalid="ignore", divide="ignore"):
                low, high = interval(estimate, replicates, df)
            self.intervals[name] = (max(low, limits[0]), min(high, limits[1]), df)
        return replicates

    def add_stat(
        self,
        name: str,
        estimate: float,
        values_ns: np.ndarray,
        statistic: str = "mean",
        phase: Phase | None = None,
    ) -> np.ndarray:
        """Interval of a statistic (``mean``, ``p50``) of a series (ns), in µs, from its window's
        bootstrap (default: the overlapped window's); returns the replicates (empty: none)."""
        if not math.isfinite(estimate):
            return np.empty(0)
        replicates = (phase or self.over).resample(values_ns, statistic) / 1e3
        return self.add(name, estimate, replicates, degrees_of_freedom(values_ns))

    def take(self) -> dict[str, tuple[float, float, int]]:
        out, self.intervals = self.intervals, {}
        return out


def _note_if(flag: bool, text: str) -> list[str]:
    return [text] if flag else []


FAR_OVER_US = 50.0
"""A ``sleep`` or ``busy`` block is far over its ``duration_us`` past 1.5x it and 50 µs more."""


def _over_asked_notes(
    cls: type[Block], params: Mapping[str, Any], avg_us: float, alone_us: float, *, cpu: bool
) -> list[str]:
    """A ``sleep`` or ``busy`` block far over its duration was held up (it waits or works until
    its deadline); on a GPU what overlaps ``busy`` slows it, so only its time alone is judged."""
    if not issubclass(cls, (Sleep, Busy)):
        return []
    asked = float(params["duration_us"])
    judged = {"overlapped": avg_us} if cpu or issubclass(cls, Sleep) else {}
    limit = max(1.5 * asked, asked + FAR_OVER_US)
    over = [f"{k} {v:.1f} µs" for k, v in {**judged, "alone": alone_us}.items() if v > limit]
    held = "thread was kept from running (more threads than cores, the GIL)" if cpu else "waited"
    return _note_if(
        bool(over),
        f"average latency {' and '.join(over)}: far over the {asked:g} µs this {cls.op} block "
        f"asks for, which it cannot take by itself; its lane {held}",
    )


def _slowdown_notes(slowdown: float, interval: tuple[float, ...], num_iters: int) -> list[str]:
    """Faster overlapped than alone, beyond noise and measurable; or why it is not measurable."""
    low, high, _ = interval
    return _note_if(
        high < 1.0 and measurable("slowdown", slowdown, low, high),
        f"slowdown {slowdown:.3f} (95 % interval up to {high:.3f}) < 1 beyond noise: faster "
        "overlapped than alone; the isolated run was slower (clocks, caches, a busier machine) "
        "or the block gained from the overlap",
    ) + [unmeasurable_note("slowdown", slowdown, interval, num_iters)]


def _block_result(
    fig: _Figures, b: int, cls: type[Block], team_size: int, given: Sequence[str], wrong: int | None
) -> BlockResult:
    """Block ``b``'s record; its isolated latency's replicates and bus bytes go to ``fig``."""
    spec = fig.pattern.blocks[b]
    agg = fig.agg
    lat = agg.latency_ns[b]
    stats = _stats(lat)
    df = degrees_of_freedom(lat)
    mean = fig.add_stat("latency_avg_us", stats.avg_us, lat)
    fig.add_stat("latency_p50_us", stats.p50_us, lat, "p50")
    # The op's arithmetic is its class's: S, bus factor and FLOPs (blocks/). A team of one
    # rank moves nothing over a bus: its busbw does not apply (NaN, never 0).
    size = cls.message_size_bytes(spec.params)
    factor = cls.bus_factor(team_size) if size is not None and team_size > 1 else None
    flops = cls.flop_count(spec.params)
    seconds = stats.avg_us * 1e-6
    timed = seconds > 0
    algbw = size / seconds / 1e9 if size is not None and timed else math.nan
    values = {
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * factor if factor is not None else math.nan,
        "tflops": flops / seconds / 1e12 if flops is not None and timed else math.nan,
    }
    for name, value in values.items():
        if math.isfinite(value):
            fig.add(name, value, value * stats.avg_us / mean, df)
    alone = fig.isolated.latency_ns[b]  # every statistic of it reads its finite values only
    iso_avg = _us(alone, "mean")
    iso_df = degrees_of_freedom(alone)
    iso_rep = fig.add_stat("isolated_latency_avg_us", iso_avg, alone, phase=fig.alone[b])
    fig.iso_reps.append(iso_rep)
    fig.bus_bytes += size * factor if factor is not None and timed else 0.0
    slowdown = float(overlap.slowdown(stats.avg_us, iso_avg))
    if math.isfinite(slowdown) and iso_rep.size:
        fig.add("slowdown", slowdown, mean / iso_rep, min(df, iso_df))
    start_skew = _us(agg.start_skew_ns[b], "mean")
    fig.add_stat("start_skew_us", start_skew, agg.start_skew_ns[b])
    intervals = fig.take()
    cpu = fig.head["profiler"] == "host"
    notes = _over_asked_notes(cls, spec.params, stats.avg_us, iso_avg, cpu=cpu)
    notes += _slowdown_notes(
        slowdown, intervals.get("slowdown", (math.nan,) * 3), fig.pattern.num_iters
    )
    last = int(agg.last_to_start_rank[b])
    ctas = agg.kernel_ctas_max[b]
    return BlockResult(
        **fig.head,
        block=spec.name,
        op=spec.op,
        axis=spec.axis,
        lane=spec.lane,
        team_size=team_size,
        dtype=spec.dtype,
        size_bytes=size,
        iters=lat.size,  # every round's, for a pattern measured in rounds
        work=spec.work,
        **{f"latency_{k}": v for k, v in dataclasses.asdict(stats).items() if k != "count"},
        **values,
        isolated_latency_avg_us=iso_avg,
        isolated_latency_stdev_us=_us(alone, "std"),
        slowdown=slowdown,
        start_skew_us=start_skew,
        last_to_start_rank=last if last >= 0 else None,
        duration_spread_us=float(agg.duration_spread_ns[b]) / 1e3,
        activities_per_iter=float(agg.activities_per_iter[b]),
        kernel_ctas_max=int(ctas) if np.isfinite(ctas) else None,
        enqueue_avg_us=float(agg.launch_avg_ns[b]) / 1e3,
        wrong_elements=wrong,
        notes="; ".join(n for n in (*given, *notes) if n),
        intervals=intervals,
    )


def build_outcome(
    suite: SuiteSpec,
    pattern: PatternSpec,
    classes: Sequence[type[Block]],
    agg: WindowAggregate,
    isolated: Isolated,
    wrong: np.ndarray | None,
    peak_memory_bytes: int | None,
    *,
    profiler: str,
    team_sizes: Sequence[int],
    notes: Sequence[Sequence[str]] | None = None,
    ranks_per_gpu: int | None = None,
) -> PatternOutcome:
    """Turn an aggregated window into result records (pure: unit-testable without ranks)."""
    head = dict(
        suite=suite.name, pattern=pattern.name, profiler=profiler, ranks_per_gpu=ranks_per_gpu
    )
    fig = _Figures(pattern, agg, isolated, head)
    blocks = []
    for b, cls in enumerate(classes):
        given = notes[b] if notes else ()
        checked = None if wrong is None else int(wrong[b])
        blocks.append(_block_result(fig, b, cls, team_sizes[b], given, checked))
    pattern_result = _pattern_result(fig, blocks)
    fractions = agg.pairwise_overlap  # (0, 0) past MAX_PAIR_BLOCKS: no pairs
    pairs = tuple(
        PairResult(
            suite=suite.name,
            pattern=pattern.name,
            blocks=(pattern.blocks[i].name, pattern.blocks[j].name),
            pairwise_overlap=float(fractions[i, j]),
        )
        for i, j in itertools.combinations(range(len(fractions)), 2)
    )
    return PatternOutcome(
        blocks=tuple(blocks),
        pattern=dataclasses.replace(pattern_result, peak_memory_bytes=peak_memory_bytes),
        pairs=pairs,
        warnings=tuple(_warnings(pattern, agg, wrong, ranks_per_gpu)),
        comm_compute_overlap_by_rank=tuple(float(v) for v in agg.comm_compute_overlap_by_rank),
    )


def _overlap_figures(
    fig: _Figures, blocks: Sequence[BlockResult], makespan_us: float, makespan_rep: np.ndarray
) -> dict[str, float]:
    """Each resample recomputes serial and ideal from the same isolated resamples, so the
    interval knows that ideal is one of serial's terms."""
    iso = np.array([b.isolated_latency_avg_us for b in blocks])
    if len(blocks) < 2 or not np.isfinite(iso).all() or not makespan_rep.size:
        return {}
    reps = np.stack(fig.iso_reps)  # (blocks, resamples)
    df = min(b.intervals["isolated_latency_avg_us"][2] for b in blocks)
    ideals = [overlap.critical_path(col, fig.pattern.predecessors) for col in (iso, *reps.T)]
    serial, ideal = float(iso.sum()), ideals[0]  # then one per resample
    serial_rep = fig.add("serial_us", serial, reps.sum(axis=0), df)
    ideal_rep = fig.add("ideal_us", ideal, np.array(ideals[1:]), df)
    efficiency = float(overlap.overlap_efficiency(serial, makespan_us, ideal))
    if math.isfinite(efficiency):
        fig.add(
            "overlap_efficiency",
            efficiency,
            # No headroom guard per resample: a resample with little headroom is part of the
            # noise (a wide interval), not a hole in it.
            overlap.overlap_efficiency(
                serial_rep, makespan_rep, ideal_rep, min_headroom_fraction=0.0
            ),
            df,  # the makespan's window has as many iterations as each block's
            limits=(-math.inf, math.inf),
        )
    return {"serial_us": serial, "ideal_us": ideal, "overlap_efficiency": efficiency}


def below_ideal(p: PatternResult) -> bool:
    """The makespan is below the ideal beyond noise, which cannot be (the pattern's note says
    why): an overlap efficiency measurable and above 1 beyond noise or, without an efficiency,
    the makespan's interval below the ideal's."""
    if math.isfinite(p.overlap_efficiency):
        low, high, _ = p.intervals.get("overlap_efficiency", (math.nan,) * 3)
        return low > 1 and measurable("overlap_efficiency", p.overlap_efficiency, low, high)
    makespan_high = p.intervals.get("makespan_avg_us", (math.nan,) * 3)[1]
    return makespan_high < p.intervals.get("ideal_us", (math.nan,) * 3)[0]


def _pattern_notes(p: PatternResult, num_iters: int) -> list[str]:
    """Figures to read with care, each only beyond its noise; pairs left out of a large pattern."""
    efficiency, n = p.overlap_efficiency, p.num_blocks
    low, high, df = p.intervals.get("overlap_efficiency", (math.nan,) * 3)
    where = f"overlap efficiency {efficiency:.3f} (95 % interval {low:.3f} to {high:.3f})"
    notes = _note_if(
        high < 0 and measurable("overlap_efficiency", efficiency, low, high),
        f"{where} < 0 beyond noise: the blocks took longer together than one after another "
        "(they slow each other down more than overlap saves)",
    )
    notes += _note_if(
        below_ideal(p),
        f"makespan {p.makespan_avg_us:.1f} µs below the ideal {p.ideal_us:.1f} µs"
        + (f", {where} above 1 beyond noise" if math.isfinite(efficiency) else "")
        + ": cannot be, the ideal is the critical path of the blocks run alone; the blocks "
        "ran faster together than alone, so the isolated runs were slowed (a busier host, "
        "clocks, cold caches): read slowdown and efficiency with care",
    )
    notes.append(unmeasurable_note("overlap_efficiency", efficiency, (low, high, df), num_iters))
    return notes + _note_if(
        n > MAX_PAIR_BLOCKS,
        f"no pairs of blocks recorded (pairs.*, ran together): {n} blocks make "
        f"{n * (n - 1) // 2:,} pairs, and pairs are kept for patterns of at most "
        f"{MAX_PAIR_BLOCKS} blocks (their cost grows with the square of the blocks)",
    )


def _pattern_result(fig: _Figures, blocks: Sequence[BlockResult]) -> PatternResult:
    # One block: its makespan is its latency, and serial and ideal its isolated latency;
    # those copies are left out (one change must count once).
    pattern = fig.pattern
    agg = fig.agg
    several = len(blocks) > 1
    makespan = _stats(agg.makespan_ns) if several else _NAN_STATS
    makespan_rep = fig.add_stat("makespan_avg_us", makespan.avg_us, agg.makespan_ns)
    figures = _overlap_figures(fig, blocks, makespan.avg_us, makespan_rep)
    shared = math.nan
    if fig.bus_bytes and several:
        shared = float(overlap.shared_busbw_gbps(fig.bus_bytes, makespan.avg_us * 1e-6))
        replicates = shared * makespan.avg_us / makespan_rep
        fig.add("shared_busbw_gbps", shared, replicates, degrees_of_freedom(agg.makespan_ns))
    cc = agg.comm_compute_overlap
    if math.isfinite(cc):
        hidden, comm = (fig.over.resample(r, drift=False) for r in agg.comm_compute_by_iter)
        df = degrees_of_freedom(agg.comm_compute_by_iter[1])
        fig.add("comm_compute_overlap", cc, hidden / comm, df, limits=(0.0, 1.0))
    result = PatternResult(
        **fig.head,
        iters=agg.latency_ns.shape[1],
        num_blocks=len(blocks),
        warmup_iters=pattern.warmup_iters,
        sync=pattern.sync,
        graph=pattern.graph,
        makespan_avg_us=makespan.avg_us,
        makespan_p99_us=makespan.p99_us,
        **figures,
        shared_busbw_gbps=shared,
        comm_compute_overlap=cc,
        lane_skew_p50_us=_us(agg.lane_skew_ns, "p50"),
        lane_skew_p99_us=_us(agg.lane_skew_ns, "p99"),
        lane_skew_max_us=_us(agg.lane_skew_ns, "max"),
        gate_skew_p50_us=_us(agg.gate_skew_ns, "p50"),
        gate_skew_max_us=_us(agg.gate_skew_ns, "max"),
        gate_delay_max_us=_us(agg.gate_delay_ns, "max"),
        gate_spin_us=float(agg.gate_spin[0]),
        enqueue_max_us=_us(agg.enqueue_ns, "max"),
        host_late_iters=int(np.count_nonzero(agg.late)) if agg.late_known[0] > 0 else None,
        intervals=fig.take(),
    )
    notes = _pattern_notes(result, pattern.num_iters)
    return dataclasses.replace(result, notes="; ".join(filter(None, notes)))


def _warnings(
    pattern: PatternSpec, agg: WindowAggregate, wrong: np.ndarray | None, ranks_per_gpu: int | None
) -> list[str]:
    """A late CPU start is not warned about here: the run sums ``host_late_iters`` up once."""
    warnings = []
    if ranks_per_gpu is not None and ranks_per_gpu > 1:
        warnings.append(
            f"pattern {pattern.name}: {ranks_per_gpu} ranks share each GPU "
            "(NCCL_MULTI_RANK_GPU_ENABLE=1): they time-share it, so these timings describe "
            "nothing real; use this mode for correctness only"
        )
    if wrong is not None and (wrong > 0).any():
        bad = ", ".join(
            f"{pattern.blocks[b].name} ({int(wrong[b])})" for b in np.flatnonzero(wrong > 0)
        )
        warnings.append(
            f"pattern {pattern.name}: check failed: wrong elements summed over ranks: {bad}"
        )
    enqueue = agg.enqueue_ns[np.isfinite(agg.enqueue_ns)]
    late = int(np.count_nonzero(agg.late))
    if late and enqueue.size:
        more = ", ..." if late > 5 else ""
        which = ", ".join(map(str, np.flatnonzero(agg.late)[:5])) + more
        warnings.append(
            f"pattern {pattern.name}: in {late} of {agg.late.size} iterations "
            f"({which}) the host was still enqueueing when the gate opened (enqueue up to "
            f"{enqueue.max() / 1e3:.1f} µs, gate spin {agg.gate_spin[0]:.1f} µs): lanes "
            "of those iterations could start before every block was issued, so their "
            "starts and overlap are launch-bound (one or two in many iterations are host "
            "hiccups; more mean the host cannot keep up: raise warmup_iters so the gate "
            "calibrates on more iterations)"
        )
    return warnings
