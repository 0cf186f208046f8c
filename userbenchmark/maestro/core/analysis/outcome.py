"""Result records of one pattern from its aggregated window (pure: no ranks, no torch)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...blocks.base import Block
from ..config.spec import PatternSpec, SuiteSpec
from . import overlap
from .aggregate import WindowAggregate
from .records import BlockResult, PatternOutcome, PatternResult
from .stats import LatencyStats, latency_stats, percentile_nearest_rank


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


def build_outcome(
    suite: SuiteSpec,
    pattern: PatternSpec,
    classes: Sequence[type[Block]],
    agg: WindowAggregate,
    isolated_us: np.ndarray,
    wrong: np.ndarray | None,
    peak_memory_bytes: int | None,
    *,
    profiler: str,
    team_sizes: Sequence[int],
    notes: Sequence[Sequence[str]] | None = None,
) -> PatternOutcome:
    """Turn an aggregated window into result records (pure: unit-testable without ranks)."""
    results = []
    bus_bytes_total = 0.0
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
        skew = agg.rank_avg_max_ns[b] - agg.rank_avg_min_ns[b]
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
                latency_avg_us=stats.avg_us,
                latency_min_us=stats.min_us,
                latency_max_us=stats.max_us,
                latency_p50_us=stats.p50_us,
                latency_p99_us=stats.p99_us,
                latency_stdev_us=stats.stdev_us,
                algbw_gbps=algbw,
                busbw_gbps=busbw,
                tflops=tfl,
                isolated_latency_avg_us=float(isolated_us[b]),
                slowdown=float(overlap.slowdown(stats.avg_us, float(isolated_us[b]))),
                wrong_elements=None if wrong is None else int(wrong[b]),
                rank_skew_us=float(skew) / 1e3,
                slowest_rank=int(agg.slowest_rank[b]) if agg.slowest_rank[b] >= 0 else None,
                activities_per_iter=float(agg.activities_per_iter[b]),
                enqueue_avg_us=float(agg.launch_avg_ns[b]) / 1e3,
                profiler=profiler,
                notes="; ".join(notes[b]) if notes else "",
            )
        )
    makespan = _latency_stats_or_nan(agg.makespan_ns)
    finite_iso = isolated_us[np.isfinite(isolated_us)]
    serial = float(finite_iso.sum()) if finite_iso.size == len(isolated_us) else math.nan
    ideal = float(finite_iso.max()) if finite_iso.size == len(isolated_us) else math.nan
    skew = agg.lane_skew_ns[np.isfinite(agg.lane_skew_ns)]
    gate = agg.gate_delay_ns[np.isfinite(agg.gate_delay_ns)]
    pairs = {}
    for i in range(len(pattern.blocks)):
        for j in range(i + 1, len(pattern.blocks)):
            pairs[f"{pattern.blocks[i].name}|{pattern.blocks[j].name}"] = float(
                agg.pairwise_overlap[i, j]
            )
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
        warnings.append(
            f"pattern {pattern.name}: in {late} of {agg.host_late.size} iterations "
            f"({which}) the host was still enqueueing when the gate opened (enqueue up to "
            f"{enqueue.max() / 1e3:.1f} µs, gate spin {agg.gate_spin_us:.1f} µs): lanes "
            "of those iterations could start before every block was issued, so their "
            "starts and overlap are launch-bound (one or two in many iterations are host "
            "hiccups; more mean the host cannot keep up: raise warmup_iters so the gate "
            "calibrates on more iterations)"
        )
    pattern_result = PatternResult(
        suite=suite.name,
        pattern=pattern.name,
        iters=pattern.num_iters,
        num_blocks=len(pattern.blocks),
        makespan_avg_us=makespan.avg_us,
        makespan_p99_us=makespan.p99_us,
        serial_us=serial,
        ideal_us=ideal,
        overlap_efficiency=float(overlap.overlap_efficiency(serial, makespan.avg_us, ideal)),
        shared_busbw_gbps=(
            float(overlap.shared_busbw_gbps(bus_bytes_total, makespan.avg_us * 1e-6))
            if bus_bytes_total
            else math.nan
        ),
        comm_compute_overlap=agg.comm_compute_overlap,
        lane_skew_p50_us=percentile_nearest_rank(skew, 50) / 1e3 if skew.size else math.nan,
        lane_skew_p99_us=percentile_nearest_rank(skew, 99) / 1e3 if skew.size else math.nan,
        lane_skew_max_us=float(skew.max()) / 1e3 if skew.size else math.nan,
        gate_delay_max_us=float(gate.max()) / 1e3 if gate.size else math.nan,
        gate_spin_us=agg.gate_spin_us,
        enqueue_max_us=float(enqueue.max()) / 1e3 if enqueue.size else math.nan,
        host_late_iters=late if enqueue.size else None,
        peak_memory_bytes=peak_memory_bytes,
        profiler=profiler,
        pairwise_overlap=pairs,
    )
    return PatternOutcome(blocks=tuple(results), pattern=pattern_result, warnings=tuple(warnings))
