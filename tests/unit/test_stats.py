"""Unit tests for latency statistics and latency formatting."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from userbenchmark.maestro.core.analysis.stats import (
    LatencyStats,
    latency_stats,
    percentile_nearest_rank,
)
from userbenchmark.maestro.core.output.table import (
    choose_latency_unit,
    format_in_unit,
)

# --- percentile_nearest_rank -------------------------------------------------------------------


def test_p99_of_100_values_is_99th_smallest():
    values = np.random.default_rng(0).permutation(np.arange(1, 101))
    assert percentile_nearest_rank(values, 99) == 99.0


def test_p50_of_100_values_is_50th_smallest():
    # ceil(0.5 * 100) = 50, not an interpolated 50.5
    assert percentile_nearest_rank(list(range(1, 101)), 50) == 50.0


@pytest.mark.parametrize(("q", "expected"), [(0, 42.0), (1, 42.0), (50, 42.0), (100, 42.0)])
def test_single_value(q, expected):
    assert percentile_nearest_rank([42], q) == expected


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0, 10.0),  # rank clamped to 1
        (33, 10.0),  # ceil(0.99) = 1
        (34, 20.0),  # ceil(1.02) = 2
        (50, 20.0),  # ceil(1.5) = 2
        (66, 20.0),  # ceil(1.98) = 2
        (67, 30.0),  # ceil(2.01) = 3
        (99, 30.0),
        (100, 30.0),
    ],
)
def test_three_values(q, expected):
    assert percentile_nearest_rank([30, 10, 20], q) == expected


@pytest.mark.parametrize("q", [7, 14, 28, 29, 57, 58])
def test_exact_ranks_do_not_round_up(q):
    # In binary floating point q/100*100 can be just above the integer q (0.07*100 is
    # 7.000000000000001); nearest rank must still be exactly q.
    assert percentile_nearest_rank(np.arange(1, 101), q) == float(q)


def test_fractional_q():
    # ceil(99.9/100 * 1000) = 999
    assert percentile_nearest_rank(np.arange(1, 1001), 99.9) == 999.0


def test_percentile_does_not_sort_input():
    values = np.array([5, 3, 9, 1, 7])
    original = values.copy()
    as_list = [5, 3, 9, 1, 7]
    percentile_nearest_rank(values, 50)
    percentile_nearest_rank(as_list, 50)
    np.testing.assert_array_equal(values, original)
    assert as_list == [5, 3, 9, 1, 7]


@pytest.mark.parametrize("bad", [[], np.array([])])
def test_percentile_empty_raises(bad):
    with pytest.raises(ValueError, match="empty"):
        percentile_nearest_rank(bad, 50)


@pytest.mark.parametrize("q", [-1, 100.5, float("nan")])
def test_percentile_q_out_of_range(q):
    with pytest.raises(ValueError, match="percentile"):
        percentile_nearest_rank([1, 2, 3], q)


def test_percentile_nan_value_raises():
    with pytest.raises(ValueError, match="NaN"):
        percentile_nearest_rank([1.0, float("nan")], 50)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=60),
    q=st.integers(min_value=0, max_value=100),
)
def test_percentile_matches_sorted_definition(values, q):
    n = len(values)
    rank = max(1, -(-q * n // 100))  # exact integer ceil(q*n/100)
    assert percentile_nearest_rank(values, q) == float(sorted(values)[rank - 1])


# --- latency_stats ------------------------------------------------------------------------------


def test_latency_stats_hand_computed():
    stats = latency_stats([1000, 2000, 3000, 6000])  # ns
    assert stats == LatencyStats(
        count=4,
        avg_us=3.0,
        min_us=1.0,
        max_us=6.0,
        p50_us=2.0,  # ceil(0.5*4) = 2nd smallest
        p99_us=6.0,
        stdev_us=math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + 0 + (6 - 3) ** 2) / 4),  # ddof=0
    )


def test_latency_stats_single_value():
    stats = latency_stats([2500])
    assert stats.count == 1
    assert stats.avg_us == stats.min_us == stats.max_us == stats.p50_us == stats.p99_us == 2.5
    assert stats.stdev_us == 0.0


def test_latency_stats_p99_of_100():
    durations = np.random.default_rng(1).permutation(np.arange(1, 101) * 1000)
    stats = latency_stats(durations)
    assert stats.p99_us == 99.0
    assert stats.p50_us == 50.0
    assert stats.max_us == 100.0


def test_latency_stats_matches_numpy_on_random_data():
    durations = np.random.default_rng(2).integers(1, 10**7, size=1001)
    stats = latency_stats(durations)
    us = durations / 1e3
    ordered = np.sort(us)
    assert stats.avg_us == pytest.approx(us.mean(), rel=1e-12)
    assert stats.stdev_us == pytest.approx(us.std(), rel=1e-9)
    assert stats.p50_us == ordered[math.ceil(0.5 * 1001) - 1]
    assert stats.p99_us == ordered[math.ceil(0.99 * 1001) - 1]
    assert stats.min_us == ordered[0]
    assert stats.max_us == ordered[-1]


def test_latency_stats_does_not_mutate():
    durations = np.array([3000, 1000, 2000], dtype=np.int64)
    original = durations.copy()
    floats = np.array([3000.0, 1000.0, 2000.0])
    floats_original = floats.copy()
    latency_stats(durations)
    latency_stats(floats)
    np.testing.assert_array_equal(durations, original)
    np.testing.assert_array_equal(floats, floats_original)


def test_latency_stats_large_int64_timestamps_scale():
    # Durations are differences of ns timestamps; large ones must not lose the unit conversion.
    stats = latency_stats(np.array([10**12], dtype=np.int64))
    assert stats.avg_us == 1e9


def test_latency_stats_rejects_empty_and_negative():
    with pytest.raises(ValueError, match="empty"):
        latency_stats([])
    with pytest.raises(ValueError, match="negative"):
        latency_stats([1000, -1])


def test_latency_stats_rejects_2d():
    with pytest.raises(ValueError, match="1-D"):
        latency_stats([[1, 2], [3, 4]])


def test_latency_stats_is_frozen_and_keyword_only():
    stats = latency_stats([1000])
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.avg_us = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        LatencyStats(1, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0)  # type: ignore[misc]


# --- unit choice and formatting -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "unit"),
    [
        ([5.0, 2000.0], "us"),  # smallest decides
        ([999.999, 5e6], "us"),
        ([1000.0, 5e6], "ms"),
        ([2500.0], "ms"),
        ([999_999.0], "ms"),
        ([1e6, 3e7], "s"),
        ([0.0, 2500.0], "ms"),  # zero is not positive
        ([float("nan"), 2e6], "s"),  # NaN ignored
        ([float("nan")], "us"),
        ([], "us"),
        ([0.0], "us"),
    ],
)
def test_choose_latency_unit(values, unit):
    assert choose_latency_unit(values) == unit


def test_choose_latency_unit_does_not_mutate():
    values = np.array([3000.0, np.nan, 1500.0])
    original = values.copy()
    choose_latency_unit(values)
    np.testing.assert_array_equal(values, original)


@pytest.mark.parametrize(
    ("value_us", "unit", "precision", "expected"),
    [
        (1234.5678, "us", 2, "1234.57"),
        (1234.5678, "ms", 2, "1.23"),
        (1234.5678, "ms", 3, "1.235"),
        (2.5e6, "s", 1, "2.5"),
        (0.4, "ms", 2, "0.0004"),  # would print 0.00
        (0.4, "ms", 4, "0.0004"),  # already visible at the requested precision
        (0.04, "us", 1, "0.04"),
        (0.4, "us", 0, "0.4"),
        (0.6, "us", 0, "1"),  # rounds to a non-zero value: plain rounding
        (0.00096, "us", 2, "0.001"),  # first significant digit after rounding
        (49.0, "ms", 1, "0.05"),  # the seed's "anything under 50 us prints 0.0" case
        (0.0, "us", 2, "0.00"),  # a true zero may print as zero
        (float("nan"), "ms", 2, "n/a"),
        (float("inf"), "ms", 2, "inf"),
    ],
)
def test_format_in_unit(value_us, unit, precision, expected):
    assert format_in_unit(value_us, unit, precision) == expected


def test_format_in_unit_default_precision_is_two():
    assert format_in_unit(1.23456, "us") == "1.23"


@pytest.mark.parametrize("precision", [0, 1, 2, 3])
@pytest.mark.parametrize("unit", ["us", "ms", "s"])
def test_format_never_prints_zero_for_positive(precision, unit):
    for value_us in np.logspace(-4, 7, 67):
        text = format_in_unit(float(value_us), unit, precision)
        assert float(text) > 0, (value_us, unit, precision, text)
        # Relative error of a non-zero print is bounded: the first significant digit is right
        # when the fallback kicks in, and plain rounding is within half a unit of precision.
        scaled = value_us / {"us": 1.0, "ms": 1e3, "s": 1e6}[unit]
        assert abs(float(text) - scaled) <= max(0.5 * 10**-precision, 0.5 * scaled) + 1e-12


@settings(max_examples=300, deadline=None)
@given(
    value=st.floats(min_value=1e-12, max_value=1e9, allow_nan=False),
    unit=st.sampled_from(["us", "ms", "s"]),
    precision=st.integers(min_value=0, max_value=4),
)
def test_format_positive_is_positive_property(value, unit, precision):
    text = format_in_unit(value, unit, precision)
    assert float(text) > 0
    assert "e" not in text.lower()  # fixed-point, never scientific


def test_column_formatting_uses_one_unit():
    column = [1500.0, 2_000_000.0, 3.0e7]
    unit = choose_latency_unit(column)
    assert unit == "ms"
    assert [format_in_unit(v, unit, 1) for v in column] == ["1.5", "2000.0", "30000.0"]
