"""Latency statistics over measured iterations and latency formatting for tables.

Pure numpy functions: they copy what they need and never modify their inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "LATENCY_UNIT_SCALE_US",
    "LatencyStats",
    "choose_latency_unit",
    "format_in_unit",
    "format_latency",
    "latency_stats",
    "percentile_nearest_rank",
]

# Microseconds per unit. Units are spelled in ASCII so tables and CSV stay plain text.
LATENCY_UNIT_SCALE_US: Final[dict[str, float]] = {"us": 1.0, "ms": 1e3, "s": 1e6}


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


def choose_latency_unit(values_us: ArrayLike) -> str:
    """Pick one display unit for a column of latencies given in microseconds.

    Based on the smallest positive finite value: "s" if it is >= 1e6 us, "ms" if >= 1e3 us,
    else "us" (also when there is no positive finite value), so no entry prints below 1 unit.
    """
    arr = np.asarray(values_us, dtype=np.float64).ravel()
    positive = arr[np.isfinite(arr) & (arr > 0)]
    if positive.size == 0:
        return "us"
    smallest = float(positive.min())
    if smallest >= LATENCY_UNIT_SCALE_US["s"]:
        return "s"
    if smallest >= LATENCY_UNIT_SCALE_US["ms"]:
        return "ms"
    return "us"


def format_in_unit(value_us: float, unit: str, precision: int = 2) -> str:
    """Format a latency given in microseconds in `unit` ("us", "ms" or "s").

    Fixed-point with `precision` decimals, except that a non-zero value never prints as zero:
    when rounding to `precision` decimals would give 0 (e.g. 0.0004 ms at precision 2), it is
    printed with the fewest decimals that make it non-zero, i.e. one significant digit
    ("0.0004"; 0.00096 gives "0.001"). Exact zero prints as zero; NaN prints "n/a"; infinities
    print "inf"/"-inf". Never scientific notation.
    """
    if unit not in LATENCY_UNIT_SCALE_US:
        raise ValueError(f"unknown latency unit {unit!r}; valid: {sorted(LATENCY_UNIT_SCALE_US)}")
    if isinstance(precision, bool) or not isinstance(precision, int) or precision < 0:
        raise ValueError(f"precision must be a non-negative int, got {precision!r}")
    value_us = float(value_us)
    if math.isnan(value_us):
        return "n/a"
    if math.isinf(value_us):
        return "inf" if value_us > 0 else "-inf"
    value = value_us / LATENCY_UNIT_SCALE_US[unit]
    text = f"{value:.{precision}f}"
    if value == 0.0 or float(text) != 0.0:
        return text
    # Fewest decimals that print non-zero: start one short of the first significant digit's
    # place (0.00096 rounds to 0.001) and step up (log10 may also be off by one near powers
    # of ten); this takes at most a few steps.
    decimals = max(precision + 1, -math.floor(math.log10(abs(value))) - 1)
    text = f"{value:.{decimals}f}"
    while float(text) == 0.0:
        decimals += 1
        text = f"{value:.{decimals}f}"
    return text


def format_latency(latency_us: float, precision: int = 2) -> tuple[str, str]:
    """Format one latency in its own best unit; returns (text, unit).

    For a table column, call `choose_latency_unit` once and `format_in_unit` per cell instead.
    """
    unit = choose_latency_unit([latency_us])
    return format_in_unit(latency_us, unit, precision), unit
