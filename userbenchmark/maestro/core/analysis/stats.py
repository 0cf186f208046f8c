"""Latency statistics over measured iterations.

Pure numpy functions: they copy what they need and never modify their inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "LatencyStats",
    "latency_stats",
    "percentile_nearest_rank",
]


@dataclass(frozen=True, kw_only=True)
class LatencyStats:
    """Summary of one block's latency over the measured iterations, in microseconds."""

    count: int
    """Number of measured iterations."""
    avg_us: float
    """Arithmetic mean."""
    min_us: float
    """Smallest latency."""
    max_us: float
    """Largest latency."""
    p50_us: float
    """Median, nearest-rank definition (an observed value, never interpolated)."""
    p99_us: float
    """99th percentile, nearest-rank definition."""
    stdev_us: float
    """Population standard deviation (ddof=0)."""


def _as_1d_finite(values: ArrayLike, what: str) -> np.ndarray:
    """Return `values` as a new 1-D float64 array; reject empty, non-1-D and non-finite input."""
    arr = np.array(values, dtype=np.float64, copy=True)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{what} is empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains NaN or infinite values")
    return arr


def _nearest_rank_index(q: float, n: int) -> int:
    """0-based index of the nearest-rank q-th percentile among n sorted values."""
    q = float(q)
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    # Decimal keeps q*n/100 exact for the q a user writes (7 * 100 / 100 is 7, whereas binary
    # 0.07 * 100 is 7.000000000000001 and would push ceil() one rank too high).
    rank = math.ceil(Decimal(repr(q)) * n / 100)
    return min(max(rank, 1), n) - 1


def percentile_nearest_rank(values: ArrayLike, q: float) -> float:
    """Nearest-rank percentile: the ceil(q/100 * N)-th smallest value (rank at least 1).

    `q` is in [0, 100]. The input is not sorted in place. Empty or non-finite input raises.
    """
    arr = _as_1d_finite(values, "values")
    k = _nearest_rank_index(q, arr.size)
    # np.partition returns a new array; the caller's data keeps its order.
    return float(np.partition(arr, k)[k])


def latency_stats(durations_ns: ArrayLike) -> LatencyStats:
    """Statistics of per-iteration durations given in nanoseconds, reported in microseconds.

    Raises ValueError for empty input, negative durations, NaN or infinity.
    """
    arr_us = _as_1d_finite(durations_ns, "durations_ns")
    if np.any(arr_us < 0):
        raise ValueError(f"durations_ns contains negative values (min {arr_us.min()} ns)")
    arr_us /= 1e3  # our own copy
    n = arr_us.size
    k50 = _nearest_rank_index(50.0, n)
    k99 = _nearest_rank_index(99.0, n)
    part = np.partition(arr_us, [k50, k99])
    return LatencyStats(
        count=n,
        avg_us=float(np.mean(arr_us)),
        min_us=float(np.min(arr_us)),
        max_us=float(np.max(arr_us)),
        p50_us=float(part[k50]),
        p99_us=float(part[k99]),
        stdev_us=float(np.std(arr_us, ddof=0)),
    )
