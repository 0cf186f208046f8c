"""The one verdict rule (core/analysis/verdict.py): symmetric on the log scale, floors past
100 % usable for falls, identical rounds within noise, a clear change beyond it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from userbenchmark.maestro.core.analysis.verdict import (
    beyond_noise,
    independent_change,
    mean_change,
    paired_change,
    percent,
    process_mean,
)


def test_a_rise_and_its_matching_fall_get_one_verdict():
    rng = np.random.default_rng(0)
    base = 100 * np.exp(rng.normal(0, 0.01, 8))
    for factor in (1.02, 1.04, 1.2, 3.0, 40.0):
        raised = base * factor * np.exp(rng.normal(0, 0.01, 8))
        rise, fall = paired_change(base, raised), paired_change(raised, base)
        assert fall.value == pytest.approx(-rise.value) and fall.low == pytest.approx(-rise.high)
        assert paired_change(base * factor, base).value == pytest.approx(-math.log(factor))
        for floor in (0.0, 0.03, 0.19, 0.5, 2.0, 39.0):
            assert beyond_noise(rise, floor) == beyond_noise(fall, floor), (factor, floor)


def test_floors_above_100_percent_work_for_falls():
    base = np.array([100.0, 101.0, 99.0, 100.5])
    fall = paired_change(base, base / 3)  # -66.7 %: a factor 3 down
    assert beyond_noise(fall, 1.5)  # floor: a factor 2.5 either way
    assert not beyond_noise(fall, 2.5)  # a factor 3.5
    assert percent(fall.value) == pytest.approx(-200 / 3)


def test_identical_rounds_are_within_noise():
    base = np.array([100.0, 103.0, 98.0, 101.0, 99.5])
    same = paired_change(base, base)
    assert same.value == 0 and same.low == 0 and same.high == 0 and same.df == 4
    assert not beyond_noise(same, 0.0)


def test_plus_20_percent_with_small_spread_is_beyond():
    rng = np.random.default_rng(1)
    base = 1000 * np.exp(rng.normal(0, 0.02, 6))
    change = paired_change(base, base * 1.2 * np.exp(rng.normal(0, 0.01, 6)))
    assert percent(change.low) > 10 and percent(change.high) < 30 and change.df == 5
    assert beyond_noise(change, 0.05)
    assert not beyond_noise(change, 0.5)  # past the interval, not past a 50 % floor


def test_a_noisy_change_is_within_noise_whatever_the_floor():
    change = paired_change([100, 200, 100, 200], [200, 100, 210, 100])
    assert change.low < 0 < change.high and not beyond_noise(change, 0.0)


def test_absolute_metrics_are_judged_on_their_difference():
    change = paired_change([0.50, 0.52, 0.51], [0.70, 0.71, 0.69], absolute=True)
    assert change.value == pytest.approx(0.19)
    assert beyond_noise(change, 0.05, absolute=True)
    assert not beyond_noise(change, 0.2, absolute=True)
    assert paired_change([-1.0, 0.0], [0.0, 1.0], absolute=True).value == 1.0


@pytest.mark.parametrize(
    ("base", "other", "absolute", "message"),
    [
        ([1.0], [1.0], False, "at least 2"),
        ([1.0, 2.0], [1.0, 2.0, 3.0], False, "same count"),
        ([1.0, 0.0], [1.0, 2.0], False, "> 0"),
        ([1.0, 2.0], [1.0, math.nan], True, "finite"),
        ([[1.0, 2.0]], [[1.0, 2.0]], False, "1-D"),
    ],
)
def test_paired_change_refuses_what_it_cannot_pair(base, other, absolute, message):
    with pytest.raises(ValueError, match=message):
        paired_change(base, other, absolute=absolute)


def test_the_interval_is_students_t_over_rounds():
    d = np.array([0.01, 0.03, 0.02])  # mean 0.02, sd 0.01, t(0.975, 2) = 4.303
    change = mean_change(d)
    assert change.value == pytest.approx(0.02)
    assert change.high - change.value == pytest.approx(4.303 * 0.01 / math.sqrt(3), rel=1e-3)


def test_independent_change_uses_welch_degrees_of_freedom():
    change = independent_change(0.1, 0.02, 4, 0.02, 4)
    assert change.df == pytest.approx(8)
    assert change.high - 0.1 == pytest.approx(2.306 * math.hypot(0.02, 0.02), rel=1e-3)


def test_process_mean_gives_the_between_process_interval_around_the_plain_mean():
    mean, (low, high, df) = process_mean([100.0, 110.0, math.nan, 105.0])
    assert mean == pytest.approx(105.0) and df == 2
    logs = np.log([100.0, 110.0, 105.0])
    assert math.log(high / mean) == pytest.approx(4.303 * logs.std(ddof=1) / math.sqrt(3), rel=1e-3)
    assert math.log(mean / low) == pytest.approx(math.log(high / mean))
    assert process_mean([3.0]) == (3.0, None)
    same = [138.75220000000002] * 2  # its log and back is another float: still held
    mean, (low, high, _) = process_mean(same)
    assert low <= mean <= high
    mean, (low, high, _) = process_mean([-1.0, 1.0], absolute=True)
    assert mean == 0.0 and low < 0 < high
