"""Result records of one pattern from its aggregated window (pure: no ranks, no torch)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...blocks.base import Block
from ..config.dependencies import predecessors
from ..config.spec import PatternSpec, SuiteSpec
from ..config.summary import describe_params
from . import overlap
from .aggregate import WindowAggregate
from .dependencies import critical_path
from .records import BlockResult, PairResult, PatternOutcome, PatternResult
from .stats import LatencyStats, latency_stats, percentile_nearest_rank


@dataclass(frozen=True, kw_only=True)
class Isolated:
    """Each block run alone: mean and stdev of its latency over the iterations (µs; NaN:
    not measured)."""

    avg_us: np.ndarray
    stdev_us: np.ndarray
    count: int

    @classmethod
    def unmeasured(cls, num_blocks: int) -> Isolated:
        nan = np.full(num_blocks, np.nan)
        return cls(avg_us=nan, stdev_us=nan.copy(), count=0)


def _latency_stats_or_nan(durations_ns: np.ndarray) -> LatencyStats:
    """Statistics of the durations; all NaN when none was timed (an idle block).

    A row with some iterations missing is a bug upstream and raises (latency_stats).
    """
    if not np.isnan(durations_ns).all():
        return latency_stats(durations_ns)
    nan = math.nan
    return LatencyStats(
        count=0, avg_us=nan, min_us=nan, max_us=nan, p50_us=nan, p99_us=nan, stdev_us=nan
    )


def _p(values_ns: np.ndarray, q: float) -> float:
    finite = values_ns[np.isfinite(values_ns)]
    return percentile_nearest_rank(finite, q) / 1e3 if finite.size else math.nan


def _max_us(values_ns: np.ndarray) -> float:
    finite = values_ns[np.isfinite(values_ns)]
    return float(finite.max()) / 1e3 if finite.size else math.nan


def _mean_us(values_ns: np.ndarray) -> float:
    finite = values_ns[np.isfinite(values_ns)]
    return float(finite.mean()) / 1e3 if finite.size else math.nan


def _slowdown_note(slowdown: float, noise: float) -> str:
    """A note for a block that ran faster overlapped than alone by more than noise."""
    if not (math.isfinite(slowdown) and math.isfinite(noise)) or slowdown >= 1.0 - noise:
        return ""
    return (
        f"slowdown {slowdown:.3f} < 1 beyond noise (±{noise:.3f}): faster overlapped than "
        "alone; the isolated run was slower (clocks, caches, a busier machine) or the block "
        "gained from the overlap"
    )


def _efficiency_note(efficiency: float, noise: float) -> str:
    """A note for an overlap efficiency outside [0, 1] by more than noise."""
    if not (math.isfinite(efficiency) and math.isfinite(noise)):
        return ""
    if efficiency < -noise:
        return (
            f"overlap efficiency {efficiency:.3f} < 0 beyond noise (±{noise:.3f}): the blocks "
            "took longer together than one after another (they slow each other down more "
            "than overlap saves)"
        )
    if efficiency > 1.0 + noise:
        return (
            f"overlap efficiency {efficiency:.3f} > 1 beyond noise (±{noise:.3f}): the pattern "
            "finished sooner than its ideal, its critical path alone (blocks ran faster "
            "together than alone, or the isolated runs were slow)"
        )
    return ""


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
    results = []
    bus_bytes_total = 0.0
    iso_se = [overlap.standard_error_us(float(sd), isolated.count) for sd in isolated.stdev_us]
    for b, spec in enumerate(pattern.blocks):
        cls = classes[b]
        stats = _latency_stats_or_nan(agg.latency_ns[b])
        seconds = stats.avg_us * 1e-6
        # The op's arithmetic is its class's: S, bus factor and FLOPs (blocks/).
        size = cls.message_size_bytes(spec.params)
        factor = cls.bus_factor(team_sizes[b]) if size is not None else None
        flops = cls.flop_count(spec.params)
        algbw = busbw = tfl = math.nan
        if size is not None and seconds > 0:
            algbw = size / seconds / 1e9
            if factor is not None:
                busbw = algbw * factor
                bus_bytes_total += size * factor
        if flops is not None and seconds > 0:
            tfl = flops / seconds / 1e12
        iso_avg = float(isolated.avg_us[b])
        slowdown = float(overlap.slowdown(stats.avg_us, iso_avg))
        noise = overlap.slowdown_noise(
            slowdown,
            stats.avg_us,
            overlap.standard_error_us(stats.stdev_us, stats.count),
            iso_avg,
            iso_se[b],
        )
        block_notes = [*notes[b]] if notes else []
        flag = _slowdown_note(slowdown, noise)
        if flag:
            block_notes.append(flag)
        last = int(agg.last_to_start_rank[b])
        results.append(
            BlockResult(
                suite=suite.name,
                pattern=pattern.name,
                block=spec.name,
                op=spec.op,
                axis=spec.axis,
                lane=spec.lane,
                team_size=team_sizes[b],
                dtype=spec.dtype,
                size_bytes=size,
                iters=pattern.num_iters,
                work=describe_params(cls, spec.params),
                latency_avg_us=stats.avg_us,
                latency_min_us=stats.min_us,
                latency_max_us=stats.max_us,
                latency_p50_us=stats.p50_us,
                latency_p99_us=stats.p99_us,
                latency_stdev_us=stats.stdev_us,
                algbw_gbps=algbw,
                busbw_gbps=busbw,
                tflops=tfl,
                isolated_latency_avg_us=iso_avg,
                isolated_latency_stdev_us=float(isolated.stdev_us[b]),
                slowdown=slowdown,
                wrong_elements=None if wrong is None else int(wrong[b]),
                start_skew_us=_mean_us(agg.start_skew_ns[b]),
                last_to_start_rank=last if last >= 0 else None,
                duration_spread_us=float(agg.duration_spread_ns[b]) / 1e3,
                activities_per_iter=float(agg.activities_per_iter[b]),
                kernel_ctas_max=(
                    int(agg.kernel_ctas_max[b]) if np.isfinite(agg.kernel_ctas_max[b]) else None
                ),
                enqueue_avg_us=float(agg.launch_avg_ns[b]) / 1e3,
                profiler=profiler,
                ranks_per_gpu=ranks_per_gpu,
                notes="; ".join(block_notes),
            )
        )
    pattern_result, warnings = _pattern_result(
        suite, pattern, agg, isolated, iso_se, bus_bytes_total, wrong, peak_memory_bytes, profiler
    )
    if ranks_per_gpu is not None and ranks_per_gpu > 1:
        pattern_result = dataclasses.replace(pattern_result, ranks_per_gpu=ranks_per_gpu)
        warnings.insert(
            0,
            f"pattern {pattern.name}: {ranks_per_gpu} ranks share each GPU "
            "(NCCL_MULTI_RANK_GPU_ENABLE=1): they time-share it, so these timings describe "
            "nothing real; use this mode for correctness only",
        )
    elif ranks_per_gpu is not None:
        pattern_result = dataclasses.replace(pattern_result, ranks_per_gpu=ranks_per_gpu)
    names = [b.name for b in pattern.blocks]
    pairs = tuple(
        PairResult(
            suite=suite.name,
            pattern=pattern.name,
            blocks=(names[i], names[j]),
            pairwise_overlap=float(agg.pairwise_overlap[i, j]),
        )
        for i, j in itertools.combinations(range(len(names)), 2)
    )
    return PatternOutcome(
        blocks=tuple(results),
        pattern=pattern_result,
        pairs=pairs,
        warnings=tuple(warnings),
        comm_compute_overlap_by_rank=tuple(float(v) for v in agg.comm_compute_overlap_by_rank),
    )


def _pattern_result(
    suite: SuiteSpec,
    pattern: PatternSpec,
    agg: WindowAggregate,
    isolated: Isolated,
    iso_se: Sequence[float],
    bus_bytes_total: float,
    wrong: np.ndarray | None,
    peak_memory_bytes: int | None,
    profiler: str,
) -> tuple[PatternResult, list[str]]:
    makespan = _latency_stats_or_nan(agg.makespan_ns)
    iso = isolated.avg_us
    complete = bool(np.isfinite(iso).all()) and iso.size > 0
    serial = float(iso.sum()) if complete else math.nan
    # Ideal: the critical path of the isolated durations over after: and lane order.
    ideal, path = critical_path(iso, predecessors(pattern.blocks))
    efficiency = float(overlap.overlap_efficiency(serial, makespan.avg_us, ideal))
    notes = []
    if complete and math.isfinite(efficiency):
        noise = overlap.efficiency_noise(
            serial,
            ideal,
            makespan.avg_us,
            math.sqrt(sum(se**2 for se in iso_se)),
            math.sqrt(sum(iso_se[b] ** 2 for b in path)),
            overlap.standard_error_us(makespan.stdev_us, makespan.count),
        )
        flag = _efficiency_note(efficiency, noise)
        if flag:
            notes.append(flag)
    warnings = []
    if wrong is not None and (wrong > 0).any():
        bad = ", ".join(
            f"{pattern.blocks[b].name} ({int(wrong[b])})" for b in np.flatnonzero(wrong > 0)
        )
        warnings.append(
            f"pattern {pattern.name}: check failed: wrong elements summed over ranks: {bad}"
        )
    enqueue = agg.enqueue_ns[np.isfinite(agg.enqueue_ns)]
    late = int(np.count_nonzero(agg.host_late))
    if late:
        which = ", ".join(map(str, np.flatnonzero(agg.host_late)[:5])) + (
            ", ..." if late > 5 else ""
        )
        if enqueue.size:
            warnings.append(
                f"pattern {pattern.name}: in {late} of {agg.host_late.size} iterations "
                f"({which}) the host was still enqueueing when the gate opened (enqueue up to "
                f"{enqueue.max() / 1e3:.1f} µs, gate spin {agg.gate_spin_us:.1f} µs): lanes "
                "of those iterations could start before every block was issued, so their "
                "starts and overlap are launch-bound (one or two in many iterations are host "
                "hiccups; more mean the host cannot keep up: raise warmup_iters so the gate "
                "calibrates on more iterations)"
            )
        else:
            warnings.append(
                f"pattern {pattern.name}: in {late} of {agg.host_late.size} iterations "
                f"({which}) a rank learned the agreed start instant after it had passed, so "
                "the ranks did not start together (a busy host; raise warmup_iters so the "
                "start margin calibrates on more iterations)"
            )
    result = PatternResult(
        suite=suite.name,
        pattern=pattern.name,
        iters=pattern.num_iters,
        num_blocks=len(pattern.blocks),
        warmup_iters=pattern.warmup_iters,
        sync=pattern.sync,
        graph=pattern.graph,
        makespan_avg_us=makespan.avg_us,
        makespan_p99_us=makespan.p99_us,
        serial_us=serial,
        ideal_us=ideal,
        overlap_efficiency=efficiency,
        shared_busbw_gbps=(
            float(overlap.shared_busbw_gbps(bus_bytes_total, makespan.avg_us * 1e-6))
            if bus_bytes_total
            else math.nan
        ),
        comm_compute_overlap=agg.comm_compute_overlap,
        lane_skew_p50_us=_p(agg.lane_skew_ns, 50),
        lane_skew_p99_us=_p(agg.lane_skew_ns, 99),
        lane_skew_max_us=_max_us(agg.lane_skew_ns),
        gate_skew_p50_us=_p(agg.gate_skew_ns, 50),
        gate_skew_max_us=_max_us(agg.gate_skew_ns),
        gate_delay_max_us=_max_us(agg.gate_delay_ns),
        gate_spin_us=agg.gate_spin_us,
        enqueue_max_us=float(enqueue.max()) / 1e3 if enqueue.size else math.nan,
        host_late_iters=late if agg.host_late_known else None,
        peak_memory_bytes=peak_memory_bytes,
        profiler=profiler,
        notes="; ".join(notes),
    )
    return result, warnings
